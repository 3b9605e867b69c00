# Every target uses the venv at .venv (created by `make setup`).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
POSTTRAIN := $(VENV)/bin/posttrain
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: setup k8s-bins test test-unit demo bench bench-demo cluster-up cluster-down crds lint images clean

setup:
	bash hack/setup.sh

k8s-bins:
	bash hack/build-k8s.sh

# The whole suite: unit tests, integration tests on the real control plane, real S3 and real vLLM.
test: setup k8s-bins
	$(PY) -m pytest tests $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# DEMO_ARGS: options of `python -m posttrain.local.demo` (--help), e.g. DEMO_ARGS=--sft-warmup
demo: setup
	bash hack/demo.sh $(DEMO_ARGS)

bench: setup k8s-bins
	bash hack/bench.sh

# make demo's learning curve beside a minimal hand-written GSPO loop, one run on this machine (also in `make bench`)
bench-demo: setup
	$(PY) hack/bench_demo_curve.py

cluster-up: setup k8s-bins
	$(PY) -m posttrain.dev.devcluster up --dir .cluster

cluster-down:
	$(PY) -m posttrain.dev.devcluster down --dir .cluster

crds: setup
	$(POSTTRAIN) crds -o crds
	$(PY) manifests/sync_crds.py  # kustomize's copies in manifests/base/crds

lint: setup
	$(VENV)/bin/ruff check operator trainer_image rollout_image examples tests hack

images:
	docker build -t posttrain/operator:dev -f Dockerfile .
	docker build -t posttrain/trainer:dev -f trainer_image/Dockerfile .
	docker build -t posttrain/rollout:dev -f rollout_image/Dockerfile .
	docker build -t posttrain/taskapp-math:dev -f examples/taskapps/math/Dockerfile .

clean:
	rm -rf .cluster .runs .pytest_cache .ruff_cache
