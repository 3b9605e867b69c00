"""Asynchronous sampling ([training] async_depth > 0): rank 0 samples the batches of the next iterations in a
background thread while every rank runs the update.

With async_depth N, when iteration k's batch is taken, the batches of k+1 .. k+N are already requested; they
are sampled one after the other (one worker thread, its own event loop: a RolloutLoop that lives in that
thread), each with whatever weights the rollout servers hold when its requests arrive. A server takes the
weights of k+1 between requests (posttrain_rollout.weights.WeightGate): requests in flight finish on the old
weights and their captures keep the old version. At the update of iteration k, a rollout sampled by version v
lags k - v versions; rollouts lagging more than N are dropped before the advantages are computed and counted
(offpolicy.fresh_rollouts), the rest are corrected by the truncated importance ratio of old_logprobs =
"sampler" (offpolicy.py).

Per-request sampling seeds stay those of the synchronous loop (the rollout server derives them from the cid,
which names the iteration, the task seed and the member: posttrain_rollout.seeding); which weight version a
request meets depends on when it arrives, which the captures record."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from posttrain_trainer.rollouts import RolloutLoop, RolloutResult


@dataclass
class SampledBatch:
    """One iteration's rollouts: those to train on (`results`), every one sampled (`sampled`, which the
    error budget counts), dynamic sampling's counts, and the wall seconds the sampling took."""

    iteration: int
    results: list[RolloutResult]
    sampled: list[RolloutResult]
    stats: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


Sampler = Callable[[int, RolloutLoop], SampledBatch]  # (iteration, the loop to run it on) -> its batch


class RolloutPipeline:
    """Rank 0's background sampler: ensure(iterations) requests batches (each once, in order), take(k) waits
    for batch k and returns it with the seconds waited; close() waits for the batch in flight, then ends the
    thread and its event loop."""

    def __init__(self, sample: Sampler):
        self._sample = sample
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="posttrain-sampler")
        self._futures: dict[int, Future[SampledBatch]] = {}
        self._local = threading.local()
        self._loops: list[RolloutLoop] = []

    def _loop(self) -> RolloutLoop:
        loop = getattr(self._local, "loop", None)
        if loop is None:  # made in the worker thread: an asyncio runner belongs to the thread that runs it
            loop = self._local.loop = RolloutLoop()
            self._loops.append(loop)
        return loop

    def _run(self, iteration: int) -> SampledBatch:
        return self._sample(iteration, self._loop())

    def ensure(self, iterations: Iterable[int]) -> list[int]:
        """Request the batches of `iterations` not requested yet; the ones requested now."""
        new = [k for k in iterations if k not in self._futures]
        for k in new:
            self._futures[k] = self._pool.submit(self._run, k)
        return new

    def pending(self) -> list[int]:
        return sorted(self._futures)

    def take(self, iteration: int) -> tuple[SampledBatch, float]:
        """Batch `iteration` (requested first if it was not) and the seconds this call waited for it."""
        self.ensure([iteration])
        started = time.perf_counter()
        future = self._futures.pop(iteration)
        batch = future.result()
        return batch, time.perf_counter() - started

    def close(self) -> None:
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()

        def close_loop() -> None:
            loop = getattr(self._local, "loop", None)
            if loop is not None:
                loop.close()

        try:
            self._pool.submit(close_loop).result()
        finally:
            self._pool.shutdown(wait=True)


def requested_window(iteration: int, depth: int, total: int) -> range:
    """The iterations whose batches should be requested when iteration `iteration`'s batch is taken: itself
    and up to `depth` ahead, never past the last iteration (total - 1)."""
    return range(iteration, min(iteration + depth, total - 1) + 1)
