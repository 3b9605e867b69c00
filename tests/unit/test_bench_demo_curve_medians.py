"""hack/bench_demo_curve.py's medians over runs and its verdict (pure functions; the bench itself is not a test)."""

import importlib
import sys
from pathlib import Path

import pytest

HACK = Path(__file__).resolve().parents[2] / "hack"


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(HACK))  # it imports hack/abtiming.py as a sibling
    module = importlib.import_module("bench_demo_curve")
    yield module
    sys.modules.pop("bench_demo_curve", None)


def test_a_run_that_missed_the_target_ranks_above_every_number(bench):
    assert bench.median_or_none([17, 12, 15]) == 15
    assert bench.median_or_none([17, None, 15]) == 17
    assert bench.median_or_none([None, None, 15]) is None
    assert bench.median_or_none([10, 20]) == 15
    assert bench.median_or_none([]) is None


def _run(name, iterations, seconds, after=0.9):
    return {"name": name, "iterations_to_target": iterations, "seconds_to_target": seconds, "eval_after": after}


def test_verdict_needs_fewer_seconds_and_no_more_iterations(bench):
    runs = [_run("reference", 17, 600.0), _run("ours (posttrain)", 15, 300.0),
            _run("reference", 12, 480.0), _run("ours (posttrain)", None, None),
            _run("reference", 17, 570.0), _run("ours (posttrain)", 12, 250.0)]  # fmt: skip
    out = bench.verdict(runs)
    assert out["reference"]["median_iterations_to_target"] == 17
    assert out["reference"]["median_seconds_to_target"] == 570.0
    assert out["ours (posttrain)"]["median_iterations_to_target"] == 15  # the missed run ranks last
    assert out["ours (posttrain)"]["median_seconds_to_target"] == 300.0
    assert out["ours_fewer_seconds"] and out["ours_no_more_iterations"]
    slower = bench.verdict([_run("reference", 12, 400.0), _run("ours (posttrain)", 13, 300.0)])
    assert slower["ours_fewer_seconds"] and not slower["ours_no_more_iterations"]
    missed = bench.verdict([_run("reference", 12, 400.0), _run("ours (posttrain)", None, None)])
    assert not missed["ours_fewer_seconds"] and not missed["ours_no_more_iterations"]
