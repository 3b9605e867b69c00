"""Fair shares of the operator's task-app checks. Every check goes through one HTTP client (one connection
pool, controller/verify.py); without a cap, one namespace's hanging task apps (120 TaskApps whose /health
never answers) hold every connection until their deadlines and every other namespace's verification waits
behind them. Here a check first takes a slot of its namespace (at most settings.check_slots_per_namespace
at once) and one of its (namespace, host) (at most settings.check_slots_per_host: one namespace cannot
aim all its checks at one host, and no namespace can use up a host's slots for another's checks). A check
that finds no free slot within its deadline fails like an unreachable task app (retried with backoff):
only the namespace that floods waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class _Counted:
    """A semaphore and how many hold or wait for it (dropped at zero: no key lives on unused)."""

    def __init__(self, size: int) -> None:
        self.semaphore = asyncio.Semaphore(size)
        self.users = 0


class NoSlot(Exception):
    """No free check slot within the wait."""

    def __init__(self, what: str, size: int) -> None:
        super().__init__(f"no free task-app check slot for {what} (at most {size} at once)")


def host_of(url: str) -> str:
    """host[:port] of a URL, lower case, without user info."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    return f"{host}:{parts.port}" if parts.port else host


class CheckSlots:
    def __init__(self, per_namespace: int = 8, per_host: int = 4) -> None:
        self.per_namespace = max(1, per_namespace)
        self.per_host = max(1, per_host)
        self._slots: dict[tuple[str, ...], _Counted] = {}

    def in_use(self, *key: str) -> int:
        """How many checks hold or wait for the slots of `key` ((namespace,) or (namespace, host))."""
        slot = self._slots.get(key)
        return slot.users if slot else 0

    @contextlib.asynccontextmanager
    async def _one(self, key: tuple[str, ...], size: int, wait: float, what: str) -> AsyncIterator[None]:
        slot = self._slots.setdefault(key, _Counted(size))
        slot.users += 1
        try:
            try:
                async with asyncio.timeout(wait):
                    await slot.semaphore.acquire()
            except TimeoutError:
                raise NoSlot(what, size) from None
            try:
                yield
            finally:
                slot.semaphore.release()
        finally:
            slot.users -= 1
            if slot.users == 0 and self._slots.get(key) is slot:
                del self._slots[key]

    @contextlib.asynccontextmanager
    async def slot(self, namespace: str, url: str, wait: float) -> AsyncIterator[None]:
        """Hold a slot of the namespace and one of (namespace, host) for one check; NoSlot after `wait` s."""
        host = host_of(url)
        async with (
            self._one((namespace,), self.per_namespace, wait, f"namespace {namespace}"),
            self._one((namespace, host), self.per_host, wait, f"host {host} from {namespace}"),
        ):
            yield
