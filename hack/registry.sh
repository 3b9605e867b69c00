#!/usr/bin/env bash
# The images `make images` built, pushed to a registry; and a throwaway registry on loopback for `make e2e`.
#   hack/registry.sh push REGISTRY [TAG]   buildah push posttrain/<name>:$POSTTRAIN_IMAGE_TAG (default dev) to
#                                          REGISTRY/<name>:TAG (TAG defaults to the built tag) for the four
#                                          images and MinIO; REGISTRY is host[:port]/path, e.g.
#                                          registry.example.com/posttrain
#   hack/registry.sh start DIR [PORT]      Debian's docker-registry on 127.0.0.1:PORT (default 5000), its
#                                          blobs in DIR/data; prints 127.0.0.1:PORT once it answers. Idempotent:
#                                          a registry already started from DIR is reused
#   hack/registry.sh stop DIR              stops the registry started from DIR (its blobs stay for the next run)
# Loopback registries (127.0.0.1, localhost, [::1]) speak plain HTTP and get uncompressed layers: nothing
# crosses a network, and gzip of the torch closure would cost minutes of CPU. Any other registry gets TLS
# (PUSH_TLS_VERIFY=false to turn that off for one of your own) and gzip; log in first (buildah login HOST).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGES=(operator taskapp-math rollout trainer)  # posttrain/<name>:TAG, built by hack/build-images.sh

usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }

is_loopback() {  # host[:port][/path]
  local host=${1%%/*}
  case "$host" in
    127.0.0.1|127.0.0.1:*|localhost|localhost:*|"[::1]"|"[::1]:"*) return 0 ;;
    *) return 1 ;;
  esac
}

push() {
  local registry=${1:-} src_tag=${POSTTRAIN_IMAGE_TAG:-dev}
  local tag=${2:-$src_tag}
  [ -n "$registry" ] || { echo "push: REGISTRY missing (make push REGISTRY=host:port/posttrain)" >&2; exit 2; }
  case "$registry" in
    */*) ;;
    *) echo "push: REGISTRY is host[:port]/path (the images go to REGISTRY/<name>:TAG), got $registry" >&2; exit 2 ;;
  esac
  [[ "$tag" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || { echo "push: TAG $tag is not an image tag" >&2; exit 2; }
  bash hack/debian-deps.sh buildah:buildah
  local flags=(--quiet)
  if is_loopback "$registry"; then
    flags+=(--tls-verify=false --disable-compression)
  else
    flags+=(--tls-verify="${PUSH_TLS_VERIFY:-true}")
  fi
  local pairs=() i src t
  for i in "${IMAGES[@]}"; do pairs+=("localhost/posttrain/$i:$src_tag=$i"); done
  pairs+=("localhost/posttrain/minio:$src_tag=minio")
  for pair in "${pairs[@]}"; do
    src=${pair%%=*}
    if ! buildah inspect --type image "$src" >/dev/null 2>&1; then
      echo "push: no image $src here: build it first (make images)" >&2
      exit 2
    fi
  done
  local start digest; start=$(date +%s)
  digest=$(mktemp)
  for pair in "${pairs[@]}"; do
    src=${pair%%=*} t=$(date +%s)
    # Blobs the registry already holds are skipped: trainer and rollout share the vLLM base's layers.
    if ! buildah push "${flags[@]}" --digestfile "$digest" "$src" "docker://$registry/${pair#*=}:$tag"; then
      rm -f "$digest"
      echo "push: buildah push $src to $registry failed (logged in? buildah login ${registry%%/*})" >&2
      exit 1
    fi
    echo "  $registry/${pair#*=}:$tag@$(cat "$digest") ($(( $(date +%s) - t )) s)"
  done
  rm -f "$digest"
  echo "pushed to $registry in $(( $(date +%s) - start )) s"
}

answers() { python3 - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(f"http://{sys.argv[1]}/v2/", timeout=2) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

start() {
  local dir=${1:-} port=${2:-5000}
  [ -n "$dir" ] || usage
  [[ "$port" =~ ^[0-9]+$ ]] || { echo "start: PORT $port is not a number" >&2; exit 2; }
  bash hack/debian-deps.sh docker-registry:docker-registry
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  local addr=127.0.0.1:$port
  if [ -f "$dir/registry.pid" ] && kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then
    if [ "$(cat "$dir/registry.addr" 2>/dev/null)" = "$addr" ] && answers "$addr"; then
      echo "$addr"
      return 0
    fi
    stop "$dir"
  fi
  # Loopback only, no auth (nothing off this host reaches it), delete on (a test may clean up after itself).
  cat > "$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog: {disabled: true}
storage:
  filesystem: {rootdirectory: $dir/data}
  delete: {enabled: true}
http:
  addr: $addr
EOF
  setsid docker-registry serve "$dir/config.yml" > "$dir/registry.log" 2>&1 < /dev/null &
  echo $! > "$dir/registry.pid"
  echo "$addr" > "$dir/registry.addr"
  local i
  for i in $(seq 1 100); do
    if answers "$addr"; then echo "$addr"; return 0; fi
    if ! kill -0 "$(cat "$dir/registry.pid")" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "start: docker-registry did not answer on $addr (log: $dir/registry.log)" >&2
  tail -5 "$dir/registry.log" >&2 || true
  stop "$dir"
  exit 1
}

stop() {
  local dir=${1:-}
  [ -n "$dir" ] || usage
  local pid
  pid=$(cat "$dir/registry.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/registry.pid" "$dir/registry.addr"
}

case "${1:-}" in
  push) shift; push "$@" ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) usage ;;
esac
