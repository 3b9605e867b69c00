#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue) from the Go module proxy into the cache outside the
# clone ($POSTTRAIN_CACHE, default ~/.cache/posttrain), like hack/build-k8s.sh, and links it into bin/.
# Kueue's go.mod has no replace directives, so a plain `go install module@version` works. Its CRDs come from
# the same module download (config/components/crd/bases) and are copied next to the binary, so the dev
# cluster (hack/posttrain_dev/kueue.py) needs no network. A binary that exists is not rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

KUEUE_VERSION=${KUEUE_VERSION:-v0.17.0}
LINK_BIN=${POSTTRAIN_K8S_BIN:-$ROOT/bin}
CACHE=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
OUT=$CACHE/kueue/$KUEUE_VERSION
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build GOPATH=$CACHE/go/path
GO=${GO:-$(bash hack/go.sh)}  # a new enough Go; fetched from the Go module proxy if none is here

mkdir -p "$OUT/bin" "$LINK_BIN"
if [ ! -x "$OUT/bin/kueue" ]; then
  echo "building kueue $KUEUE_VERSION (cold: several minutes; cached afterwards)"
  start=$(date +%s)
  ld="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
  GOBIN=$OUT/bin nice -n 5 "$GO" install -trimpath -ldflags "$ld" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  echo "kueue built in $(( $(date +%s) - start )) s"
fi
if [ ! -d "$OUT/crd" ]; then
  src=$("$GO" mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$OUT/crd.tmp"
  cp "$src"/config/components/crd/bases/*.yaml "$OUT/crd.tmp/"
  chmod u+w "$OUT"/crd.tmp/*.yaml
  mv "$OUT/crd.tmp" "$OUT/crd"
fi
t=$LINK_BIN/kueue
if ! [ "$t" -ef "$OUT/bin/kueue" ]; then rm -f "$t"; ln "$OUT/bin/kueue" "$t" 2>/dev/null || cp -p "$OUT/bin/kueue" "$t"; fi
rm -rf "$LINK_BIN/kueue-crd"; cp -r "$OUT/crd" "$LINK_BIN/kueue-crd"
echo "kueue $KUEUE_VERSION: $t, CRDs in $LINK_BIN/kueue-crd"
