# Every target uses the venv at .venv (created by `make setup`).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
POSTTRAIN := $(VENV)/bin/posttrain
PYTEST_ARGS ?=
DEMO_ARGS ?=
# make push / release-manifests: where the images go (host[:port]/path) and their tag
REGISTRY ?=
TAG ?= dev

.PHONY: setup k8s-bins kueue-bins node-bins argocd-bins gitops-deps test test-unit test-learning test-unproven docs docs-gen demo bench bench-demo bench-learning cluster-up cluster-down crds lint images push release-manifests registry-deps synth-crafter e2e e2e-gitops e2e-netpol clean

# Python with venv first (Debian ships ensurepip apart, in python3-venv), then .venv.
setup:
	bash hack/debian-deps.sh python3:python3 import.ensurepip:python3-venv
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
# bin/ first on PATH: the kustomize tests run `kubectl kustomize` with the kubectl k8s-bins built (a fresh
# machine has no other; they would skip).
test: setup k8s-bins kueue-bins registry-deps synth-crafter
	PATH="$(CURDIR)/bin:$$PATH" $(PY) -m pytest tests -m "not argocd and not unproven and not realnode and not learning" $(PYTEST_ARGS)

# The learning jobs of a real model (SmolLM2-135M: ReST-EM on math, GSPO on craftworld), 6-20 min each on 2
# cores: the behaviour they go through is in `make test` on the tiny model; `make bench-learning` runs them over seeds.
test-learning: setup
	$(PY) -m pytest tests -m learning -s $(PYTEST_ARGS)

# Learning tests that have not yet passed run after run (docs/known-gaps.md says which and what was measured).
test-unproven: setup
	$(PY) -m pytest tests -m unproven -s $(PYTEST_ARGS)

test-unit: setup
	PATH="$(CURDIR)/bin:$$PATH" $(PY) -m pytest tests/unit $(PYTEST_ARGS)

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

# DEMO_ARGS: options of `python -m posttrain.local.demo` (--help), e.g. DEMO_ARGS=--sft-warmup; quote several
# (DEMO_ARGS="--task agent --seed 7"): unquoted, make takes each further word for a target of its own
demo: setup
	bash hack/demo.sh $(DEMO_ARGS)

bench: setup k8s-bins
	bash hack/bench.sh

# make demo three times, seeds 0-2: the held-out accuracy's distribution, one JSON line last (also in `make bench`);
# `$(PY) hack/bench_demo_curve.py --runs 20` for 19 in 20, `--compare` beside a hand-written GSPO loop
bench-demo: setup
	$(PY) hack/bench_demo_curve.py

# the 9 learning tests, 20 seeds each from 1000 (one pytest process per test and seed): their false-failure
# rates, one JSON line last. Hours (the two e2e tests), so not in `make bench`; one test, fewer seeds:
# `$(PY) hack/bench_learning_tests.py --runs 5 --test tests/integration/test_rl_learning.py::test_gspo_lifts_mean_reward_on_toy_task`
bench-learning: setup
	$(PY) hack/bench_learning_tests.py

# REAL_NODE=1: also a real kubelet node (containerd, runc, CNI, kube-proxy, CoreDNS) beside the kwok GPU nodes.
# KUEUE=1: also Kueue (all-or-nothing admission of each job; docs/how-to/gpu-scheduling.md).
cluster-up: setup k8s-bins $(if $(REAL_NODE),node-bins) $(if $(KUEUE),kueue-bins)
	PYTHONPATH=hack $(PY) -m posttrain_dev.devcluster up --dir .cluster $(if $(REAL_NODE),--real-node) $(if $(KUEUE),--kueue)

cluster-down:
	PYTHONPATH=hack $(PY) -m posttrain_dev.devcluster down --dir .cluster

crds: setup
	$(POSTTRAIN) crds -o crds
	$(PY) manifests/sync_crds.py  # kustomize's copies in manifests/base/crds

lint: setup
	$(VENV)/bin/ruff check operator trainer_image rollout_image examples tests hack

# The four images (CPU variants) with buildah, no Docker engine; imported into the real node when it runs.
images:
	bash hack/build-images.sh

# What `make images` built, to a registry: make push REGISTRY=registry.example.com/posttrain TAG=0.2.0
# (REGISTRY/<name>:TAG; buildah login first where it needs one; docs/how-to/cluster-install.md).
push: $(if $(REGISTRY),images)
	bash hack/registry.sh push "$(REGISTRY)" "$(TAG)"

# Pins manifests/overlays/prod to REGISTRY/<name>:TAG (a release commits it): kubectl apply -k overlays/prod.
release-manifests:
	python3 hack/release_manifests.py --registry "$(REGISTRY)" --tag "$(TAG)"

# A registry on loopback (Debian's docker-registry: make e2e, tests/integration/test_registry_push.py) and buildah.
registry-deps:
	bash hack/debian-deps.sh docker-registry:docker-registry buildah:buildah

# The cluster path for real (docs/operations/real-node-e2e.md): needs root; outside `make test` (it takes ~30-60 min).
# The images go through a registry on 127.0.0.1 (hack/registry.sh), as a user's cluster pulls them.
e2e: setup k8s-bins node-bins registry-deps images
	$(PY) hack/e2e_node.py

# The namespace's network fences enforced on the real node (kube-router's network policy controller): a job or
# TaskApp pod reaches neither 169.254.169.254 nor the API server, and reaches DNS, S3 and its own task app
# (docs/operations/real-node-e2e.md). Needs root; outside `make test` (the real node takes minutes).
e2e-netpol: setup k8s-bins node-bins
	PATH="$(CURDIR)/bin:$$PATH" $(PY) -m pytest tests/e2e/test_network_fences_node.py -m realnode -s $(PYTEST_ARGS)

clean:
	rm -rf site .cluster .cluster-e2e .cluster-harness.log .runs .pytest_cache .ruff_cache
