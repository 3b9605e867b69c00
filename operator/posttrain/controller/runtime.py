"""What every handler shares inside one operator process: settings, the API client, the one HTTP client for
task apps with its check cache, and the wake-up events that let a child's watch event re-run its parent's
reconcile loop at once (instead of on the next resync)."""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from posttrain.api.resources import LABEL_USE, USE_TASK_APP_KEY
from posttrain.controller import metrics
from posttrain.controller.fairness import CheckSlots, NoSlot
from posttrain.controller.job_loops import JobLoops
from posttrain.controller.kube import Kube
from posttrain.controller.namespace_objects import NamespaceObjects
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.verify import UNREACHABLE, Attempt, TaskAppProber
from posttrain.controller.verify_cache import CheckKey, TtlCache

Key = tuple[str, str, str]  # (namespace, kind label: rljob|sftjob|taskapp, name)


def namespace_objects_key(namespace: str) -> Key:
    """The index key of a namespace's own objects (controller/namespace_objects.py), which belong to no job."""
    return (namespace, "namespace", "")


@dataclass(frozen=True)
class SecretKey:
    """One key of a Secret as read by the operator: its value and the Secret's resourceVersion."""

    value: str | None
    version: str | None
    labels: dict[str, str] | None = None  # None: the Secret is absent


@dataclass
class Runtime:
    settings: OperatorSettings
    kube: Kube
    wakers: dict[Key, asyncio.Event] = field(default_factory=dict)
    _secret_cache: dict[tuple[str, str, str], tuple[float, SecretKey]] = field(default_factory=dict)
    reconciles: int = 0
    loops: JobLoops = field(default_factory=JobLoops)
    # one pool for every task-app check; CheckSlots shares it out fairly between namespaces
    prober: TaskAppProber = field(default_factory=lambda: TaskAppProber(max_connections=256))
    slots: CheckSlots = field(default_factory=CheckSlots)
    checks: TtlCache[Attempt] = field(default_factory=TtlCache)
    namespace_objects: NamespaceObjects = field(default_factory=NamespaceObjects)
    children: Any = None  # controller/child_watch.py's ChildWatches, started by the startup handler
    # the key of every job's rollout token (controller/token_key.py; set by the startup handler)
    token_key: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    metrics_server: Any = None  # controller/metrics.py's HTTP server, started by the startup handler

    def waker(self, key: Key) -> asyncio.Event:
        """A new loop's wake-up event (replacing a cancelled loop's, of an object of the same name)."""
        self.wakers[key] = asyncio.Event()
        return self.wakers[key]

    def wake(self, key: Key) -> None:
        event = self.wakers.get(key)
        if event is not None:
            event.set()

    def drop(self, key: Key, event: asyncio.Event) -> None:
        """Forget a loop's wake-up event, unless a new loop (an object made again under the same name) has
        it already."""
        if self.wakers.get(key) is event:
            del self.wakers[key]

    async def close(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        await self.loops.stop()
        if self.children is not None:
            await self.children.stop()
        await self.prober.close()
        await self.kube.close()

    async def secret_key(self, namespace: str, name: str, key: str, ttl: float = 5.0) -> SecretKey:
        """A task app's key and the Secret's resourceVersion, cached for a few seconds (many jobs often
        share one task-app Secret). Its data is read only when its metadata says it is labelled
        posttrain.dev/use=task-app-key; otherwise the SecretKey has its labels and no value or version."""
        cache_key = (namespace, name, key)
        hit = self._secret_cache.get(cache_key)
        if hit and time.monotonic() - hit[0] < ttl:
            return hit[1]
        labels = await self.kube.secret_labels(namespace, name)
        if labels is None or labels.get(LABEL_USE) != USE_TASK_APP_KEY:
            found = SecretKey(None, None, labels)
        else:
            value, version, labels = await self.kube.read_secret_key(namespace, name, key)
            found = SecretKey(value, version, labels)
        self._secret_cache[cache_key] = (time.monotonic(), found)
        return found

    async def check_task_app(
        self,
        url: str,
        api_key: str | None,
        *,
        namespace: str,
        secret: tuple[str, str, str] | None,
        secret_version: str | None,
        deadline: float,
        ttl: float,
        failure_ttl: float,
    ) -> Attempt:
        """One check of a task app, shared by everyone asking about the same URL and Secret version within
        `ttl` seconds (`failure_ttl` for a failed check, so that a retry after a backoff sees a new one),
        within the namespace's share of checks (controller/fairness.py)."""
        # a check without a key is shared within its namespace only: another namespace's flood of the same
        # URL must not decide this one's result
        key = CheckKey(url.rstrip("/"), secret or (namespace, "", ""), secret_version, deadline)

        async def fair_check() -> Attempt:
            try:
                async with self.slots.slot(namespace, url, wait=deadline):
                    return await metrics.timed_check(lambda: self.prober.check(url, api_key, deadline=deadline))
            except NoSlot as busy:
                return Attempt(False, UNREACHABLE, f"{busy}; retrying")

        return await self.checks.get(key, lambda attempt: ttl if attempt.ok else failure_ttl, fair_check)


def runtime_of(memo: Any) -> Any:
    return memo.runtime  # set by the startup handler in controller/main.py
