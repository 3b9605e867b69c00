"""Rank 0's Prometheus metrics, one update per step (docs/monitoring.md): reward mean and spread, loss, KL,
clip fraction, tokens/s, rollout/update/sync seconds, sampler mismatch, memory. Served by prometheus_client's
HTTP server on POSTTRAIN_METRICS_PORT (the trainer container's `metrics` port, 9090, set by the operator; a
local run picks a free loopback port) and POSTTRAIN_METRICS_HOST; no port: nothing is served and nothing is
counted (other ranks never serve).

Every sample carries the job's namespace and name (job_namespace, job_name: Prometheus keeps `job` and
`namespace` for its own target labels). A value a step did not measure keeps its last one; a missing or
non-finite number is never written."""

from __future__ import annotations

import math
import os
import resource
import sys
from typing import Any

from posttrain.api.jobfile import JobFile

PORT_ENV = "POSTTRAIN_METRICS_PORT"
HOST_ENV = "POSTTRAIN_METRICS_HOST"

# gauge name -> (help, the record keys that feed it, first present wins). Records are metrics.jsonl lines
# of any trainer (GSPO iteration, SFT step, ReST-EM iteration, evaluations).
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "posttrain_trainer_step": ("The last finished step (RL iteration, SFT optimizer step).", ("step",)),
    "posttrain_trainer_total_steps": ("Steps the job runs in all.", ("total",)),
    "posttrain_trainer_reward_mean": ("Mean reward of the step's training rollouts.", ("mean_return",)),
    "posttrain_trainer_reward_std": ("Standard deviation of the step's training rewards.", ("return_std",)),
    "posttrain_trainer_eval_score": ("Mean reward on the held-out seeds (RL, ReST-EM).", ("eval_score",)),
    "posttrain_trainer_eval_loss": ("Loss on the validation set (SFT).", ("eval_loss",)),
    "posttrain_trainer_loss": ("Training loss of the step.", ("loss",)),
    "posttrain_trainer_kl": ("KL to the reference policy (GSPO with beta > 0).", ("kl",)),
    "posttrain_trainer_clip_fraction": ("Fraction of policy tokens whose ratio was clipped.", ("clip_fraction",)),
    "posttrain_trainer_grad_norm": ("Gradient norm before clipping.", ("grad_norm",)),
    "posttrain_trainer_learning_rate": ("Learning rate of the step.", ("lr",)),
    "posttrain_trainer_tokens_per_second": ("Tokens trained per second of the update.", ("tokens_per_second",)),
    "posttrain_trainer_sampler_mismatch": ("Mean |logprob trainer - logprob sampler| over policy tokens.",
                                           ("sampler_mismatch",)),
    "posttrain_trainer_sampler_kl": ("KL estimate between trainer and sampler token distributions.",
                                     ("sampler_kl",)),
    "posttrain_trainer_truncated_rollouts": ("Rollouts of the step cut at max_tokens.", ("truncated",)),
    "posttrain_trainer_failed_rollouts": ("Rollouts of the step that failed.", ("failed_rollouts",)),
}  # fmt: skip
PHASES = {  # posttrain_trainer_phase_seconds{phase}: where a step's time went
    "rollout": ("rollout_seconds",),
    "update": ("update_seconds", "step_seconds"),
    "sync": ("weight_sync_seconds",),
    "iteration": ("iteration_seconds", "step_seconds"),
}
LABELS = ("job_namespace", "job_name")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _first(record: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = _number(record.get(key))
        if value is not None:
            return value
    return None


def values_of(record: dict[str, Any]) -> dict[str, float]:
    """{gauge name: value} of one metrics.jsonl line (pure); only the numbers it carries."""
    out = {name: v for name, (_help, keys) in GAUGES.items() if (v := _first(record, keys)) is not None}
    if "eval_score" in record or "eval_loss" in record:
        out.pop("posttrain_trainer_loss", None)  # an evaluation line's loss is not a training loss
    return out


def phase_seconds_of(record: dict[str, Any]) -> dict[str, float]:
    return {phase: v for phase, keys in PHASES.items() if (v := _first(record, keys)) is not None}


def memory_bytes() -> dict[str, float]:
    """This process's peak resident memory and, with CUDA, the allocator's current/peak/reserved bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"rss_peak": float(peak if sys.platform == "darwin" else peak * 1024)}
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["accelerator_allocated"] = float(torch.cuda.memory_allocated())
        out["accelerator_peak"] = float(torch.cuda.max_memory_allocated())
        out["accelerator_reserved"] = float(torch.cuda.memory_reserved())
    return out


class StepMetrics:
    """StepMetrics(job, enabled=is_rank0).observe(record) per step; .close() at the end."""

    def __init__(self, job: JobFile, *, enabled: bool, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        port = int(env.get(PORT_ENV) or 0)
        self.server: Any = None
        self.port: int | None = None
        if not (enabled and port):
            return
        from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.labels = (job.job.namespace, job.job.name)
        self.gauges = {name: Gauge(name, help_, LABELS, registry=registry) for name, (help_, _) in GAUGES.items()}
        self.phase = Gauge("posttrain_trainer_phase_seconds", "Seconds of the last step's phases: rollout, "
                           "update, (weight) sync, and the whole iteration.", (*LABELS, "phase"), registry=registry)  # fmt: skip
        self.memory = Gauge("posttrain_trainer_memory_bytes", "Rank 0's memory: rss_peak; with CUDA "
                            "accelerator_allocated, accelerator_peak, accelerator_reserved.", (*LABELS, "kind"),
                            registry=registry)  # fmt: skip
        self.steps = Counter("posttrain_trainer_steps", "Steps finished by this process.", LABELS, registry=registry)
        self.rollouts = Counter("posttrain_trainer_rollouts", "Training rollouts by result (ok, failed).",
                                (*LABELS, "result"), registry=registry)  # fmt: skip
        try:
            self.server, self.thread = start_http_server(port, addr=env.get(HOST_ENV) or "0.0.0.0", registry=registry)
        except OSError as err:  # metrics must never stop training
            print(f"[posttrain] metrics not served on port {port}: {err}", file=sys.stderr, flush=True)
            return
        self.port = int(self.server.server_address[1])
        print(f"[posttrain] metrics on port {self.port}", flush=True)

    def observe(self, record: dict[str, Any]) -> None:
        if self.server is None:
            return
        for name, value in values_of(record).items():
            self.gauges[name].labels(*self.labels).set(value)
        for phase, value in phase_seconds_of(record).items():
            self.phase.labels(*self.labels, phase).set(value)
        for kind, value in memory_bytes().items():
            self.memory.labels(*self.labels, kind).set(value)
        if "eval_score" not in record and "eval_loss" not in record and _number(record.get("step")) is not None:
            self.steps.labels(*self.labels).inc()
            rollouts, failed = _number(record.get("rollouts")), _number(record.get("failed_rollouts")) or 0.0
            if rollouts is not None:
                self.rollouts.labels(*self.labels, "ok").inc(max(0.0, rollouts - failed))
                self.rollouts.labels(*self.labels, "failed").inc(failed)

    def close(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(timeout=5)
            self.server = None
