"""The capibus demo: one Cluster's whole life on a real local stack (``python -m demo``)."""
