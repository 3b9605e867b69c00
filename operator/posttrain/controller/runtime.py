"""What every handler shares inside one operator process: settings, the API client, and the wake-up events
that let a child's watch event re-run its parent's reconcile loop at once (instead of on the next resync)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from posttrain.controller.kube import Kube
from posttrain.controller.settings import OperatorSettings

Key = tuple[str, str, str]  # (namespace, kind label: rljob|sftjob|taskapp, name)


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    wakers: dict[Key, asyncio.Event] = field(default_factory=dict)
    _secret_cache: dict[tuple[str, str, str], tuple[float, str | None]] = field(default_factory=dict)
    reconciles: int = 0
    generations: dict[Key, Any] = field(default_factory=dict)

    def waker(self, key: Key) -> asyncio.Event:
        return self.wakers.setdefault(key, asyncio.Event())

    def wake(self, key: Key) -> None:
        event = self.wakers.get(key)
        if event is not None:
            event.set()

    def drop(self, key: Key) -> None:
        self.wakers.pop(key, None)

    async def secret_value(self, namespace: str, name: str, key: str, ttl: float = 5.0) -> str | None:
        """A Secret key, cached for a few seconds (many jobs often share one task-app Secret)."""
        cache_key = (namespace, name, key)
        hit = self._secret_cache.get(cache_key)
        if hit and time.monotonic() - hit[0] < ttl:
            return hit[1]
        value = await self.kube.read_secret_key(namespace, name, key)
        self._secret_cache[cache_key] = (time.monotonic(), value)
        return value


def runtime_of(memo: Any) -> Runtime:
    return memo.runtime  # set by the startup handler in controller/main.py
