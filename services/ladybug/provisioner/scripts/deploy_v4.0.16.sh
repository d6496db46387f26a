#!/bin/bash
# capibus ladybug: the NFS subdir external provisioner (v4.0.16) and its storage class,
# pointed at <server>:<path>. Run on the control-plane leader.
# usage: deploy_v4.0.16.sh <path> <server>
set -euo pipefail
NFS_PATH="$1"; NFS_SERVER="$2"
BASE=https://raw.githubusercontent.com/kubernetes-sigs/nfs-subdir-external-provisioner/nfs-subdir-external-provisioner-4.0.16/deploy
KUBECTL="sudo kubectl --kubeconfig=/etc/kubernetes/admin.conf"
$KUBECTL apply -f "$BASE/rbac.yaml"
$KUBECTL apply -f "$BASE/class.yaml"
curl -fsSL "$BASE/deployment.yaml" \
  | sed "s#10.3.243.101#$NFS_SERVER#g; s#/ifs/kubernetes#$NFS_PATH#g" \
  | $KUBECTL apply -f -
