"""Asynchronous sampling's pure parts: the staleness filter and its drop count, the lag statistics, the idle
shares, the rollout server's busy clock and stale-seconds bookkeeping, the background sampler's order, and the
settings' rules for [training] async_depth."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from posttrain.api import convert
from posttrain.api.config import normalized_config
from posttrain.api.settings import settings_for
from posttrain.errors import UserError
from posttrain.local.runner import format_iteration
from posttrain_rollout.weights import BusyClock, WeightGate
from posttrain_trainer import offpolicy, utilisation
from posttrain_trainer.pipeline import RolloutPipeline, SampledBatch, requested_window
from posttrain_trainer.weightsync import SyncResult

REPO = Path(__file__).resolve().parents[2]


def _rollout(*versions):
    return SimpleNamespace(versions=list(versions))


def test_fresh_rollouts_drop_and_count_what_lags_more_than_the_depth():
    results = [_rollout(4), _rollout(3), _rollout(2), _rollout(3, 4), _rollout(2, 4), _rollout(None), _rollout("3")]
    kept, dropped = offpolicy.fresh_rollouts(results, 4, 1, lambda r: r.versions)
    # a rollout is as old as its oldest call; one with no known version is kept
    assert [r.versions for r in kept] == [[4], [3], [3, 4], [None], ["3"]]
    assert dropped == 2
    kept, dropped = offpolicy.fresh_rollouts(results, 4, 2, lambda r: r.versions)
    assert dropped == 0 and len(kept) == len(results)


def test_lag_stats_are_over_policy_calls():
    stats = offpolicy.lag_stats([[3, 4], [4], ["2"], [None, True]], 4)
    assert stats == {"staleness_mean": pytest.approx((1 + 0 + 0 + 2) / 4), "staleness_max": 2}
    assert offpolicy.lag_stats([[None]], 4) == {"staleness_mean": None, "staleness_max": None}


def test_expected_versions_widen_with_the_depth():
    versions = [[4], [3], [2]]
    assert offpolicy.staleness(versions, 4, 4)["unexpected_versions"] == 2
    assert offpolicy.staleness(versions, 4, 4, depth=1)["unexpected_versions"] == 1
    assert offpolicy.staleness(versions, 4, 4, depth=1)["max_staleness"] == 2


def test_idle_share_arithmetic():
    assert utilisation.idle_share(3.0, 10.0) == pytest.approx(0.7)
    assert utilisation.idle_share(12.0, 10.0) == 0.0  # clock skew never makes a negative share
    assert utilisation.idle_share(1.0, 0.0) is None
    assert utilisation.trainer_busy_seconds({"seconds": 4.0}, {"weight_sync_save_seconds": 1.0}) == 5.0
    assert utilisation.trainer_busy_seconds({"seconds": 4.0}, {}) == 4.0
    # two servers, busy 2 s and 6 s of 8: idle 0.75 and 0.25; one that did not answer is left out
    assert utilisation.servers_idle_share([10.0, 0.0, None], [12.0, 6.0, 5.0], 8.0) == pytest.approx(0.5)
    assert utilisation.servers_idle_share([None], [None], 8.0) is None


def test_busy_clock_counts_overlapping_work_once():
    now = [0.0]
    clock = BusyClock(now=lambda: now[0])
    clock.start()
    now[0] = 1.0
    clock.start()  # a second request while the first runs
    now[0] = 2.0
    clock.stop()
    now[0] = 3.0
    assert clock.seconds() == 3.0  # still running
    clock.stop()
    now[0] = 10.0
    clock.start()
    now[0] = 11.0
    clock.stop()
    assert clock.seconds() == 4.0


def test_gate_counts_the_sync_as_busy_and_records_stale_seconds():
    async def scenario():
        gate = WeightGate()
        version = await gate.enter()  # a request in flight on version 0

        async def finish_later():
            await asyncio.sleep(0.05)
            await gate.leave()

        task = asyncio.create_task(finish_later())
        drain = await gate.pause()  # waits for the request: it finishes on the old weights
        await task
        assert version == 0 and drain >= 0.04
        await asyncio.sleep(0.02)  # "loading"
        await gate.resume(1)
        timing = gate.record_sync(0.1, drain)
        stats = gate.stats()
        assert gate.version == 1 and timing == {"stale_seconds": 0.1, "drain_seconds": drain}
        assert stats["stale_seconds_total"] == 0.1 and stats["busy_seconds"] >= 0.06
        assert await gate.enter() == 1

    asyncio.run(scenario())


def test_sync_metrics_take_the_slowest_server():
    result = SyncResult(1, "/w", "full", 0.1, 0.0, 0.5, 0.6,
                        server=[{"stale_seconds": 0.4, "drain_seconds": 0.1}, {"stale_seconds": 0.5}, {}])  # fmt: skip
    metrics = result.as_metrics()
    assert metrics["weight_sync_stale_seconds"] == 0.5 and metrics["weight_sync_drain_seconds"] == 0.1
    assert SyncResult(1, "/w", "full", 0, 0, 0, 0).as_metrics()["weight_sync_stale_seconds"] is None


def test_requested_window():
    assert list(requested_window(0, 0, 5)) == [0]
    assert list(requested_window(0, 1, 5)) == [0, 1]
    assert list(requested_window(3, 2, 5)) == [3, 4]  # never past the last iteration
    assert list(requested_window(4, 1, 5)) == [4]


def test_pipeline_samples_ahead_in_order_on_one_thread():
    calls: list[tuple[int, str]] = []
    release = threading.Event()

    def sample(iteration, loop):
        calls.append((iteration, threading.current_thread().name))
        if iteration == 1:
            release.wait(5)
        return SampledBatch(iteration, [], [], seconds=0.0)

    pipeline = RolloutPipeline(sample)
    try:
        assert pipeline.ensure(requested_window(0, 1, 3)) == [0, 1]
        assert pipeline.ensure([0, 1]) == []  # each batch is requested once
        batch, _ = pipeline.take(0)
        assert batch.iteration == 0
        threading.Timer(0.1, release.set).start()
        started = time.perf_counter()
        batch, waited = pipeline.take(1)
        assert batch.iteration == 1 and waited >= 0.05 and time.perf_counter() - started >= 0.05
        assert pipeline.pending() == []
    finally:
        pipeline.close()
    assert [c[0] for c in calls] == [0, 1]
    assert all(name.startswith("posttrain-sampler") for _, name in calls)


def _settings(training: str):
    text = (REPO / "examples" / "demo" / "rl.toml").read_text().replace("weight_sync_interval = 1\n", "")
    text = text.replace("[training]\n", "[training]\n" + training, 1)
    _, config, _ = convert.load(text, kind="rl", file="rl.toml", model=None)
    return settings_for("rl", normalized_config(config))


def test_async_depth_makes_the_sampler_the_behaviour_policy():
    assert _settings("").async_depth == 0 and _settings("").old_logprobs == "trainer"
    s = _settings("async_depth = 1\n")
    assert s.async_depth == 1 and s.old_logprobs == "sampler"


@pytest.mark.parametrize(
    "training, field",
    [('async_depth = 1\nold_logprobs = "trainer"\n', "training.old_logprobs"),
     ("async_depth = 1\nweight_sync_interval = 2\n", "training.weight_sync_interval")],
)  # fmt: skip
def test_async_depth_refuses_what_would_break_its_bound(training, field):
    with pytest.raises(UserError) as err:
        _settings(training)
    assert field in str(err.value) and "async_depth" in str(err.value) and "fix:" in str(err.value)


def test_progress_line_shows_lag_drops_and_idle_shares():
    line = format_iteration({"rollouts": 8, "groups": 2, "staleness_mean": 0.75, "staleness_max": 1,
                             "stale_dropped": 2, "trainer_idle_share": 0.25, "rollout_idle_share": 0.5})  # fmt: skip
    assert "lag 0.75 mean / 1 max versions, 2 stale dropped" in line
    assert "idle: trainer 25%, rollout 50%" in line
    assert "lag" not in format_iteration({"rollouts": 8, "groups": 2, "staleness_max": 0})
