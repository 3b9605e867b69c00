"""The per-object reconcile loop that the kopf daemons of each kind run: reconcile, then sleep until a
watch event wakes us (the object or one of its children changed) or the resync interval passes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from posttrain.controller.reconcile import KIND_LABELS, LoopState
from posttrain.controller.runtime import Key, Runtime, runtime_of

Reconcile = Callable[[Runtime, Any, dict[str, Any], LoopState], Awaitable[float | None]]


async def _sleep(wake: asyncio.Event, stopped: Any, timeout: float) -> None:
    """Until woken, stopped (the object is going, or the operator), or the timeout."""
    waiters = [asyncio.ensure_future(wake.wait())]
    if hasattr(stopped, "wait"):
        waiters.append(asyncio.ensure_future(stopped.wait()))
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.gather(*waiters, return_exceptions=True)


def namespace_terminating(exc: BaseException) -> bool:
    """The API server's refusal to create anything in a namespace that is being deleted (403
    NamespaceTerminating), as opposed to an RBAC denial."""
    return getattr(exc, "status", None) == 403 and (
        "NamespaceTerminating" in str(exc) or "because it is being terminated" in str(exc)
    )


async def run_loop(
    reconcile: Reconcile,
    *,
    body: Any,
    memo: Any,
    stopped: Any,
    logger: logging.Logger | logging.LoggerAdapter,
    indexes: dict[str, Any],
) -> None:
    rt = runtime_of(memo)
    meta = body["metadata"]
    key: Key = (meta["namespace"], KIND_LABELS[body["kind"]], meta["name"])
    wake = rt.waker(key)
    state = LoopState()
    failures = 0
    try:
        while not stopped:
            wake.clear()
            try:
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
            await _sleep(wake, stopped, wait)
            await asyncio.sleep(rt.settings.debounce_seconds)
    finally:
        rt.drop(key)
