"""The operator stays live and alone, on the real control plane: an API connection dropped silently (a TCP
proxy that stops forwarding without closing, tests/fixtures/tcp_proxy.py) is noticed within the operator's
idle timeout and replaced, and of two operator processes only the one holding the Lease acts; the other
takes over when the holder dies."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fixtures.operator_env import FAST_ENV, operator_env, wait_for
from fixtures.operator_process import OperatorProcess, kubeconfig_of, rljob_manifest
from fixtures.tcp_proxy import tcp_proxy
from kubernetes import client

pytestmark = [pytest.mark.cluster]


def proxied_kubeconfig(cluster: Any, port: int, path: Path) -> str:
    """The cluster's kubeconfig with the API server reached through 127.0.0.1:`port`."""
    config = yaml.safe_load(Path(kubeconfig_of(cluster)).read_text())
    for entry in config["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return str(path)


def test_a_silently_dropped_api_connection_is_noticed_and_the_operator_recovers(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    server = urlsplit(cluster.devcluster.server)
    with tcp_proxy(server.hostname or "127.0.0.1", server.port or 443) as proxy:
        kubeconfig = proxied_kubeconfig(cluster, proxy.port, tmp_path / "proxied.kubeconfig")
        settings = {"POSTTRAIN_WATCH_IDLE_SECONDS": "4", "POSTTRAIN_API_TIMEOUT_SECONDS": "4"}
        with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings,
                          kubeconfig=kubeconfig) as env:  # fmt: skip
            env.secret("task-key", math_taskapp.api_key)
            env.create("rljobs", rljob_manifest("before", math_taskapp.url))
            env.wait_phase("rljobs", "before", "Running", timeout=60)
            made = proxy.connections
            assert proxy.freeze() >= 2  # every watch and pooled connection of the operator goes silent
            frozen_at = time.monotonic()
            env.create("rljobs", rljob_manifest("after", math_taskapp.url))
            env.wait_phase("rljobs", "after", "Running", timeout=45)
            assert proxy.connections > made  # on new connections
            assert time.monotonic() - frozen_at < 45
            assert env.operator.proc is not None and env.operator.proc.poll() is None


def test_of_two_operator_processes_only_the_lease_holder_acts(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    lease = f"posttrain-{uuid.uuid4().hex[:8]}"
    settings = {"POSTTRAIN_LEADER_ELECTION": "true", "POSTTRAIN_LEASE_NAMESPACE": namespace,
                "POSTTRAIN_LEASE_NAME": lease, "POSTTRAIN_LEASE_SECONDS": "4"}  # fmt: skip
    with operator_env(cluster, namespace, tmp_path / "first.log", settings=settings) as env:
        wait_for(lambda: "holding Lease" in env.operator.log_tail(), 20, "the first operator holds the Lease")
        second = OperatorProcess(kubeconfig_of(cluster), tmp_path / "second.log", namespace=namespace,
                                 env={**FAST_ENV, **settings})  # fmt: skip
        try:
            second.start()  # live (its liveness endpoint answers) while it stands by
            wait_for(lambda: "standing by" in second.log_tail(), 20, "the second operator standing by")
            env.secret("task-key", math_taskapp.api_key)
            env.create("rljobs", rljob_manifest("one", math_taskapp.url))
            env.wait_phase("rljobs", "one", "Running", timeout=60)
            assert "posttrain operator:" not in second.log_tail(200_000)  # it never started acting
            coordination = client.CoordinationV1Api(env.api)
            holder = coordination.read_namespaced_lease(lease, namespace).spec.holder_identity
            assert holder and holder in env.operator.log_tail(200_000)
            env.operator.kill()  # the holder dies without handing over
            wait_for(lambda: "holding Lease" in second.log_tail(), 30, "the second operator takes over")
            env.create("rljobs", rljob_manifest("two", math_taskapp.url))
            env.wait_phase("rljobs", "two", "Running", timeout=60)
            assert "posttrain operator:" in second.log_tail(200_000)
        finally:
            second.stop()  # hands the Lease over: the fixture's operator cleans up
