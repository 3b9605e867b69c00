"""The per-object reconcile loop (one asyncio task per object, controller/job_loops.py): reconcile, then
sleep until a watch event that changes a decision wakes us (controller/wake.py) or the next pass is due."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from posttrain.controller import metrics
from posttrain.controller.apply import KIND_LABELS, without_original_toml
from posttrain.controller.runtime import Key, Runtime, runtime_of

INDEX_PREFIX = "posttrain_"  # every kopf index of the operator (children.py, taskapp_index.py)

# One pass over (runtime, the object's latest body, the watch indexes, the loop's own state): the seconds to
# the next pass, or None when the object is finished. Each kind's loop brings its own state
# (reconcile_job.JobState, reconcile_taskapp.TaskAppState), made fresh when the loop starts.
Reconcile = Callable[[Runtime, Any, dict[str, Any], Any], Awaitable[float | None]]
NewState = Callable[[], Any]


async def _sleep(wake: asyncio.Event, timeout: float) -> None:
    """Until woken or the timeout (a deleted object's task is cancelled)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(wake.wait(), timeout)


def namespace_terminating(exc: BaseException) -> bool:
    """The API server's refusal to create anything in a namespace that is being deleted (403
    NamespaceTerminating), as opposed to an RBAC denial."""
    return getattr(exc, "status", None) == 403 and (
        "NamespaceTerminating" in str(exc) or "because it is being terminated" in str(exc)
    )


async def run_loop(
    reconcile: Reconcile,
    new_state: NewState,
    *,
    rt: Runtime,
    key: Key,
    uid: str,
    logger: logging.Logger | logging.LoggerAdapter,
    indexes: dict[str, Any],
) -> None:
    """Passes over the object's latest body (rt.loops) until it is finished or gone."""
    wake = rt.waker(key)
    state = new_state()
    failures = 0
    try:
        while (body := rt.loops.body(key, uid)) is not None:
            wake.clear()
            try:
                with metrics.reconcile_pass(key[1]):
                    wait = await reconcile(rt, body, indexes, state)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - never let one bad pass kill the loop
                if namespace_terminating(exc):
                    # the namespace (and with it this object) is being deleted: nothing can be created
                    # there any more; wait for the deletion instead of retrying into refusals
                    logger.info("namespace is being deleted; waiting for the object to go")
                    wait = 10.0
                else:
                    failures += 1
                    wait = min(60.0, 0.5 * 2**failures)
                    logger.warning(f"reconcile failed ({type(exc).__name__}: {exc}); retrying in {wait:.1f}s")
            if wait is None:
                logger.info("finished; the loop stops (a restart re-checks the cleanup once)")
                return
            await _sleep(wake, wait)
            await asyncio.sleep(rt.settings.debounce_seconds)
    finally:
        rt.drop(key, wake)


def on_event(
    reconcile: Reconcile,
    new_state: NewState,
    event_type: str | None,
    body: Any,
    memo: Any,
    logger: Any,
    indexes: dict[str, Any],
) -> None:
    """A watch event of an RLJob, SFTJob or TaskApp: start its loop, or wake it when the event changes a
    decision."""
    rt = runtime_of(memo)
    # kopf's handler kwargs hold its indexes (all named posttrain_*) and views of this event's whole body
    # (spec, meta, raw event): keep only the indexes, since the loop started here holds them for its life
    # (with the body, 5,000 jobs of a 256 KiB originalToml held 2.5 GiB).
    indexes = {name: index for name, index in indexes.items() if name.startswith(INDEX_PREFIX)}
    if rt.children is not None:  # the children's indexes (controller/child_watch.py) beside kopf's
        indexes = {**indexes, **rt.children.indexes}
    raw = without_original_toml(dict(body))  # up to 256 KiB a job: read again when the job's Secret is made
    meta = raw["metadata"]
    key: Key = (meta["namespace"], KIND_LABELS[raw["kind"]], meta["name"])

    def start() -> Any:
        return run_loop(reconcile, new_state, rt=rt, key=key, uid=meta.get("uid") or "", logger=logger, indexes=indexes)

    if rt.loops.seen(key, event_type, raw, start):
        rt.wake(key)
