"""The real control plane for integration tests: one per test session (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok with 4 nodes x 8 GPUs), and one namespace per test.

Missing binaries fail the tests that need them (they never skip): `make test` builds them first."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config
from posttrain.devcluster import DevCluster, kubectl_path

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ClusterHandle:
    kubeconfig: Path
    devcluster: DevCluster

    def api_client(self) -> client.ApiClient:
        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None
    ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [kubectl_path(), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=check,
            input=input,
            timeout=120,
        )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    workdir = tmp_path_factory.mktemp("devcluster")
    with DevCluster(workdir) as dev:
        print(f"\ncontrol plane ready in {dev.ready_seconds:.1f}s ({workdir})")
        yield ClusterHandle(dev.kubeconfig, dev)


@pytest.fixture
def namespace(cluster: ClusterHandle) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")
        api.close()
