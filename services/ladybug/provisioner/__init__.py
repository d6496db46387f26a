"""The CB-Ladybug provisioner: converges each LadybugCluster over Tumblebug and SSH
(``docs/ladybug.md``)."""
