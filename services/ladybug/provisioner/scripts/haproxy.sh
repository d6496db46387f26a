sudo apt-get install -y -q haproxy && cat <<CONFIG | sudo tee /etc/haproxy/haproxy.cfg >/dev/null && sudo systemctl restart haproxy
global
  log /dev/log local0
  daemon
defaults
  mode tcp
  timeout connect 10s
  timeout client 1m
  timeout server 1m
frontend kube-apiserver
  bind *:9998
  default_backend kube-apiservers
backend kube-apiservers
  balance roundrobin
{{SERVERS}}
CONFIG
