"""What `posttrain eval` prints as synth's eval CLI does (pure): a line per rollout as it comes
(`seed=N status=200 mean_return=... outcome=... events=...`), then the totals (`Eval complete: ...`, the
outcome summary, the official mean and each judge's mean with its Pearson r against the official score) and
a table of seeds with the task app's official, outcome and events scores and each judge's."""

from __future__ import annotations

import math
from typing import Any


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) else None


def official(row: dict[str, Any]) -> float | None:
    """synth's official score: metrics.mean_return, total_reward or outcome_score (the first set), else
    the row's reward."""
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    for key in ("mean_return", "total_reward", "outcome_score"):
        if (value := _num(metrics.get(key))) is not None:
            return value
    return _num(row.get("reward"))


def _score(row: dict[str, Any], key: str) -> float | None:
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    return _num(metrics.get(key))


def seed_line(row: dict[str, Any]) -> str:
    parts = [f"seed={row.get('seed')}"]
    if row.get("error"):
        return " ".join(parts + [f"error={row['error']}"])
    parts.append("status=200")
    metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
    for key, label in (("mean_return", "mean_return"), ("outcome_score", "outcome"), ("events_score", "events")):
        if (value := _num(metrics.get(key))) is not None:
            parts.append(f"{label}={value:g}")
    for name, value in ((row.get("metadata") or {}).get("judge_scores") or {}).items():
        parts.append(f"judge[{name}]={'-' if value is None else f'{value:.3f}'}")
    return " ".join(parts)


def pearson(xs: list[float], ys: list[float]) -> float | None:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sx = math.sqrt(sum((x - mx) ** 2 for x in xs))
    sy = math.sqrt(sum((y - my) ** 2 for y in ys))
    if sx == 0 or sy == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / (sx * sy)


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def summary_lines(rows: list[dict[str, Any]], *, model: str, split: str | None, judges: list[str]) -> list[str]:
    ok = [r for r in rows if not r.get("error")]
    lines = [f"Eval complete: {len(ok)} ok, {len(rows) - len(ok)} failed; model={model}, split={split or 'default'}"]
    outcomes = [v for r in ok if (v := _score(r, "outcome_score")) is not None]
    if outcomes:
        right = sum(1 for v in outcomes if v >= 0.5)
        lines.append(f"Outcome summary: correct={right}/{len(outcomes)} ({right / len(outcomes):.2%}), "
                     f"mean_outcome={sum(outcomes) / len(outcomes):.3f}")  # fmt: skip
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
    lines.append(f"  Official mean: {fmt(_mean([official(r) for r in ok]))}")
    for label, key in (("Outcome", "outcome_score"), ("Events", "events_score")):
        values = [_score(r, key) for r in ok]
        if any(v is not None for v in values):
            lines.append(f"  {label} mean: {fmt(_mean(values))}")
    for name in judges:
        scores = [((r.get("metadata") or {}).get("judge_scores") or {}).get(name) for r in ok]
        lines.append(f"  [{name}] mean: {fmt(_mean(scores))}")
        paired = [(official(r), s) for r, s in zip(ok, scores, strict=True) if official(r) is not None and s is not None]
        if len(paired) >= 2:
            r_value = pearson([float(a) for a, _ in paired], [float(b) for _, b in paired])
            lines.append(f"    Pearson r: {'undefined (zero variance)' if r_value is None else f'{r_value:.3f}'}")
        else:
            lines.append("    Pearson r: n/a (need >= 2 paired scores)")
    return lines


def seed_table(rows: list[dict[str, Any]], judges: list[str]) -> list[str]:
    """Seed, sample, official, outcome, events and each judge's score per rollout, sorted by seed."""
    header = ["Seed", "Sample", "Official", "Outcome", "Events", *judges]
    table = [header]
    cell = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    for row in sorted(rows, key=lambda r: (r.get("seed") or 0, r.get("sample") or 0)):
        scores = (row.get("metadata") or {}).get("judge_scores") or {}
        if row.get("error"):
            table.append([str(row.get("seed")), str(row.get("sample", 0)), "error", "-", "-", *("-" for _ in judges)])
            continue
        table.append([str(row.get("seed")), str(row.get("sample", 0)), cell(official(row)),
                      cell(_score(row, "outcome_score")), cell(_score(row, "events_score")),
                      *(cell(_num(scores.get(name))) for name in judges)])  # fmt: skip
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in table]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
