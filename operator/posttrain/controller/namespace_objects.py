"""The objects the operator makes once per namespace, not per job, owned by nobody (they serve every job
there): its own read of the namespace's Secrets (render/secret_access.py, first: a task app's key is read
right after), the trainer's identity in mode `namespace` (render/identity.py) and the NetworkPolicies of
the namespace's pods (render/network.py). They are server-side applied by the first job or TaskApp of a
namespace that needs them, and again only when the operator's watch of them (controller/children.py, the
namespace's index key) shows one gone (someone deleted it)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from posttrain.controller.kube import Kube
from posttrain.controller.render.identity import render_namespace_identity
from posttrain.controller.render.network import render_fences, render_network_policy
from posttrain.controller.render.secret_access import render_secret_access
from posttrain.controller.settings import OperatorSettings


def render_namespace_objects(namespace: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    identity = render_namespace_identity(namespace, settings) if settings.trainer_identity == "namespace" else []
    ports = {"server_port": settings.server_port, "metrics_port": settings.trainer_metrics_port}
    access = render_secret_access(namespace, settings)
    return [*access, *identity, render_network_policy(namespace, **ports), *render_fences(namespace, settings)]


class NamespaceObjects:
    """The namespaces whose objects this process has applied or seen."""

    def __init__(self, grace: float = 15.0) -> None:
        self.grace = grace  # seconds for our own apply to show up in the watch before applying again
        self.done: dict[str, float] = {}  # namespace -> monotonic time it was applied (0: seen in place)
        self._locks: dict[str, asyncio.Lock] = {}

    def _current(self, namespace: str, wanted: set[str], seen: set[str] | None) -> bool:
        """Whether nothing is to be done: applied a moment ago, or every object is in the watch."""
        if seen is not None and wanted <= seen:
            self.done.setdefault(namespace, 0.0)
            return True
        applied = self.done.get(namespace)
        if applied is None:
            return False
        # applied, and either the caller has no watch to look at or the watch has not caught up yet
        return seen is None or time.monotonic() - applied < self.grace

    async def ensure(
        self, kube: Kube, settings: OperatorSettings, namespace: str, seen: set[str] | None = None
    ) -> int:
        """Apply the namespace's objects that are not in `seen` (what the operator's watches hold,
        "Kind/name"; all of them without a watch to look at), once; returns the writes made."""
        objects = render_namespace_objects(namespace, settings)
        wanted = {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
        if self._current(namespace, wanted, seen):
            return 0
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            if self._current(namespace, wanted, seen):  # another job of the namespace applied them meanwhile
                return 0
            missing = [o for o in objects if seen is None or f"{o['kind']}/{o['metadata']['name']}" not in seen]
            for obj in missing:
                await kube.apply(obj)
            self.done[namespace] = time.monotonic()
            return len(missing)
