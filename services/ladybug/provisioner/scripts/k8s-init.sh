#!/bin/bash
# capibus ladybug: kubeadm init on the control-plane leader (stacked etcd).
# usage: k8s-init.sh <pod cidr> <service cidr> <dns domain> <public ip> <private ip> <port> <service type>
set -euo pipefail
POD_CIDR="$1"; SERVICE_CIDR="$2"; DNS_DOMAIN="$3"; PUBLIC_IP="$4"; PRIVATE_IP="$5"; PORT="$6"
SERVICE_TYPE="$7"
ADVERTISE="$PUBLIC_IP"
[ "$SERVICE_TYPE" = "single" ] && ADVERTISE="$PRIVATE_IP"
cat <<CONFIG > /tmp/kubeadm-config.yaml
apiVersion: kubeadm.k8s.io/v1beta3
kind: InitConfiguration
localAPIEndpoint:
  advertiseAddress: $ADVERTISE
---
apiVersion: kubeadm.k8s.io/v1beta3
kind: ClusterConfiguration
controlPlaneEndpoint: $PUBLIC_IP:$PORT
networking:
  podSubnet: $POD_CIDR
  serviceSubnet: $SERVICE_CIDR
  dnsDomain: $DNS_DOMAIN
apiServer:
  certSANs: [$PUBLIC_IP, $PRIVATE_IP]
CONFIG
sudo kubeadm init --upload-certs --config /tmp/kubeadm-config.yaml
