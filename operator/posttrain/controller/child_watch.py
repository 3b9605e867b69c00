"""The watches of the children whose status changes while a job starts (Deployments, trainer Jobs, their
Services; Pods with settings.watch_pods), kept by the operator itself rather than by kopf. These are
about four in five of the watch events the operator receives, and kopf's processing of one event (a worker
task per object, its memory, loggers, handler machinery and patch application) cost far more than what the
operator needs from it: the few fields of controller/status.py's observations. Here an event is one JSON
decode and a dict update. kopf still watches the jobs, the TaskApps and the objects made once per
namespace (controller/children.py).

Like kopf's indexes, the first LIST of every kind completes before the operator's handlers run (the
startup handler in controller/main.py awaits start()), so a restarted operator sees the children it made
before and never creates them twice. A watch resumes from its last resourceVersion (bookmarks keep it
fresh); a 410 Gone, or any failure, lists again and replaces the kind's index. An event wakes its job's
loop only when the job's decision may change (controller/wake.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.controller import metrics
from posttrain.controller.kube import Kube
from posttrain.controller.status import DeploymentObs, PodObs, TrainerObs
from posttrain.controller.wake import child_wakes, pod_wakes

Key = tuple[str, str, str]  # (namespace, parent kind label, parent name)
logger = logging.getLogger(__name__)
WATCH_SECONDS = 240  # the API server ends a watch after this long; it is resumed at once


@dataclass(frozen=True)
class ChildKind:
    index: str  # the name observe() reads it by (controller/apply.py)
    api_version: str
    plural: str
    observe: Callable[[dict[str, Any]], Any]  # object -> what the index keeps
    wakes: Callable[[Any, Any], bool] | None  # (previous, current) -> wake the job's loop?
    owned: bool = True  # only objects whose controlling owner is the job its labels name (not pods)


def _service_name(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["name"])


DEPLOYMENTS = ChildKind(
    "posttrain_deployments", "apps/v1", "deployments", DeploymentObs.from_object, child_wakes
)
JOBS = ChildKind("posttrain_jobs", "batch/v1", "jobs", TrainerObs.from_object, child_wakes)
SERVICES = ChildKind("posttrain_services", "v1", "services", _service_name, None)
PDBS = ChildKind("posttrain_pdbs", "policy/v1", "poddisruptionbudgets", _service_name, None)
PODS = ChildKind("posttrain_pods", "v1", "pods", PodObs.from_object, pod_wakes, owned=False)


def owned_by_parent(meta: dict[str, Any], key: Key) -> bool:
    """Whether the object's controlling owner is the job its labels name: an object that only carries the
    operator's labels is not the job's (the operator never adopts what it does not own)."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("name") == key[2]:
            return True
    return False


def kinds_for(watch_pods: bool) -> tuple[ChildKind, ...]:
    return (DEPLOYMENTS, JOBS, SERVICES, PDBS, *((PODS,) if watch_pods else ()))


class ChildIndex(dict[Key, list[Any]]):
    """One kind's index: parent key -> what is observed of each child (the shape of a kopf index)."""


class ChildWatches:
    """The children's indexes (`indexes[kind.index][parent key]`) and the tasks that keep them current."""

    def __init__(
        self,
        kube: Kube,
        *,
        kinds: tuple[ChildKind, ...],
        namespaces: list[str],
        selector: str,
        parent_key: Callable[[dict[str, Any]], Key | None],
        wake: Callable[[Key], None],
    ) -> None:
        self.kube = kube
        self.kinds = kinds
        self.namespaces = namespaces or [""]  # "": every namespace
        self.selector = selector
        self.parent_key = parent_key
        self.wake = wake
        self.indexes: dict[str, ChildIndex] = {kind.index: ChildIndex() for kind in kinds}
        # (kind index, namespace of the watch) -> uid -> (parent key, observation)
        self._objects: dict[tuple[str, str], dict[str, tuple[Key, Any]]] = {}
        self._tasks: list[asyncio.Task[Any]] = []

    def _path(self, kind: ChildKind, namespace: str) -> str:
        base = "/api/v1" if kind.api_version == "v1" else f"/apis/{kind.api_version}"
        return f"{base}/namespaces/{namespace}/{kind.plural}" if namespace else f"{base}/{kind.plural}"

    async def start(self) -> None:
        """List every kind (the indexes are complete when this returns), then watch each."""
        versions = await asyncio.gather(*(self._list(k, ns) for k in self.kinds for ns in self.namespaces))
        pairs = [(k, ns) for k in self.kinds for ns in self.namespaces]
        loop = asyncio.get_running_loop()
        for (kind, namespace), version in zip(pairs, versions, strict=True):
            name = f"posttrain watch {kind.plural} {namespace or '*'}"
            self._tasks.append(loop.create_task(self._watch(kind, namespace, version), name=name))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()

    def _key(self, kind: ChildKind, meta: dict[str, Any]) -> Key | None:
        key = self.parent_key(meta)
        if key is not None and kind.owned and not owned_by_parent(meta, key):
            return None
        return key

    async def _list(self, kind: ChildKind, namespace: str) -> str:
        found = await self.kube.request(
            "GET", self._path(kind, namespace), params={"labelSelector": self.selector}
        )
        found = found or {}
        fresh: dict[str, tuple[Key, Any]] = {}
        for obj in found.get("items") or []:
            key = self._key(kind, obj.get("metadata") or {})
            if key is not None:
                fresh[obj["metadata"]["uid"]] = (key, kind.observe(obj))
        old = self._objects.pop((kind.index, namespace), {})
        previous = dict(old)
        for uid in list(old):
            self._remove(kind, namespace, uid, old)
        for uid, (key, obs) in fresh.items():
            self._put(kind, namespace, uid, key, obs, previous.get(uid))
        if kind.owned:  # children gone while the watch was down (missed DELETED events)
            for key in {previous[uid][0] for uid in previous if uid not in fresh}:
                self.wake(key)
        return str((found.get("metadata") or {}).get("resourceVersion") or "")

    def _remove(self, kind: ChildKind, namespace: str, uid: str, objects: dict[str, tuple[Key, Any]]) -> None:
        key, obs = objects.pop(uid)
        entries = self.indexes[kind.index].get(key)
        if entries is not None:
            with contextlib.suppress(ValueError):
                entries.remove(obs)
            if not entries:
                del self.indexes[kind.index][key]

    def _put(
        self, kind: ChildKind, namespace: str, uid: str, key: Key, obs: Any, previous: tuple[Key, Any] | None
    ) -> None:
        objects = self._objects.setdefault((kind.index, namespace), {})
        before = previous[1] if previous is not None and previous[0] == key else None
        if uid in objects:
            self._remove(kind, namespace, uid, objects)
        objects[uid] = (key, obs)
        self.indexes[kind.index].setdefault(key, []).append(obs)
        if kind.wakes is not None and kind.wakes(before, obs):
            self.wake(key)

    def _event(self, kind: ChildKind, namespace: str, event: dict[str, Any]) -> str | None:
        """Apply one watch event; returns its resourceVersion (None: list again)."""
        kind_of_event = event.get("type")
        obj = event.get("object") or {}
        meta = obj.get("metadata") or {}
        if kind_of_event == "ERROR":
            return None  # e.g. 410 Gone: the resourceVersion is too old
        objects = self._objects.setdefault((kind.index, namespace), {})
        uid = meta.get("uid")
        if kind_of_event in ("ADDED", "MODIFIED") and uid:
            key = self._key(kind, meta)
            if key is None:
                if uid in objects:
                    self._remove(kind, namespace, uid, objects)
            else:
                self._put(kind, namespace, uid, key, kind.observe(obj), objects.get(uid))
        elif kind_of_event == "DELETED" and uid in objects:
            key = objects[uid][0]
            self._remove(kind, namespace, uid, objects)
            if kind.owned:  # someone deleted a child under a running job: its loop makes it again now
                self.wake(key)
        return str(meta.get("resourceVersion") or "")

    async def _watch(self, kind: ChildKind, namespace: str, version: str) -> None:
        path = self._path(kind, namespace)
        failures = 0
        while True:
            try:
                if not version:
                    version = await self._list(kind, namespace)
                params = {"labelSelector": self.selector, "resourceVersion": version,
                          "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_SECONDS)}  # fmt: skip
                async for event in self.kube.watch(path, params):
                    seen = self._event(kind, namespace, event)
                    if seen is None:
                        version = ""
                        break
                    version = seen or version
                failures = 0
            except asyncio.CancelledError:
                raise
            except TimeoutError:  # silent for kube.watch_idle: a dropped connection; resume on a new one
                logger.info("watch of %s silent for %.0fs; resuming it", kind.plural, self.kube.watch_idle)
                failures = 0
            except Exception as exc:  # any failure: a dead watch would leave its jobs blind, so list again
                failures += 1
                metrics.watch_restarted(kind.plural)
                version = ""  # list again: events may have been missed
                wait = min(30.0, 0.5 * 2**failures)
                logger.warning("watch of %s failed (%s: %s); listing again in %.1fs", kind.plural,
                               type(exc).__name__, exc, wait)  # fmt: skip
                await asyncio.sleep(wait)
