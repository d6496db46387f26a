#!/bin/bash
# capibus ladybug: configure this control plane's etcd member from the CA in $HOME.
# usage: etcd-conf.sh <hostname> <private ip> [<hostname> <private ip>]...
set -euo pipefail
sudo mkdir -p /etc/kubernetes/pki/etcd
sudo cp "$HOME"/ca.crt "$HOME"/ca.key /etc/kubernetes/pki/etcd/
CLUSTER=""
while [ "$#" -ge 2 ]; do CLUSTER="$CLUSTER${CLUSTER:+,}$1=https://$2:2380"; shift 2; done
sudo kubeadm init phase certs etcd-server
sudo kubeadm init phase certs etcd-peer
sudo kubeadm init phase certs etcd-healthcheck-client
sudo kubeadm init phase certs apiserver-etcd-client
echo "etcd initial cluster: $CLUSTER"
