"""Monitoring is no side door (docs/security.md): in every install the operator's metrics port admits only a
namespace labelled posttrain.dev/monitoring=true; the PodMonitors of tenant-run pods bound each scrape
(sampleLimit, labelLimit, label lengths) and keep only posttrain's own metric names, which still cover
everything the trainer exports and the dashboard shows."""

from __future__ import annotations

import re

import pytest
import yaml
from posttrain.localhost import free_port
from posttrain_trainer import telemetry
from test_manifests import find, needs_kubectl, render
from test_monitoring_manifests import METRIC, MONITORING, exposed, exprs, vllm_metric_names

OVERLAYS = ("dev", "dev-node", "prod", "namespaced")


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_operators_metrics_port_admits_only_the_monitoring_namespace(overlay: str) -> None:
    docs = render(f"overlays/{overlay}")
    policy = find(docs, "NetworkPolicy", "posttrain-operator")["spec"]
    assert policy["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "posttrain-operator"}}
    assert policy["policyTypes"] == ["Ingress"]
    metrics_rules = [r for r in policy["ingress"] if any(p["port"] == 9090 for p in r.get("ports", []))]
    assert metrics_rules == [{"from": [{"namespaceSelector": {"matchLabels": {"posttrain.dev/monitoring": "true"}}}],
                              "ports": [{"port": 9090, "protocol": "TCP"}]}]  # fmt: skip
    for rule in policy["ingress"]:  # every other rule names ports, none of them the metrics port
        assert rule.get("ports") and all(p["port"] != 9090 for p in rule["ports"]) or rule in metrics_rules


def monitors() -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all((MONITORING / "monitors.yaml").read_text())}


def keep(monitor: dict) -> re.Pattern[str]:
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (rule,) = endpoint["metricRelabelings"]
    assert rule["action"] == "keep" and rule["sourceLabels"] == ["__name__"]
    return re.compile(rule["regex"])  # Prometheus anchors the regex at both ends: fullmatch


def test_pod_monitors_bound_every_scrape() -> None:
    for name in ("posttrain-trainers", "posttrain-servers"):
        spec = monitors()[name]["spec"]
        assert 0 < spec["sampleLimit"] <= 5000 and 0 < spec["labelLimit"] <= 32, name
        assert spec["labelNameLengthLimit"] and spec["labelValueLengthLimit"], name


def test_the_trainer_keep_list_is_what_the_trainer_exports_and_nothing_else() -> None:
    pattern = keep(monitors()["posttrain-trainers"])
    trainer = telemetry.StepMetrics(
        type("J", (), {"job": type("R", (), {"namespace": "n", "name": "j"})})(), enabled=True,
        env={"POSTTRAIN_METRICS_PORT": str(free_port()), "POSTTRAIN_METRICS_HOST": "127.0.0.1"},
    )  # fmt: skip
    try:
        exported = {n for n in exposed(trainer.registry) if not n.endswith("_created")}
    finally:
        trainer.close()
    assert exported and all(pattern.fullmatch(n) for n in exported), [n for n in exported if not pattern.fullmatch(n)]
    dashboard = {n for e in exprs() for n in METRIC.findall(e) if n.startswith("posttrain_trainer_")}
    assert all(pattern.fullmatch(n) for n in dashboard)
    for other in ("evil_series", "posttrain_trainer_made_up", "posttrain_operator_jobs", "vllm:num_requests_running"):
        assert not pattern.fullmatch(other), other


def test_the_server_keep_list_holds_the_dashboards_vllm_metrics_and_only_vllms() -> None:
    pattern = keep(monitors()["posttrain-servers"])
    dashboard = {n for e in exprs() for n in METRIC.findall(e) if n.startswith("vllm:")}
    assert dashboard and all(pattern.fullmatch(n) for n in dashboard), dashboard
    for other in ("evil_series", "posttrain_trainer_loss", "vllm:made_up_metric"):
        assert not pattern.fullmatch(other), other
    known = vllm_metric_names()  # the installed vLLM defines each kept name
    for name in ("vllm:num_requests_running", "vllm:generation_tokens_total", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_count",
                 "vllm:request_success_total", "vllm:prompt_tokens_total", "vllm:num_requests_waiting"):  # fmt: skip
        assert pattern.fullmatch(name) and name in known, name
