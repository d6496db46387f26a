"""metal-stack's Cluster API infrastructure provider, on the bus (``docs/metalstack.md``)."""
