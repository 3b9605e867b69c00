"""The Grafana dashboard and the monitoring overlay against what the code exports: every PromQL expression
names only metrics the operator, the trainer or vLLM expose, and the PodMonitors select the pods and ports
the operator renders."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from posttrain.controller import metrics, render
from posttrain.localhost import free_port
from posttrain_trainer import telemetry
from test_pod_security import SETTINGS, TARGET, rljob

MONITORING = Path(__file__).resolve().parents[2] / "manifests" / "overlays" / "monitoring"
DASHBOARD = MONITORING / "posttrain-dashboard.json"
METRIC = re.compile(r"\b(posttrain_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",),
            "summary": ("_count", "_sum", "")}  # fmt: skip


def exposed(registry) -> set[str]:
    """The sample names a registry exposes (a counter `x` as x_total, a histogram as x_bucket/_count/_sum)."""
    return {f.name + s for f in registry.collect() for s in SUFFIXES.get(f.type, ("",))}


def vllm_metric_names() -> set[str]:
    """The metric names the installed vLLM defines (its v1 metrics modules); counters gain _total."""
    vllm = pytest.importorskip("vllm")
    names: set[str] = set()
    for path in (Path(vllm.__file__).parent / "v1" / "metrics").glob("*.py"):
        for name in re.findall(r'"(vllm:[a-z0-9_]+)"', path.read_text()):
            names |= {name, name + "_total", name + "_bucket", name + "_count", name + "_sum"}
    return names


def exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        found += [t["expr"] for t in panel["targets"]]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["query"])
    return found


def test_every_dashboard_expression_names_exported_metrics() -> None:
    trainer = telemetry.StepMetrics(
        type("J", (), {"job": type("R", (), {"namespace": "n", "name": "j"})})(), enabled=True,
        env={"POSTTRAIN_METRICS_PORT": str(free_port()), "POSTTRAIN_METRICS_HOST": "127.0.0.1"},
    )  # fmt: skip
    try:
        known = exposed(metrics.REGISTRY) | exposed(trainer.registry) | vllm_metric_names()
    finally:
        trainer.close()
    assert "posttrain_operator_jobs" in known and "posttrain_trainer_reward_mean" in known
    for expr in exprs():
        names = METRIC.findall(expr)
        assert names, f"{expr!r} names no posttrain or vLLM metric"
        unknown = [n for n in names if n not in known]
        assert not unknown, f"{expr!r}: {unknown} are not exported"


def test_the_dashboard_shows_each_requested_quantity() -> None:
    text = " ".join(exprs())
    for name in ("posttrain_operator_jobs", "posttrain_operator_reconcile_total",
                 "posttrain_operator_reconcile_duration_seconds_bucket", "posttrain_operator_api_errors_total",
                 "posttrain_operator_verifications_total", "posttrain_operator_watch_restarts_total",
                 "posttrain_trainer_reward_mean", "posttrain_trainer_reward_std", "posttrain_trainer_loss",
                 "posttrain_trainer_kl", "posttrain_trainer_clip_fraction", "posttrain_trainer_tokens_per_second",
                 "posttrain_trainer_phase_seconds", "posttrain_trainer_sampler_mismatch",
                 "posttrain_trainer_memory_bytes", "vllm:num_requests_running"):  # fmt: skip
        assert name in text, name


def _selects(selector: dict, labels: dict) -> bool:
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(e["operator"] == "In" and labels.get(e["key"]) in e["values"]
               for e in selector.get("matchExpressions") or [])  # fmt: skip


def test_pod_monitors_select_the_rendered_pods_and_ports() -> None:
    monitors = {d["metadata"]["name"]: d for d in yaml.safe_load_all((MONITORING / "monitors.yaml").read_text())}
    rendered = render.render_rljob(rljob(), SETTINGS, TARGET)
    pods = {}
    for child in rendered.children:
        if child["kind"] in ("Deployment", "Job"):
            template = child["spec"]["template"]
            pods[template["metadata"]["labels"]["posttrain.dev/role"]] = template
    for name, roles in (("posttrain-trainers", {"trainer"}), ("posttrain-servers", {"rollout", "reference", "judge"})):
        monitor = monitors[name]["spec"]
        assert monitor["namespaceSelector"] == {"any": True}
        selected = {role for role, t in pods.items() if _selects(monitor["selector"], t["metadata"]["labels"])}
        assert selected == roles, name
        (endpoint,) = monitor["podMetricsEndpoints"]
        for role in roles:
            ports = {p["name"] for c in pods[role]["spec"]["containers"] for p in c.get("ports", [])}
            assert endpoint["port"] in ports, (role, ports)
    trainer_env = {e["name"]: e.get("value") for e in pods["trainer"]["spec"]["containers"][0]["env"]}
    assert trainer_env["POSTTRAIN_METRICS_PORT"] == "9090"
    operator = monitors["posttrain-operator"]["spec"]
    assert operator["endpoints"][0]["port"] == "metrics"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with kustomize) not installed")
def test_the_overlay_carries_the_dashboard_for_grafana() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "posttrain-grafana-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["posttrain-dashboard.json"])["uid"] == "posttrain"
    (deployment,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "posttrain-operator"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POSTTRAIN_METRICS_PORT"] == "9090"
