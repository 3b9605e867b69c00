#!/usr/bin/env bash
# Prints the path of a Go toolchain new enough for every go.mod under hack/ (its highest `go` line), so the
# build scripts work on a fresh machine: $GO, `go` on PATH or /usr/local/go/bin/go when one is new enough
# (Debian's golang is far too old), else Go $GO_VERSION from the Go module proxy: the module
# golang.org/toolchain, the same zip `go` itself downloads when it switches toolchains, kept in
# $POSTTRAIN_CACHE/go/toolchain and reused afterwards.
#   GO=$(bash hack/go.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
GO_VERSION=1.26.8  # fetched when no Go here is new enough; at least every go.mod's `go` line
CACHE=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
need=$(cat hack/*/go.mod hack/*/*/go.mod 2>/dev/null | sed -n 's/^go \([0-9.]*\)$/\1/p' | sort -V | tail -1)
need=${need:-1.21}

new_enough() {  # GOVERSION (go1.26.8) >= $need?
  local v=${1#go}
  [ -n "$v" ] && [ "$(printf '%s\n%s\n' "$need" "$v" | sort -V | head -1)" = "$need" ]
}

fetched=$CACHE/go/toolchain/go$GO_VERSION/bin/go
for go in "${GO:-}" "$(command -v go 2>/dev/null || true)" /usr/local/go/bin/go "$fetched"; do
  [ -n "$go" ] && [ -x "$go" ] || continue
  if new_enough "$(GOTOOLCHAIN=local "$go" env GOVERSION 2>/dev/null || true)"; then
    echo "$go"
    exit 0
  fi
done

if ! new_enough "go$GO_VERSION"; then
  echo "hack/go.sh: GO_VERSION $GO_VERSION is older than a go.mod's go $need: raise it" >&2
  exit 2
fi
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) echo "hack/go.sh: no Go toolchain for $(uname -m); install Go >= $need and set GO=/path/to/go" >&2; exit 2 ;;
esac
# The first proxy of GOPROXY (a mirror of proxy.golang.org where one is configured), as `go` would use it.
proxy=${GOPROXY:-https://proxy.golang.org}
proxy=${proxy%%[,|]*}
case "$proxy" in
  http://*|https://*) ;;
  *) proxy=https://proxy.golang.org ;;
esac
mod=v0.0.1-go$GO_VERSION.linux-$arch
echo "fetching Go $GO_VERSION ($proxy/golang.org/toolchain/@v/$mod.zip) into $CACHE/go/toolchain" >&2
mkdir -p "$CACHE/go/toolchain"
work=$(mktemp -d "$CACHE/go/toolchain/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 - "$proxy/golang.org/toolchain/@v/$mod.zip" "$work" <<'EOF'
import os, sys, urllib.request, zipfile
url, work = sys.argv[1], sys.argv[2]
archive = os.path.join(work, "toolchain.zip")
with urllib.request.urlopen(url, timeout=600) as response, open(archive, "wb") as out:
    while chunk := response.read(1 << 20):
        out.write(chunk)
with zipfile.ZipFile(archive) as z:
    z.extractall(work)  # golang.org/toolchain@<version>/ is a GOROOT
os.unlink(archive)
EOF
root=$work/golang.org/toolchain@$mod
# Module zips carry no file modes: the toolchain's programs get theirs back (as `go` does for itself).
chmod +x "$root"/bin/* "$root"/pkg/tool/*/*
rm -rf "$CACHE/go/toolchain/go$GO_VERSION"
mv "$root" "$CACHE/go/toolchain/go$GO_VERSION"
if ! new_enough "$(GOTOOLCHAIN=local "$fetched" env GOVERSION)"; then
  echo "hack/go.sh: the fetched toolchain does not run" >&2
  exit 1
fi
echo "$fetched"
