#!/bin/bash
# capibus ladybug: prepare one Ubuntu VM for kubeadm (containerd, kubelet, kubeadm, kubectl),
# pin its name and node IP, and enable the mcks-bootstrap unit that keeps the kubelet's
# --node-ip on the public address after every restart.
# usage: bootstrap.sh <k8s version, e.g. 1.23.13-00> <csp> <hostname> <public ip> <cni> <service type>
set -euo pipefail
if [ "$#" -ne 6 ]; then
  echo "usage: $0 <version> <csp> <hostname> <public-ip> <network-cni> <service-type>" >&2
  exit 2
fi
VERSION="$1"; CSP="$2"; HOSTNAME_="$3"; PUBLIC_IP="$4"; CNI="$5"; SERVICE_TYPE="$6"

sudo hostnamectl set-hostname "$HOSTNAME_"
sudo swapoff -a
sudo sed -i '/ swap / s/^/#/' /etc/fstab

cat <<MODULES | sudo tee /etc/modules-load.d/k8s.conf >/dev/null
overlay
br_netfilter
MODULES
sudo modprobe overlay
sudo modprobe br_netfilter
cat <<SYSCTL | sudo tee /etc/sysctl.d/k8s.conf >/dev/null
net.bridge.bridge-nf-call-iptables  = 1
net.bridge.bridge-nf-call-ip6tables = 1
net.ipv4.ip_forward                 = 1
SYSCTL
sudo sysctl --system >/dev/null

sudo apt-get update -q
sudo apt-get install -y -q apt-transport-https ca-certificates curl containerd
sudo mkdir -p /etc/containerd
containerd config default | sudo tee /etc/containerd/config.toml >/dev/null
sudo systemctl restart containerd

sudo curl -fsSLo /usr/share/keyrings/kubernetes-archive-keyring.gpg \
  https://packages.cloud.google.com/apt/doc/apt-key.gpg
echo "deb [signed-by=/usr/share/keyrings/kubernetes-archive-keyring.gpg] https://apt.kubernetes.io/ kubernetes-xenial main" \
  | sudo tee /etc/apt/sources.list.d/kubernetes.list >/dev/null
sudo apt-get update -q
sudo apt-get install -y -q "kubelet=$VERSION" "kubeadm=$VERSION" "kubectl=$VERSION"
sudo apt-mark hold kubelet kubeadm kubectl

# multi-cloud nodes reach each other over public IPs (kilo/canal): the kubelet advertises
# the public IP. Single-cloud nodes keep their private address, are named by their cloud
# hostname and carry the provider id the CSP's cloud controller manager looks them up by.
METADATA=http://169.254.169.254/latest/meta-data
if [ "$SERVICE_TYPE" = "multi" ]; then
  NODE_ARGS="--node-ip=$PUBLIC_IP"
else
  NODE_ARGS="--hostname-override=$HOSTNAME_"
  case "$CSP" in
    aws) NODE_ARGS="$NODE_ARGS --provider-id=aws:///$(curl -sf "$METADATA/instance-id")" ;;
    ncpvpc) NODE_ARGS="$NODE_ARGS --provider-id=ncp:///$(curl -sf "$METADATA/serverInstanceNo")" ;;
  esac
fi
cat <<UNIT | sudo tee /lib/systemd/system/mcks-bootstrap >/dev/null
#!/bin/bash
echo "KUBELET_EXTRA_ARGS=$NODE_ARGS" > /etc/default/kubelet
UNIT
sudo chmod +x /lib/systemd/system/mcks-bootstrap
cat <<UNIT | sudo tee /etc/systemd/system/mcks-bootstrap.service >/dev/null
[Unit]
Description=capibus ladybug node settings ($CSP, $CNI)
Before=kubelet.service
[Service]
Type=oneshot
ExecStart=/lib/systemd/system/mcks-bootstrap
Restart=on-failure
[Install]
WantedBy=kubelet.service
UNIT
sudo systemctl daemon-reload
sudo systemctl enable --now mcks-bootstrap
echo "kubelet, kubeadm and kubectl $VERSION installed on $HOSTNAME_"
