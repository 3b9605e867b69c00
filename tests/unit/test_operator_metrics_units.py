"""The operator's Prometheus metrics (controller/metrics.py): the phase counts (pure), the counters where the
work happens, and the exposition served over HTTP on loopback."""

from __future__ import annotations

import asyncio
import urllib.request
from types import SimpleNamespace

import pytest
from posttrain.controller import metrics
from posttrain.controller.settings import load_settings
from posttrain.controller.verify import Attempt
from prometheus_client.parser import text_string_to_metric_families


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


def test_phase_counts_by_kind_namespace_phase() -> None:
    bodies = {
        ("a", "rljob", "j1"): {"status": {"phase": "Running"}},
        ("a", "rljob", "j2"): {"status": {"phase": "Running"}},
        ("a", "rljob", "j3"): {},  # no status yet
        ("b", "sftjob", "s"): {"status": {"phase": "Succeeded"}},
        ("b", "rljob", "odd"): {"status": {"phase": "'; DROP TABLE"}},  # hand-written status
        ("a", "taskapp", "t1"): {"status": {"verified": True}},
        ("a", "taskapp", "t2"): {"status": {"verified": False}},
    }
    assert metrics.phase_counts(bodies) == {
        ("rljob", "a", "Running"): 2,
        ("rljob", "a", "Pending"): 1,
        ("sftjob", "b", "Succeeded"): 1,
        ("rljob", "b", "Unknown"): 1,
        ("taskapp", "a", "Verified"): 1,
        ("taskapp", "a", "Unverified"): 1,
    }


def test_reconcile_pass_counts_ok_error_and_latency() -> None:
    before_ok = _value("posttrain_operator_reconcile_total", kind="rljob", result="ok")
    before_err = _value("posttrain_operator_reconcile_total", kind="rljob", result="error")
    before_n = _value("posttrain_operator_reconcile_duration_seconds_count", kind="rljob")
    with metrics.reconcile_pass("rljob"):
        pass
    with pytest.raises(RuntimeError), metrics.reconcile_pass("rljob"):
        raise RuntimeError("boom")
    assert _value("posttrain_operator_reconcile_total", kind="rljob", result="ok") == before_ok + 1
    assert _value("posttrain_operator_reconcile_total", kind="rljob", result="error") == before_err + 1
    assert _value("posttrain_operator_reconcile_duration_seconds_count", kind="rljob") == before_n + 2


def test_verifications_by_result() -> None:
    async def ok() -> Attempt:
        return Attempt(True, "Verified", "ok")

    async def refused() -> Attempt:
        return Attempt(False, "Unauthorized", "401")

    before = _value("posttrain_operator_verifications_total", result="Unauthorized")
    before_ok = _value("posttrain_operator_verification_duration_seconds_count", outcome="ok")
    assert asyncio.run(metrics.timed_check(ok)).ok
    assert not asyncio.run(metrics.timed_check(refused)).ok
    assert _value("posttrain_operator_verifications_total", result="Unauthorized") == before + 1
    assert _value("posttrain_operator_verification_duration_seconds_count", outcome="ok") == before_ok + 1


def test_served_on_loopback_with_jobs_gauge() -> None:
    settings = load_settings(metrics_port=0)
    assert settings.metrics_port == 0  # off unless the Deployment (or a test) asks
    loops = SimpleNamespace(bodies={("ns1", "rljob", "x"): {"status": {"phase": "Running"}}})
    # port 0 means "off" in settings; the server itself is asked for a free port through MetricsServer
    runtime = SimpleNamespace(settings=settings, loops=loops, metrics_server=None)
    assert metrics.start(runtime) is None and runtime.metrics_server is None
    server = metrics.MetricsServer(0, "127.0.0.1")
    try:
        metrics.count_request("PATCH")
        metrics.count_error("PATCH", 409)
        metrics.watch_restarted("jobs")
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).read().decode()
    finally:
        server.close()
        metrics.JOBS.runtime = None
    samples = _samples(text)
    assert samples[("posttrain_operator_jobs", (("kind", "rljob"), ("namespace", "ns1"), ("phase", "Running")))] == 1
    assert samples[("posttrain_operator_api_requests_total", (("method", "PATCH"),))] >= 1
    assert samples[("posttrain_operator_api_errors_total", (("code", "409"), ("method", "PATCH")))] >= 1
    assert samples[("posttrain_operator_watch_restarts_total", (("resource", "jobs"),))] >= 1
    assert any(name == "posttrain_operator_process_resident_memory_bytes" for name, _ in samples)
