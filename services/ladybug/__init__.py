"""CB-Ladybug on capibus (``docs/ladybug.md``): the REST API (``api``) and the provisioner."""
