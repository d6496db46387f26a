"""Fake SSH nodes for CB-Ladybug: real sshd processes whose every command is emulated.

``farm.NodeFarm`` starts one sshd per VM address; ``emulator`` answers each command as a
cloud VM being made a Kubernetes node would; ``cluster`` holds what the nodes share (the
clusters kubeadm made) and writes Nodes into the workload API server.
"""
