#!/usr/bin/env bash
# Builds (or reuses) the pinned real programs the test environment runs:
# kube-apiserver, kube-controller-manager, etcd, helm and nats-server from Go
# modules, kubectl (for people using the stack) from the same module as the API
# server, and installs redis-server and openssh-server (the fake nodes' sshd,
# standins/sshnodes) from Debian. Binaries live outside the
# repository, keyed by version, so a second run only checks stamps.
#
#   CAPIBUS_TOOLS_DIR  where binaries go (default: ~/.cache/capibus/tools)
#
# Prints the bin directory on the last line of stdout.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"

tools_dir=${CAPIBUS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capibus/tools}
bin="$tools_dir/bin"
mkdir -p "$bin"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false

say() { printf '\033[1m[testenv]\033[0m %s\n' "$*" >&2; }

# A stamp records what a binary was built from; a binary is rebuilt only when
# its stamp differs (new pin, or a changed wrapper go.sum).
stamp_of() { printf '%s' "$*" | sha256sum | cut -c1-16; }
fresh() { [[ -x "$bin/$1" && -f "$bin/$1.stamp" && "$(cat "$bin/$1.stamp")" == "$2" ]]; }

# go build -v names each package as it compiles it: count them so a cold
# build (tens of minutes for kube-apiserver) shows it is alive.
progress() {
	local name=$1 n=0 start=$SECONDS line
	while IFS= read -r line; do
		case "$line" in
			\#*|*.go:*|go:*) printf '%s\n' "$line" >&2 ;;
			*) n=$((n + 1)); (( n % 100 == 0 )) && say "$name: $n packages compiled ($((SECONDS - start))s)" ;;
		esac
	done
	return 0
}

build() { # name stamp workdir package [go build flags...]
	local name=$1 stamp=$2 dir=$3 pkg=$4; shift 4
	if fresh "$name" "$stamp"; then say "$name: cached ($bin/$name)"; return; fi
	say "$name: building (a cold build takes minutes; later runs reuse it)"
	local start=$SECONDS
	( cd "$dir" && go build -v -trimpath "$@" -o "$bin/$name.tmp" "$pkg" ) 2>&1 | progress "$name"
	[[ ${PIPESTATUS[0]} -eq 0 && -x "$bin/$name.tmp" ]] || { say "$name: build FAILED"; exit 1; }
	mv "$bin/$name.tmp" "$bin/$name"
	printf '%s' "$stamp" >"$bin/$name.stamp"
	say "$name: built in $((SECONDS - start))s"
}

build_nats() {
	build nats-server "$(stamp_of nats "$NATS_VERSION" "$(cat "$here/gomod/nats/go.sum")")" "$here/gomod/nats" \
		github.com/nats-io/nats-server/v2 -ldflags "-s -w"
}

build_helm() {
	build helm "$(stamp_of helm "$HELM_VERSION" "$(cat "$here/gomod/helm/go.sum")")" "$here/gomod/helm" \
		helm.sh/helm/v4/cmd/helm -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM_VERSION"
}

build_etcd() {
	local stamp; stamp=$(stamp_of etcd "$ETCD_VERSION" "$(cat "$here/gomod/etcd/go.sum")")
	build etcd "$stamp" "$here/gomod/etcd" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
}

build_kube() {
	# /version must report the real release: helm reads it for kubeVersion checks, and
	# `kubectl version` prints it as the client version.
	local v=$K8S_VERSION minor ldf="-s -w" bd p cmd
	minor=$(cut -d. -f2 <<<"$v"); bd=$(date -u +%Y-%m-%dT%H:%M:%SZ)
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldf="$ldf -X $p.gitVersion=$v -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=$bd"
	done
	local stamp; stamp=$(stamp_of kube "$v" "$(cat "$here/gomod/kube/go.sum")")
	# kubectl is not needed by the tests, only by people using the stack, but it is built
	# always rather than on demand: after the servers, with the same tags, it reuses their
	# compiled packages and adds about 20s to a 4-minute cold build of this module (measured
	# on 2 cores), too little to be worth a second code path.
	for cmd in kube-apiserver kube-controller-manager kubectl; do
		build "$cmd" "$stamp" "$here/gomod/kube" "k8s.io/kubernetes/cmd/$cmd" \
			-tags selinux,notest,grpcnotrace -ldflags "$ldf"
	done
}

install_redis() {
	if command -v redis-server >/dev/null; then say "redis-server: present ($(command -v redis-server))"; return; fi
	say "redis-server: installing Debian's package"
	local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
	$sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >&2
	# The package starts a system instance; ours run privately per test session.
	$sudo systemctl disable --now redis-server >/dev/null 2>&1 || true
}

install_sshd() {
	# The fake SSH nodes (standins/sshnodes) are real sshd processes, one per VM address.
	if [[ -x /usr/sbin/sshd ]]; then say "sshd: present (/usr/sbin/sshd)"; return; fi
	say "sshd: installing Debian's openssh-server"
	local sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
	$sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends openssh-server >&2
	# The package may start a system sshd on port 22 of every address; ours run privately
	# per node on their own loopback address, so the system one must not hold the port.
	$sudo systemctl disable --now ssh ssh.socket >/dev/null 2>&1 || true
	$sudo service ssh stop >/dev/null 2>&1 || true
	[[ -x /usr/sbin/sshd ]] || { say "sshd: install FAILED"; exit 1; }
}

for w in ${*:-nats etcd helm kube redis sshd}; do
	case $w in
		redis) install_redis ;;
		sshd) install_sshd ;;
		nats|etcd|helm|kube) "build_$w" ;;
		*) say "unknown program: $w"; exit 2 ;;
	esac
done
echo "$bin"
