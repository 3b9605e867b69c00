"""A job's loop task does not keep the watch event that started it: kopf's per-event context (its cause
holds the whole body, originalToml included) stays out of the loop's context; what kopf.event needs stays."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any

from kopf._cogs.clients.auth import vault_var
from kopf._core.actions.execution import cause_var, handler_var
from kopf._core.engines.posting import event_queue_loop_var, event_queue_var, settings_var
from posttrain.controller.job_loops import LOOP_CONTEXT_VARS, JobLoops, loop_context


class Body(dict):
    """A dict that can be weakly referenced: the test asks whether anything still holds it."""


def test_the_kept_variables_are_kopfs_own_names() -> None:
    # a kopf upgrade that renames them would make kopf.event fail in every loop (LookupError)
    assert {v.name for v in (settings_var, event_queue_var, event_queue_loop_var, vault_var)} == LOOP_CONTEXT_VARS


def test_loop_context_keeps_posting_and_drops_the_cause() -> None:
    parent = contextvars.Context()
    parent.run(settings_var.set, "settings")
    parent.run(event_queue_var.set, "queue")
    parent.run(cause_var.set, {"spec": {"originalToml": "x" * 1000}})
    parent.run(handler_var.set, "handler")
    ctx = loop_context(parent)
    assert ctx.get(settings_var) == "settings" and ctx.get(event_queue_var) == "queue"
    assert cause_var not in ctx and handler_var not in ctx


def test_a_started_loop_does_not_keep_the_event_body_alive() -> None:
    async def scenario() -> tuple[Any, Any, bool]:
        loops = JobLoops()
        started = asyncio.Event()
        release = asyncio.Event()
        seen_inside: dict[str, Any] = {}

        async def loop_body() -> None:
            seen_inside["settings"] = settings_var.get(None)
            seen_inside["cause"] = cause_var.get(None)
            started.set()
            await release.wait()

        held = [Body(metadata={"uid": "u1", "generation": 1}, spec={"originalToml": "x" * 4096})]
        alive = weakref.ref(held[0])

        def on_event() -> None:  # what kopf does: the handler runs with the cause in its context
            cause_var.set(held[0])  # type: ignore[arg-type]
            settings_var.set("settings")  # type: ignore[arg-type]
            loops.seen(("ns", "rljob", "a"), "ADDED", {"metadata": {"uid": "u1", "generation": 1}}, loop_body)

        contextvars.copy_context().run(on_event)
        await started.wait()
        held.clear()
        gc.collect()
        still = alive() is not None
        release.set()
        await asyncio.gather(*loops.tasks.values())
        return seen_inside["settings"], seen_inside["cause"], still

    settings, cause, body_alive = asyncio.run(scenario())
    assert settings == "settings"  # kopf.event still finds its settings inside the loop
    assert cause is None
    assert not body_alive, "the loop task's context still holds the event's body"
