"""One task-app check per (URL, Secret resourceVersion), shared by every job and TaskApp that asks within a
short time: fifty RLJobs against one task app cost one check, not fifty, and concurrent askers wait for
the check already in flight instead of starting their own. The key's value is never part of the cache
key; a new resourceVersion (the Secret was rotated) is a new entry."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class CheckKey:
    url: str
    secret: tuple[str, str, str] | None  # (namespace, name, key) of the API key, None without one
    secret_version: str | None  # the Secret's resourceVersion
    deadline: float


@dataclass
class TtlCache(Generic[T]):
    """Results kept for a caller-chosen time; one computation per key at a time."""

    clock: Callable[[], float] = time.monotonic
    max_entries: int = 4096
    _done: dict[CheckKey, tuple[float, T]] = field(default_factory=dict)
    _running: dict[CheckKey, asyncio.Future[T]] = field(default_factory=dict)
    computed: int = 0

    async def get(
        self, key: CheckKey, ttl: float | Callable[[T], float], compute: Callable[[], Awaitable[T]]
    ) -> T:
        """The value for `key` computed less than `ttl` seconds ago (`ttl` may depend on the value), or a
        new one; callers asking while it is being computed share that computation."""
        now = self.clock()
        hit = self._done.get(key)
        if hit is not None and now - hit[0] < (ttl(hit[1]) if callable(ttl) else ttl):
            return hit[1]
        running = self._running.get(key)
        if running is not None:
            return await asyncio.shield(running)
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            value = await compute()
        except asyncio.CancelledError:
            future.cancel()
            raise
        except Exception as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning when nobody else waited
            raise
        finally:
            self._running.pop(key, None)
        self.computed += 1
        self._done[key] = (self.clock(), value)
        future.set_result(value)
        if len(self._done) > self.max_entries:
            self._evict()
        return value

    def _evict(self) -> None:
        oldest = sorted(self._done.items(), key=lambda item: item[1][0])
        for key, _ in oldest[: len(oldest) - self.max_entries // 2]:
            del self._done[key]
