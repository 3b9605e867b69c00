#!/usr/bin/env bash
# Builds what a real kubelet node needs beside the control plane (hack/build-k8s.sh builds kubelet and
# kube-proxy): containerd 2.x with its runc v2 shim and ctr (hack/node/containerd), CoreDNS
# (hack/node/coredns), crictl (hack/node/crictl), the pod sandbox's pause process (hack/node/pause),
# kube-router's network policy controller (hack/node/kube-router, `kube-router-netpol`: the NetworkPolicy
# enforcer of `make e2e-netpol`) and netcheck (hack/node/netcheck: the probe program of that test's pods), from
# the Go module proxy into bin/; and installs runc, the CNI plugins, iptables, conntrack and ipset from
# Debian packages where they are missing (needs root and apt-get).
# Like hack/build-k8s.sh, Go caches and the built binaries live in $POSTTRAIN_CACHE (default
# ~/.cache/posttrain), keyed by the pinned module files, and bin/ gets hard links (or copies).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

CONTAINERD_VERSION=$(sed -n 's|^require github.com/containerd/containerd/v2 \(v[^ ]*\)$|\1|p' hack/node/containerd/go.mod)
COREDNS_VERSION=$(sed -n 's|^require github.com/coredns/coredns \(v[^ ]*\)$|\1|p' hack/node/coredns/go.mod)
CRICTL_VERSION=$(sed -n 's|^require sigs.k8s.io/cri-tools \(v[^ ]*\)$|\1|p' hack/node/crictl/go.mod)
LINK_BIN=${POSTTRAIN_K8S_BIN:-$ROOT/bin}
CACHE=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
# One folder of binaries per wrapper module, keyed by its pinned files: changing one rebuilds only it.
bin_of() {
  echo "$CACHE/node/$1-$(cat hack/node/"$1"/go.mod hack/node/"$1"/go.sum hack/node/"$1"/*.go | sha256sum | cut -c1-12)/bin"
}
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOPATH=$CACHE/go/path
GO=${GO:-$(bash hack/go.sh)}  # a new enough Go; fetched from the Go module proxy if none is here

# Debian packages: runc (the OCI runtime containerd's shim calls), the CNI plugins (bridge, host-local,
# loopback, portmap in /usr/lib/cni), iptables (kube-proxy's iptables mode, portmap), conntrack and ipset
# (kube-router's network policy controller).
bash hack/debian-deps.sh runc:runc /usr/lib/cni/bridge:containernetworking-plugins iptables:iptables \
  conntrack:conntrack ipset:ipset

mkdir -p "$LINK_BIN"
start=$(date +%s)
built=0
# build MODULE OUT LDFLAGS PACKAGE...: `go build` in hack/node/MODULE into its cache folder unless the
# binaries are there (OUT: the one binary's name, or - for one binary per package), then link them to bin/.
build() {
  local module=$1 out=$2 ld=$3; shift 3
  local bin names=() have=1 p b t
  bin=$(bin_of "$module")
  if [ "$out" = - ]; then for p in "$@"; do names+=("$(basename "$p")"); done; else names=("$out"); fi
  for b in "${names[@]}"; do [ -x "$bin/$b" ] || have=0; done
  if [ "$have" = 0 ]; then
    echo "building $module (cold: minutes on 2 cores; cached afterwards)"
    mkdir -p "$bin"
    [ "$out" = - ] && t="$bin/" || t="$bin/$out"
    (cd "hack/node/$module" && nice -n "${NICE:-5}" "$GO" build -trimpath -tags no_btrfs -ldflags "$ld" -o "$t" "$@")
    built=1
  fi
  for b in "$bin"/*; do
    t=$LINK_BIN/$(basename "$b")
    [ "$t" -ef "$b" ] && continue
    rm -f "$t"; ln "$b" "$t" 2>/dev/null || cp -p "$b" "$t"
  done
}
v=github.com/containerd/containerd/v2/version
build containerd - "-s -w -X $v.Version=$CONTAINERD_VERSION -X $v.Revision=gomod" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr
build coredns coredns "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" .
build pause pause "-s -w" .
build netcheck netcheck "-s -w" .
# kube-router's Go is slow to build on 2 cores: the lowest priority, like the other long builds beside tests.
NICE=19 build kube-router kube-router-netpol "-s -w" .
build crictl - "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl
[ "$built" = 1 ] && echo "node binaries built in $(( $(date +%s) - start )) s"
"$LINK_BIN/containerd" --version
