"""The operator's /metrics on the real control plane: a `posttrain operator` subprocess with
POSTTRAIN_METRICS_PORT on loopback serves its phase counts, reconcile passes, API requests and task-app
checks for a real RLJob (docs/monitoring.md)."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from fixtures.operator_env import operator_env, wait_for
from fixtures.operator_process import rljob_manifest
from posttrain.localhost import free_port
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.cluster]


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def test_operator_metrics_on_the_control_plane(cluster: Any, namespace: str, tmp_path: Any, math_taskapp: Any) -> None:
    port = free_port()
    settings = {"POSTTRAIN_METRICS_PORT": str(port), "POSTTRAIN_METRICS_HOST": "127.0.0.1"}
    with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
        env.secret("task-key", math_taskapp.api_key)
        env.create("rljobs", rljob_manifest("watched", math_taskapp.url))
        env.wait_phase("rljobs", "watched", "Running", timeout=60)
        phase = {"kind": "rljob", "namespace": namespace, "phase": "Running"}

        def running() -> Any:
            samples = scrape(port)
            return samples if total(samples, "posttrain_operator_jobs", **phase) == 1 else None

        samples = wait_for(running, 20, "the Running RLJob in posttrain_operator_jobs")
        assert total(samples, "posttrain_operator_reconcile_total", kind="rljob", result="ok") >= 2
        assert total(samples, "posttrain_operator_reconcile_duration_seconds_count", kind="rljob") >= 2
        assert total(samples, "posttrain_operator_api_requests_total", method="PATCH") >= 1
        assert total(samples, "posttrain_operator_verifications_total", result="ok") >= 1
        assert total(samples, "posttrain_operator_jobs", phase="Pending") == 0
