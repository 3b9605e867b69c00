"""Seeded sampling (pure): the rollout server gives every captured generation request that carries no seed of
its own a vLLM `seed` derived from the job's seed, the cid and the call's index within that cid.

- The cid's run-independent part is used (`it<k>-s<seed>-r<i>` / `ev<k>-s<seed>-r<i>` of the trainer's
  `trace_<job>-<uid8>-it<k>-s<seed>-r<i>`): a rerun of the same job with the same seed, whose uid differs,
  samples the same tokens (same weights, same batch). A cid of another shape is used whole.
- The call's index within the cid: the turns of a multi-turn episode sample with distinct seeds, and so do
  the rollouts of a group (r<i>) and the groups of an iteration (s<seed>).
- vLLM seeds a request's n > 1 samples with seed + index itself: the derived seeds leave room for that
  (below 2**62)."""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict

# the trainer's cid tail (posttrain_trainer.rollouts.make_cid)
_RUN_INDEPENDENT = re.compile(r"(?:it|ev)\d+-s\d+-r\d+$")
SEED_BITS = 62


def call_key(cid: str) -> str:
    """The part of a cid that names the rollout, not the run: the trainer's `it<k>-s<seed>-r<i>` tail, else
    the whole cid."""
    match = _RUN_INDEPENDENT.search(cid)
    return match.group(0) if match else cid


def request_seed(job_seed: int, cid: str, call: int) -> int:
    """The vLLM seed of call number `call` (0, 1, ...) within `cid` in a job seeded `job_seed`."""
    digest = hashlib.sha256(f"{int(job_seed)}\0{call_key(cid)}\0{int(call)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


class CallCounter:
    """Per cid, how many generation calls it made so far (the index of the next one); the oldest cids are
    forgotten past `max_cids` (a cid's calls come within one episode)."""

    def __init__(self, max_cids: int = 20_000):
        self.max_cids = max_cids
        self._calls: OrderedDict[str, int] = OrderedDict()

    def next(self, cid: str) -> int:
        index = self._calls.pop(cid, 0)
        self._calls[cid] = index + 1
        while len(self._calls) > self.max_cids:
            self._calls.popitem(last=False)
        return index
