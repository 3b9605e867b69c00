# Every target uses the venv at .venv (created by `make setup`).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
POSTTRAIN := $(VENV)/bin/posttrain
PYTEST_ARGS ?=

.PHONY: setup k8s-bins argocd-bins test test-unit e2e-gitops demo bench cluster-up cluster-down crds lint images clean

setup:
	bash hack/setup.sh

k8s-bins:
	bash hack/build-k8s.sh

argocd-bins:
	bash hack/build-argocd.sh

# The whole suite: unit tests, integration tests on the real control plane, real S3 and real vLLM.
test: setup k8s-bins
	$(PY) -m pytest tests -m "not argocd" $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# A real Argo CD (built from the Go module proxy, cached outside the clone) syncs jobs from a git repository
# into the dev control plane; not part of `test` (its cold build alone is longer than CI's budget allows).
e2e-gitops: setup k8s-bins argocd-bins
	$(PY) -m pytest tests/e2e/test_gitops_argocd.py -m argocd -s $(PYTEST_ARGS)

demo: setup
	bash hack/demo.sh

bench: setup k8s-bins
	bash hack/bench.sh

cluster-up: setup k8s-bins
	$(PY) -m posttrain.devcluster up --dir .cluster

cluster-down:
	$(PY) -m posttrain.devcluster down --dir .cluster

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
