#!/bin/bash
# capibus ladybug: on the leader, an etcd CA and the certificates every member and the API
# server need, left in /tmp/ca for distribution to the other control planes.
# usage: etcd-ca.sh <control-plane private ip>...
set -euo pipefail
sudo kubeadm init phase certs etcd-ca
mkdir -p /tmp/ca
sudo cp /etc/kubernetes/pki/etcd/ca.crt /etc/kubernetes/pki/etcd/ca.key /tmp/ca/
sudo chown -R "$(id -u)" /tmp/ca
echo "etcd CA for $*"
