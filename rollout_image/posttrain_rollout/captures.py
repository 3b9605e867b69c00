"""Bounded in-memory store of token captures keyed by correlation id (the `cid` query parameter).

Pure (no I/O): the proxy appends one entry per choice of each captured call, in call order; the trainer
fetches the list with GET /v1/captures/{cid} and deletes it. Bounded by the number of cids (oldest evicted
first), by entries per cid, and by a TTL counted from the cid's last write."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class CaptureStore:
    def __init__(
        self,
        max_cids: int = 10_000,
        ttl_s: float = 3600.0,
        max_entries_per_cid: int = 1_000,
        clock: Callable[[], float] = time.monotonic,
    ):
        if max_cids < 1 or max_entries_per_cid < 1 or ttl_s <= 0:
            raise ValueError("max_cids, max_entries_per_cid and ttl_s must be positive")
        self.max_cids = max_cids
        self.ttl_s = ttl_s
        self.max_entries_per_cid = max_entries_per_cid
        self._clock = clock
        self._data: OrderedDict[str, tuple[float, list[dict[str, Any]]]] = OrderedDict()
        self.evicted = 0
        self.dropped_entries = 0

    def __len__(self) -> int:
        self.expire()
        return len(self._data)

    def __contains__(self, cid: str) -> bool:
        return self.get(cid) is not None

    def expire(self) -> int:
        """Drop cids whose last write is older than the TTL; returns how many were dropped."""
        now = self._clock()
        dropped = 0
        # ordered by last write (move_to_end on every add): stop at the first fresh one
        while self._data:
            cid, (stamp, _) = next(iter(self._data.items()))
            if now - stamp < self.ttl_s:
                break
            del self._data[cid]
            dropped += 1
        self.evicted += dropped
        return dropped

    def add(self, cid: str, entries: list[dict[str, Any]]) -> None:
        self.expire()
        _, existing = self._data.pop(cid, (0.0, []))
        existing.extend(entries)
        if len(existing) > self.max_entries_per_cid:
            self.dropped_entries += len(existing) - self.max_entries_per_cid
            del existing[: len(existing) - self.max_entries_per_cid]  # keep the most recent
        self._data[cid] = (self._clock(), existing)
        while len(self._data) > self.max_cids:
            self._data.popitem(last=False)
            self.evicted += 1

    def get(self, cid: str) -> list[dict[str, Any]] | None:
        self.expire()
        item = self._data.get(cid)
        return None if item is None else list(item[1])

    def pop(self, cid: str) -> list[dict[str, Any]] | None:
        self.expire()
        item = self._data.pop(cid, None)
        return None if item is None else item[1]

    def stats(self) -> dict[str, int]:
        self.expire()
        return {
            "cids": len(self._data),
            "entries": sum(len(v) for _, v in self._data.values()),
            "evicted_cids": self.evicted,
            "dropped_entries": self.dropped_entries,
        }


def _float_or_none(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if f == f else None  # NaN -> None


def chat_choice_logprobs(choice: dict[str, Any]) -> list[float | None]:
    content = ((choice.get("logprobs") or {}).get("content")) or []
    return [_float_or_none(item.get("logprob")) for item in content]


def completion_choice_logprobs(choice: dict[str, Any]) -> list[float | None]:
    return [_float_or_none(x) for x in ((choice.get("logprobs") or {}).get("token_logprobs") or [])]


def entries_from_response(
    body: dict[str, Any], *, chat: bool, weight_version: Any, images: list[str] | None = None
) -> list[dict[str, Any]]:
    """One capture entry per choice of a vLLM response made with return_token_ids and logprobs. `images`: the
    image URLs the request gave vLLM, in prompt order (their placeholders are in prompt_token_ids); the trainer
    rebuilds the same pixel values from them."""
    top_prompt = body.get("prompt_token_ids")
    out = []
    for choice in sorted(body.get("choices") or [], key=lambda c: c.get("index", 0)):
        prompt = choice.get("prompt_token_ids") or top_prompt or []
        completion = choice.get("token_ids") or []
        logprobs = chat_choice_logprobs(choice) if chat else completion_choice_logprobs(choice)
        out.append(
            {
                "prompt_token_ids": [int(t) for t in prompt],
                "completion_token_ids": [int(t) for t in completion],
                "logprobs": logprobs,
                "weight_version": weight_version,
                "finish_reason": choice.get("finish_reason"),
                **({"images": list(images)} if images else {}),
            }
        )
    return out
