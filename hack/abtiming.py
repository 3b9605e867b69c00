"""Interleaved A/B timing for the benchmarks: per-side median and spread of repeated timings, the ratio
of the medians, and the load line (`uptime`) printed beside every timing. Not a benchmark itself (hack/bench.sh runs only hack/bench_*.py)."""

from __future__ import annotations

import statistics
import subprocess
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Series:
    """One side's timed repeats: seconds and the tokens processed in each."""

    name: str
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def add(self, seconds: float, tokens: int = 0) -> None:
        self.seconds.append(seconds)
        self.tokens.append(tokens)

    @property
    def throughput(self) -> list[float]:
        return [t / s for t, s in zip(self.tokens, self.seconds, strict=True) if s > 0]

    def summary(self, values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        q1, _, q3 = (
            statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else (ordered * 3)
        )
        return {
            "median": statistics.median(ordered),
            "min": ordered[0],
            "max": ordered[-1],
            "q1": q1,
            "q3": q3,
        }

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "repeats": len(self.seconds),
            "seconds": [round(s, 3) for s in self.seconds],
            "seconds_summary": _rounded(self.summary(self.seconds)),
        }
        if any(self.tokens):
            out["tokens"] = self.tokens
            out["tokens_per_second_summary"] = _rounded(self.summary(self.throughput))
        return out


def _rounded(values: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 3) for k, v in values.items()}


def spread_line(values: dict[str, float], unit: str, fmt: str = ".1f") -> str:
    return (
        f"median {values['median']:{fmt}} {unit} (min {values['min']:{fmt}}, IQR {values['q1']:{fmt}}-"
        f"{values['q3']:{fmt}}, max {values['max']:{fmt}})"
    )


def ratio_of_medians(numerator: list[float], denominator: list[float]) -> float:
    return statistics.median(numerator) / statistics.median(denominator)


def uptime() -> str:
    """`uptime`'s line: the load average beside a timing (a shared machine inflates it)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "uptime unavailable"
