# Every target uses the venv at .venv (created by `make setup`).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
POSTTRAIN := $(VENV)/bin/posttrain
PYTEST_ARGS ?=
DEMO_ARGS ?=

.PHONY: setup k8s-bins kueue-bins synth-crafter node-bins argocd-bins gitops-deps test test-unit docs docs-gen demo bench bench-demo cluster-up cluster-down crds lint images e2e e2e-gitops clean

setup:
	bash hack/setup.sh

k8s-bins:
	bash hack/build-k8s.sh

# Kueue's manager and CRDs from the Go module proxy (cached outside the clone); `make cluster-up KUEUE=1` runs it.
kueue-bins:
	bash hack/build-kueue.sh

# synth's own Crafter task app needs synth-ai 0.2.19 + crafter from PyPI: a venv of their own, cached outside
# the clone (tests/e2e/test_synth_crafter.py runs the app unchanged from the wheel).
synth-crafter:
	bash hack/synth-crafter.sh >/dev/null

# containerd 2.x, CoreDNS, crictl and the pause process from Go modules; runc and the CNI plugins from Debian.
node-bins:
	bash hack/build-node.sh

argocd-bins:
	bash hack/build-argocd.sh

# What the real Argo CD e2e runs beside Argo CD: redis (its cache) and git (`git daemon` serves the jobs' repo).
gitops-deps:
	bash hack/debian-deps.sh redis-server:redis-server git:git

# The whole suite: unit tests, integration tests on the real control plane, real S3 and real vLLM.
test: setup k8s-bins kueue-bins synth-crafter
	$(PY) -m pytest tests -m "not argocd" $(PYTEST_ARGS)

test-unit: setup
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The user's guide (mkdocs.yml) into site/; docs-gen rewrites docs/reference/ from the code (a unit test
# fails when it is stale, and builds the site with --strict).
docs: setup
	$(PY) -m mkdocs build --strict

docs-gen: setup
	$(PY) hack/gen_docs.py

# A real Argo CD (built from the Go module proxy, cached outside the clone) syncs jobs from a git repository
# into the dev control plane; not part of `test` (its cold build alone is longer than CI's budget allows).
e2e-gitops: setup k8s-bins argocd-bins gitops-deps
	$(PY) -m pytest tests/e2e/test_gitops_argocd.py -m argocd -s $(PYTEST_ARGS)

# DEMO_ARGS: options of `python -m posttrain.local.demo` (--help), e.g. DEMO_ARGS=--sft-warmup
demo: setup
	bash hack/demo.sh $(DEMO_ARGS)

bench: setup k8s-bins
	bash hack/bench.sh

# make demo's learning curve beside a minimal hand-written GSPO loop, one run on this machine (also in `make bench`)
bench-demo: setup
	$(PY) hack/bench_demo_curve.py

# REAL_NODE=1: also a real kubelet node (containerd, runc, CNI, kube-proxy, CoreDNS) beside the kwok GPU nodes.
# KUEUE=1: also Kueue (all-or-nothing admission of each job; docs/how-to/gpu-scheduling.md).
cluster-up: setup k8s-bins $(if $(REAL_NODE),node-bins) $(if $(KUEUE),kueue-bins)
	$(PY) -m posttrain.dev.devcluster up --dir .cluster $(if $(REAL_NODE),--real-node) $(if $(KUEUE),--kueue)

cluster-down:
	$(PY) -m posttrain.dev.devcluster down --dir .cluster

crds: setup
	$(POSTTRAIN) crds -o crds
	$(PY) manifests/sync_crds.py  # kustomize's copies in manifests/base/crds

lint: setup
	$(VENV)/bin/ruff check operator trainer_image rollout_image examples tests hack

# The four images (CPU variants) with buildah, no Docker engine; imported into the real node when it runs.
images:
	bash hack/build-images.sh

# The cluster path for real (docs/operations/real-node-e2e.md): needs root; outside `make test` (it takes ~30-60 min).
e2e: setup k8s-bins node-bins images
	$(PY) hack/e2e_node.py

clean:
	rm -rf site .cluster .cluster-e2e .cluster-harness.log .runs .pytest_cache .ruff_cache
