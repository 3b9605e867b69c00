"""Rank 0's /metrics (posttrain_trainer/telemetry.py) and the live-curve schedule (posttrain_trainer/live.py):
the record -> gauge mapping (pure) and a StepMetrics served on loopback, scraped over HTTP."""

from __future__ import annotations

import urllib.request
from types import SimpleNamespace

from posttrain.localhost import free_port
from posttrain_trainer import live, telemetry
from prometheus_client.parser import text_string_to_metric_families

RL_LINE = {
    "step": 3, "total": 10, "loss": 0.25, "mean_return": 0.5, "return_std": 0.4, "kl": 0.01,
    "clip_fraction": 0.1, "tokens_per_second": 1234.0, "rollout_seconds": 2.0, "update_seconds": 1.5,
    "weight_sync_seconds": 0.3, "iteration_seconds": 4.0, "sampler_mismatch": 0.02, "rollouts": 8,
    "failed_rollouts": 1, "grad_norm": float("nan"), "judge_scores": {},
}  # fmt: skip


def job(namespace: str = "team-a", name: str = "math-rl") -> SimpleNamespace:
    return SimpleNamespace(job=SimpleNamespace(namespace=namespace, name=name))


def test_values_of_an_rl_line() -> None:
    values = telemetry.values_of(RL_LINE)
    assert values["posttrain_trainer_reward_mean"] == 0.5
    assert values["posttrain_trainer_reward_std"] == 0.4
    assert values["posttrain_trainer_kl"] == 0.01 and values["posttrain_trainer_clip_fraction"] == 0.1
    assert "posttrain_trainer_grad_norm" not in values  # NaN is never written
    assert telemetry.phase_seconds_of(RL_LINE) == {"rollout": 2.0, "update": 1.5, "sync": 0.3, "iteration": 4.0}


def test_values_of_an_evaluation_and_an_sft_step() -> None:
    assert telemetry.values_of({"step": 4, "eval_score": 0.75}) == {
        "posttrain_trainer_step": 4.0, "posttrain_trainer_eval_score": 0.75,
    }  # fmt: skip
    sft = {"step": 7, "loss": 1.5, "tokens_per_second": 99.0, "step_seconds": 0.5, "lr": 1e-4}
    assert telemetry.values_of(sft)["posttrain_trainer_loss"] == 1.5
    assert telemetry.phase_seconds_of(sft) == {"update": 0.5, "iteration": 0.5}


def test_no_port_serves_nothing() -> None:
    metrics = telemetry.StepMetrics(job(), enabled=True, env={})
    assert metrics.server is None
    metrics.observe(RL_LINE)  # a no-op
    other_rank = telemetry.StepMetrics(job(), enabled=False, env={"POSTTRAIN_METRICS_PORT": str(free_port())})
    assert other_rank.server is None


def test_served_per_step_on_loopback() -> None:
    port = free_port()
    env = {"POSTTRAIN_METRICS_PORT": str(port), "POSTTRAIN_METRICS_HOST": "127.0.0.1"}
    metrics = telemetry.StepMetrics(job(), enabled=True, env=env)
    try:
        assert metrics.port == port
        metrics.observe(RL_LINE)
        metrics.observe({**RL_LINE, "step": 4, "mean_return": 0.75})
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        metrics.close()
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    ids = {("job_namespace", "team-a"), ("job_name", "math-rl")}
    assert samples[("posttrain_trainer_reward_mean", frozenset(ids))] == 0.75
    assert samples[("posttrain_trainer_step", frozenset(ids))] == 4
    assert samples[("posttrain_trainer_steps_total", frozenset(ids))] == 2
    assert samples[("posttrain_trainer_rollouts_total", frozenset({*ids, ("result", "failed")}))] == 2
    assert samples[("posttrain_trainer_phase_seconds", frozenset({*ids, ("phase", "sync")}))] == 0.3
    assert samples[("posttrain_trainer_memory_bytes", frozenset({*ids, ("kind", "rss_peak")}))] > 1e6


def test_port_in_use_does_not_stop_training() -> None:
    port = free_port()
    env = {"POSTTRAIN_METRICS_PORT": str(port), "POSTTRAIN_METRICS_HOST": "127.0.0.1"}
    first = telemetry.StepMetrics(job(), enabled=True, env=env)
    try:
        second = telemetry.StepMetrics(job(), enabled=True, env=env)
        assert second.server is None
        second.observe(RL_LINE)
    finally:
        first.close()


def test_live_schedule() -> None:
    assert [n for n in range(1, 13) if live.due(n, 5)] == [1, 5, 10]
    assert [n for n in range(1, 4) if live.due(n, 1)] == [1, 2, 3]
    assert not any(live.due(n, 0) for n in range(1, 10))


def test_sparkline_of_reward_then_loss() -> None:
    from posttrain.plotting import sparkline

    lines = [{"step": s, "mean_return": r} for s, r in enumerate([0.0, 0.5, 1.0], start=1)]
    assert sparkline(lines) == "reward ▁▅█ 0 -> 1 (3 steps)"
    assert sparkline([{"progress": {"step": 1, "loss": 2.0}}, {"progress": {"step": 2, "loss": 2.0}}]) == (
        "loss ▁▁ 2 -> 2 (2 steps)"
    )
    assert sparkline([{"event": "resumed", "step": 3}]) is None


def test_an_sft_validation_line_is_a_loss_not_a_score() -> None:
    assert telemetry.values_of({"step": 5, "eval_loss": 0.9, "eval_perplexity": 2.5}) == {
        "posttrain_trainer_step": 5.0, "posttrain_trainer_eval_loss": 0.9,
    }  # fmt: skip


def test_memory_reports_the_cuda_allocator_when_it_is_in_use(monkeypatch) -> None:
    import sys

    cuda = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, memory_allocated=lambda: 5,
                           max_memory_allocated=lambda: 7, memory_reserved=lambda: 9)  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    memory = telemetry.memory_bytes()
    assert memory["accelerator_allocated"] == 5 and memory["accelerator_peak"] == 7
    assert memory["accelerator_reserved"] == 9 and memory["rss_peak"] > 0
