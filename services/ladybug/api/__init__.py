"""CB-Ladybug's REST API on capibus: a FastAPI façade over LadybugCluster resources."""
