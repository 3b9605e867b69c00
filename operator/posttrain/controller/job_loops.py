"""One asyncio task per RLJob, SFTJob and TaskApp, started by the object's first watch event and ended by
its deletion. kopf's per-object daemons would do the same, but a daemon needs a finalizer on every object:
a PATCH to add it, another to remove it, and a deletion that waits for the operator. Nothing here needs
the operator at deletion: the children go with their job by their ownerReferences (the garbage
collector), so a deleted job (kubectl delete, an Argo CD prune) is simply forgotten.

The loop reads its object's latest body from here (each watch event replaces it); only the events that
change a decision (controller/wake.py) wake it before its next resync."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from posttrain.controller.wake import Trigger, object_wakes, trigger_of

Key = tuple[str, str, str]  # (namespace, kind label: rljob|sftjob|taskapp, name)
logger = logging.getLogger(__name__)

# What a loop keeps of the context of the watch event that started it: kopf's Event posting (kopf.event)
# and its API credentials. Not kopf's per-event variables: its cause holds that event's whole body, and a
# task keeps its context for life (5,000 jobs of a 256 KiB originalToml kept 1.25 GiB that way).
LOOP_CONTEXT_VARS = frozenset({"settings_var", "event_queue_var", "event_queue_loop_var", "vault_var"})


def loop_context(parent: contextvars.Context | None = None) -> contextvars.Context:
    """A new context holding only the LOOP_CONTEXT_VARS of `parent` (default: the current context)."""
    context = contextvars.Context()
    for var, value in (parent or contextvars.copy_context()).items():
        if var.name in LOOP_CONTEXT_VARS:
            context.run(var.set, value)
    return context


@dataclass
class JobLoops:
    bodies: dict[Key, dict[str, Any]] = field(default_factory=dict)
    triggers: dict[Key, Trigger] = field(default_factory=dict)
    tasks: dict[Key, asyncio.Task[Any]] = field(default_factory=dict)
    finished: dict[Key, str] = field(default_factory=dict)  # uid of an object whose loop ended (terminal)

    def body(self, key: Key, uid: str) -> dict[str, Any] | None:
        """The object's latest body; None once it is deleted (or replaced by another of the same name)."""
        body = self.bodies.get(key)
        if body is None or (body.get("metadata") or {}).get("uid") != uid:
            return None
        return body

    def seen(
        self, key: Key, event_type: str | None, body: dict[str, Any], start: Callable[[], Coroutine[Any, Any, Any]]
    ) -> bool:
        """Record one watch event; start the object's loop if none runs. True when a running loop should
        be woken (controller/wake.py)."""
        if event_type == "DELETED":
            self.forget(key)
            return False
        trigger = trigger_of(body)
        previous = self.triggers.get(key)
        if previous is not None and previous.uid != trigger.uid:  # deleted and made again, same name
            self.forget(key)
            previous = None
        self.bodies[key] = body
        self.triggers[key] = trigger
        task = self.tasks.get(key)
        if task is not None and not task.done():
            return object_wakes(previous, trigger)
        if self.finished.get(key) == trigger.uid and not object_wakes(previous, trigger):
            return False  # a finished job's own status patches
        self.finished.pop(key, None)
        context = loop_context()  # the done callback, too, would otherwise copy the event's context
        task = asyncio.get_running_loop().create_task(start(), name=f"posttrain loop {'/'.join(key)}", context=context)
        self.tasks[key] = task
        task.add_done_callback(lambda t, k=key, uid=trigger.uid: self._ended(k, uid, t), context=context)
        return False

    def _ended(self, key: Key, uid: str, task: asyncio.Task[Any]) -> None:
        if self.tasks.get(key) is task:
            del self.tasks[key]
        if not task.cancelled() and task.exception() is None and key in self.bodies:
            self.finished[key] = uid

    def forget(self, key: Key) -> None:
        self.bodies.pop(key, None)
        self.triggers.pop(key, None)
        self.finished.pop(key, None)
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        """Cancel every loop (the operator is stopping) and wait for them."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
