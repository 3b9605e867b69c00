"""The async bench's pure parts (hack/bench_rl_iteration.py --async): a run's record and curve, the medians
and ratios of its last line, and the PNG of the curves."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(HACK))
    module = importlib.import_module("bench_rl_iteration")
    yield module
    sys.modules.pop("bench_rl_iteration", None)


def iterations(returns: list[float], seconds: float, lag: float = 0.0) -> list[dict]:
    return [{"mean_return": r, "iteration_seconds": seconds, "staleness_mean": lag, "stale_dropped": 0,
             "trainer_idle_share": 0.1, "rollout_idle_share": 0.5} for r in returns]  # fmt: skip


def test_a_record_carries_its_curve_over_iterations_and_seconds(bench) -> None:
    record = bench.run_summary("async", 3, 60.0, iterations([0.1, 0.5, 0.75], 20.0, lag=1.0), 0.9)
    assert record["curve"] == [[20.0, 0.1], [40.0, 0.5], [60.0, 0.75]]
    assert record["iterations_per_hour"] == 180.0 and record["staleness_mean"] == 1.0


def test_the_ratio_and_held_out_lists_per_mode_and_the_png(bench, tmp_path) -> None:
    records = [
        bench.run_summary("sync", 1, 100.0, iterations([0.1, 0.6], 50.0), 0.92),
        bench.run_summary("async", 1, 70.0, iterations([0.1, 0.5], 35.0, lag=1.0), 0.90),
        bench.run_summary("async", 2, 75.0, iterations([0.2, 0.5], 37.5, lag=1.0), 0.88),
        bench.run_summary("sync", 2, 110.0, iterations([0.2, 0.7], 55.0), 0.94),
    ]
    result = bench.async_comparison(records, "a CPU")
    # medians: async (102.9 + 96.0) / 2 iterations per hour against sync (72 + 65.5) / 2
    assert result["iterations_per_hour_ratio"] == round(((102.9 + 96.0) / 2) / ((72.0 + 65.5) / 2), 3)
    assert result["held_out_sync"] == [0.92, 0.94] and result["held_out_async"] == [0.90, 0.88]
    assert result["held_out_delta"] == -0.04 and result["runs"] == 2
    png = bench.plot_async(result, tmp_path / "curves.png")
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
