# syntax=docker/dockerfile:1
# posttrain operator image: `posttrain operator` (kopf) and nothing else. No torch, no vLLM: the operator
# renders manifests and talks to the API server and task apps; trainer_image/ and rollout_image/ hold the
# heavy images. Build: `make images` (or `docker build -t posttrain/operator:dev .`).
# Pin the base by digest in your registry mirror for reproducible production builds
# (python:3.11.14-slim-bookworm@sha256:...); the tag is pinned to the patch release here.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

# ---- build: a self-contained venv with the pinned runtime closure and the posttrain wheel ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/posttrain \
    && /opt/posttrain/bin/pip install pip==26.3 setuptools==78.1.1
WORKDIR /src
# Dependencies first so that a code-only change reuses this layer.
COPY operator/requirements.txt /src/operator/requirements.txt
RUN /opt/posttrain/bin/pip install --only-binary=:all: -r /src/operator/requirements.txt
COPY pyproject.toml /src/pyproject.toml
COPY operator/posttrain /src/operator/posttrain
# --no-deps: the closure above is the operator's whole dependency set (pyproject's [project].dependencies
# also lists the trainer's torch/transformers, which this image must not carry).
RUN /opt/posttrain/bin/pip install --no-deps --no-build-isolation /src \
    && /opt/posttrain/bin/posttrain --help >/dev/null

# ---- runtime: the venv on a clean base, non-root, read-only-root-filesystem friendly ----
FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="posttrain-operator" \
      org.opencontainers.image.description="kopf operator for RLJob, SFTJob and TaskApp (posttrain.dev)" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 65532 posttrain \
    && useradd --system --uid 65532 --gid 65532 --home-dir /home/posttrain --create-home \
       --shell /usr/sbin/nologin posttrain
COPY --from=build /opt/posttrain /opt/posttrain
ENV PATH=/opt/posttrain/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/home/posttrain
USER 65532:65532
WORKDIR /home/posttrain
# 8080: kopf liveness endpoint (/healthz); 9090: metrics (see manifests/base/operator-deployment.yaml).
EXPOSE 8080 9090
ENTRYPOINT ["posttrain", "operator"]
