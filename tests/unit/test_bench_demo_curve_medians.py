"""hack/bench_demo_curve.py's pure functions: the medians over runs and the verdict of --compare; the
reliability summary (one record per demo run, the distribution, its JSON last line). The bench itself is not a
test."""

import importlib
import json
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


def summary(returns, final, base=0.086, diagnosis="held-out accuracy 0.633 < 0.8"):
    return {"mean_return": returns, "eval_fine_tuned": final, "eval_base": base, "diagnosis": diagnosis}


def test_a_run_record(bench):
    ok = bench.run_record(3, 241.26, 0, summary([0.0, 0.3, 0.5, 0.9], 0.891))
    assert ok == {"seed": 3, "wall_s": 241.3, "exit_code": 0, "first_0_5": 3, "iterations": 4,
                  "held_out": 0.891, "held_out_base": 0.086, "diagnosis": None,
                  "rollouts_s": None, "updates_s": None, "groups_sampled": None}  # fmt: skip
    timed = summary([0.2, 0.6], 0.9) | {"timings": {"rollouts_s": 240.9, "updates_s": 217.6},
                                        "iterations": [{"groups_sampled": 24}, {"groups_sampled": 13}]}
    record = bench.run_record(1, 640.0, 0, timed)
    assert (record["rollouts_s"], record["updates_s"], record["groups_sampled"]) == (240.9, 217.6, 37)
    # a run without dynamic sampling has no groups_sampled in some iterations: no total, not a partial one
    plain = timed | {"iterations": [{"groups_sampled": 24}, {"mixed_groups": 3}]}
    assert bench.run_record(1, 640.0, 0, plain)["groups_sampled"] is None
    missed = bench.run_record(4, 230.0, 1, summary([0.0, 0.06, 0.2], 0.633))
    assert missed["first_0_5"] is None and missed["diagnosis"] == "held-out accuracy 0.633 < 0.8"
    crashed = bench.run_record(5, 12.0, 2, None)
    assert crashed["held_out"] is None and crashed["first_0_5"] is None and crashed["iterations"] == 0


def test_the_distribution_counts_a_run_without_a_score_as_a_miss(bench):
    records = [bench.run_record(s, w, 0 if h and h >= 0.8 else 1, summary([0.6], h) if h is not None else None)
               for s, w, h in [(0, 240.0, 0.633), (1, 250.0, 0.891), (2, 230.0, 0.883), (3, 260.0, 0.82),
                               (4, 300.0, None)]]  # fmt: skip
    dist = bench.distribution(records, "AMD EPYC 9B14; AVX-512", 0.8)
    assert dist["runs"] == 5 and dist["seeds"] == [0, 1, 2, 3, 4]
    assert dist["held_out"] == [0.633, 0.891, 0.883, 0.82, None]
    assert dist["min"] == 0.0 and dist["median"] == 0.82
    assert dist["share_at_least_0_8"] == 0.6 == dist["share_at_least_bar"]
    assert dist["wall_s_median"] == 250.0 and dist["cpu"] == "AMD EPYC 9B14; AVX-512"
    assert dist["first_0_5"] == [1, 1, 1, 1, None]
    line = json.loads(json.dumps(dist))  # the last line is one JSON object with the keys
    assert {"runs", "held_out", "share_at_least_0_8", "wall_s_median", "cpu"} <= set(line)
    assert bench.distribution([], "x")["share_at_least_0_8"] is None


def test_cpu_label_names_family_and_model():
    from posttrain import hardware

    text = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
            "model name\t: AMD EPYC\n")  # fmt: skip
    assert hardware.cpu_label(text) == "AMD EPYC (family 25 model 17)"
    assert hardware.cpu_label("processor : 0\n")  # no model name: the platform's, never empty
