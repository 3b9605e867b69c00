"""The evaluation's numbers (pure): mean reward, success rate, pass@k, and the table printed at the end.

pass@k uses the unbiased estimator of Chen et al. 2021 per seed, 1 - C(n - c, k) / C(n, k) with n samples
and c successes (reward >= the success threshold), averaged over seeds; it exists for every k up to the
smallest n. A task app that reports pass@k itself (metrics.pass_at_k, or metrics.details.pass_at_k, a number
or {k: value}) is averaged as given instead."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from posttrain.api.seeds import format_seeds, parse_seeds  # noqa: F401 - re-exported


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with n samples of which c succeeded."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _reported_pass_at_k(row: dict[str, Any]) -> dict[int, float]:
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    details = metrics.get("details") if isinstance(metrics.get("details"), dict) else {}
    value = metrics.get("pass_at_k", details.get("pass_at_k"))
    if isinstance(value, int | float) and not isinstance(value, bool):
        k = metrics.get("k") or details.get("k") or 1
        return {int(k): float(value)}
    if isinstance(value, dict):
        out = {}
        for key, v in value.items():
            try:
                out[int(str(key).removeprefix("pass@"))] = float(v)
            except (TypeError, ValueError):
                continue
        return out
    return {}


@dataclass
class Summary:
    model: str
    episodes: int = 0
    errors: int = 0
    seeds: int = 0
    mean_reward: float | None = None
    success_rate: float | None = None
    pass_at: dict[int, float] = field(default_factory=dict)
    pass_at_source: str = ""  # "estimated from n samples per seed" | "reported by the task app"
    by_split: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    outcome_score: float | None = None  # mean metrics.outcome_score (the outcome rubric), where reported
    events_score: float | None = None  # mean metrics.events_score (the events rubric), where reported

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["pass_at"] = {f"pass@{k}": v for k, v in sorted(self.pass_at.items())}
        return data


def summarize(
    rows: list[dict[str, Any]], *, model: str, threshold: float = 1.0, seconds: float = 0.0
) -> Summary:
    ok = [r for r in rows if isinstance(r.get("reward"), int | float)]
    summary = Summary(model=model, episodes=len(ok), errors=len(rows) - len(ok), seconds=seconds)
    if not ok:
        return summary
    rewards = [float(r["reward"]) for r in ok]
    summary.mean_reward = sum(rewards) / len(rewards)
    summary.success_rate = sum(1 for x in rewards if x >= threshold) / len(rewards)
    per_seed: dict[int, list[float]] = defaultdict(list)
    per_split: dict[str, list[float]] = defaultdict(list)
    for row in ok:
        per_seed[int(row["seed"])].append(float(row["reward"]))
        split = (row.get("metadata") or {}).get("task_split")
        if split:
            per_split[str(split)].append(float(row["reward"]))
    summary.seeds = len(per_seed)
    for name in ("outcome_score", "events_score"):
        scores = [float(v) for r in ok if isinstance(v := (r.get("metrics") or {}).get(name), int | float)]
        if scores:
            setattr(summary, name, sum(scores) / len(scores))
    summary.by_split = {k: sum(v) / len(v) for k, v in sorted(per_split.items())}
    reported: dict[int, list[float]] = defaultdict(list)
    for row in ok:
        for k, value in _reported_pass_at_k(row).items():
            reported[k].append(value)
    if reported:
        summary.pass_at = {k: sum(v) / len(v) for k, v in sorted(reported.items())}
        summary.pass_at_source = "reported by the task app"
        return summary
    n = min(len(v) for v in per_seed.values())
    if n >= 2:
        for k in sorted({1, n} | ({2, 4, 8, 16, 32} & set(range(1, n + 1)))):
            values = [pass_at_k(len(v), sum(1 for x in v if x >= threshold), k) for v in per_seed.values()]
            summary.pass_at[k] = sum(values) / len(values)
        summary.pass_at_source = f"estimated from {n}+ samples per seed (success: reward >= {threshold:g})"
    return summary


def format_table(summaries: list[Summary]) -> str:
    """One row per model: episodes, errors, mean reward, success rate, pass@k columns, the task app's outcome
    and events rubric scores (when it reports them), seconds."""
    ks = sorted({k for s in summaries for k in s.pass_at})
    rubric = [
        (name, label)
        for name, label in (("outcome_score", "OUTCOME"), ("events_score", "EVENTS"))
        if any(getattr(s, name) is not None for s in summaries)
    ]
    head = (
        ["MODEL", "SEEDS", "EPISODES", "ERRORS", "MEAN REWARD", "SUCCESS"]
        + [f"PASS@{k}" for k in ks]
        + [label for _, label in rubric]
        + ["TIME"]
    )
    lines = [head]

    def num(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    for s in summaries:
        lines.append([s.model, str(s.seeds), str(s.episodes), str(s.errors), num(s.mean_reward),
                      num(s.success_rate)] + [num(s.pass_at.get(k)) for k in ks]
                     + [num(getattr(s, name)) for name, _ in rubric] + [f"{s.seconds:.0f}s"])  # fmt: skip
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
