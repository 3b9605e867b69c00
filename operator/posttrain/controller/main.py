"""The operator process: kopf settings (watch events and indexes only: no finalizer, no annotations, Events
on), the shared Runtime, and the entry point used by `posttrain operator` and the operator Deployment."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import kopf

from posttrain.controller import (  # noqa: F401 - importing registers the handlers
    children,
    handlers_rljob,
    handlers_sftjob,
    handlers_taskapp,
    metrics,
    taskapp_index,
)
from posttrain.controller.api_server_endpoints import api_server_endpoints
from posttrain.controller.child_watch import ChildWatches, kinds_for
from posttrain.controller.children import CHILD_SELECTOR, KOPF_WATCHED, kopf_selector, parent_key
from posttrain.controller.fairness import CheckSlots
from posttrain.controller.heap import release_large_blocks
from posttrain.controller.kube import Kube, is_own_session
from posttrain.controller.leader import Leadership
from posttrain.controller.runtime import Runtime
from posttrain.controller.safejson import install_kopf_hook
from posttrain.controller.settings import ANNOTATION_PREFIX, FINALIZER, OperatorSettings, load_settings
from posttrain.controller.token_key import load_token_key, own_namespace
from posttrain.controller.trainer_identity import resolve_trainer_identity
from posttrain.controller.verify import TaskAppProber, api_server_addresses, policy_from_settings

logger = logging.getLogger("posttrain.operator")
_CONFIG: dict[str, Any] = {}  # set by run() before kopf starts: settings, kubeconfig


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf computes every event's diff against a last-handled state for change-detecting handlers
    (on.create/update/delete); the operator has none (watch events and indexes only), so that diff, a
    copy of every object on every event, would be thrown away."""

    def build(self, *, body: Any, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: Any) -> Any:
        return None

    def store(self, *, body: Any, patch: Any, essence: Any) -> None:
        return None


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # kopf stores nothing on the objects: no handler needs a finalizer or a last-handled state. Naming our
    # finalizer lets kopf remove it from objects an older operator (with daemons) had marked.
    settings.persistence.finalizer = FINALIZER
    release_large_blocks()  # every job's body (up to 256 KiB of TOML) is freed again at once: give its pages back
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = NoDiffBase()
    settings.posting.level = logging.INFO  # our kopf.event() calls: one Event per phase transition
    settings.posting.loggers = False  # handler log lines are not Events (API load)
    # The API server filters the watches: events of objects the operator did not make never reach this
    # process (kopf's own label filters would only drop them here).
    for group_version, plural in KOPF_WATCHED:
        settings.watching.label_selectors[group_version, plural] = kopf_selector()
    settings.networking.error_backoffs = [0.5, 1, 2, 3, 5, 8]
    # kopf's per-object worker keeps the last event (the whole body, originalToml included) until it has
    # been idle this long; our handlers only hand the event to the object's loop, so a worker is cheap to
    # make again. The initial listing comes in chunks, never as one response of every job's body.
    settings.queueing.idle_timeout = 5.0
    settings.watching.chunk_size = 100
    op_settings: OperatorSettings = _CONFIG.get("settings") or load_settings()
    # Watches end on the server's side every few minutes and are resumed; a watch silent for longer than
    # watch_idle_seconds (no event, no bookmark) is taken for a dropped connection and made again, and no
    # request waits longer than the API timeout: the operator's view never freezes on a dead connection.
    idle, api_timeout = op_settings.watch_idle_seconds, op_settings.api_timeout_seconds
    settings.watching.server_timeout = int(min(270, max(1, idle * 3)))  # the API server takes an integer
    settings.watching.client_timeout = settings.watching.server_timeout + idle
    settings.watching.inactivity_timeout = idle
    settings.watching.connect_timeout = api_timeout
    settings.networking.connect_timeout = api_timeout
    settings.networking.request_timeout = api_timeout * 2
    kube = Kube.from_env(_CONFIG.get("kubeconfig"))
    kube.read_timeout, kube.watch_idle = api_timeout, idle
    op_settings = await resolve_trainer_identity(kube, op_settings)
    if not op_settings.api_server_addresses:  # never a task app's address (posttrain.api.urls)
        found = await api_server_addresses(kube.host)
        found += [a for a in await api_server_endpoints(kube) if a not in found]  # behind the ClusterIP
        op_settings = op_settings.model_copy(update={"api_server_addresses": ",".join(found)})
    prober = TaskAppProber(addresses=policy_from_settings(op_settings), max_connections=256)
    runtime = Runtime(settings=op_settings, kube=kube, prober=prober)
    runtime.token_key = await load_token_key(kube, op_settings)
    runtime.slots = CheckSlots(op_settings.check_slots_per_namespace, op_settings.check_slots_per_host)
    namespaces = list(_CONFIG.get("namespaces") or [])
    runtime.children = ChildWatches(kube, kinds=kinds_for(op_settings.watch_pods), namespaces=namespaces,
                                    selector=CHILD_SELECTOR, parent_key=parent_key, wake=runtime.wake)  # fmt: skip
    await runtime.children.start()  # the children's indexes are complete before any job's loop starts
    memo.runtime = runtime
    metrics.start(runtime)  # /metrics on settings.metrics_port until runtime.close()
    logger.info(
        "posttrain operator: namespaces=%s trainer=%s rollout=%s",
        op_settings.namespace or "<all>",
        op_settings.trainer_image,
        op_settings.rollout_image,
    )


@kopf.on.probe(id="posttrain")
async def probe(memo: Any, **_: Any) -> dict[str, Any]:
    """Served on the liveness endpoint: counters the benchmark reads (API requests, reconcile passes)."""
    runtime = getattr(memo, "runtime", None)
    if runtime is None:
        return {}
    return {
        "operator_requests": dict(runtime.kube.requests),
        "kopf_requests": dict(_KOPF_REQUESTS),
        "reconciles": runtime.reconciles,
        "loops": len(runtime.wakers),
    }


_KOPF_REQUESTS: collections.Counter[str] = collections.Counter()


def count_kopf_requests() -> None:
    """Opt-in (POSTTRAIN_COUNT_KOPF_REQUESTS=1, for the benchmark): count kopf's own API requests (watches,
    finalizer/annotation patches, Events) by wrapping aiohttp's request method (the operator's own client,
    on aiohttp too, is left out: it counts its requests itself)."""
    import aiohttp

    original = aiohttp.ClientSession._request
    if getattr(original, "_posttrain_counted", False):
        return

    async def counted(self: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        if not is_own_session(self):  # the operator's own client counts its requests itself
            _KOPF_REQUESTS[method.upper()] += 1
        return await original(self, method, *args, **kwargs)

    counted._posttrain_counted = True  # type: ignore[attr-defined]
    aiohttp.ClientSession._request = counted  # type: ignore[method-assign]


@kopf.on.cleanup()
async def shutdown(memo: Any, **_: Any) -> None:
    runtime = getattr(memo, "runtime", None)
    if runtime is not None:
        await runtime.close()


async def operate(
    *,
    settings: OperatorSettings | None = None,
    kubeconfig: str | None = None,
    namespaces: tuple[str, ...] | list[str] = (),
    peering: str | None = None,
    priority: int = 0,
    liveness: str | None = None,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | threading.Event | None = None,
) -> None:
    """Run the operator in the current event loop until stop_flag is set (or forever)."""
    settings = settings or load_settings()
    watched = list(namespaces) or [n.strip() for n in settings.namespace.split(",") if n.strip()]
    _CONFIG.update(settings=settings, kubeconfig=kubeconfig, namespaces=watched)
    if settings.count_kopf_requests:
        count_kopf_requests()
    install_kopf_hook()  # no object the API server stores can end kopf's watches (controller/safejson.py)
    leadership = await lead(settings, kubeconfig, liveness) if settings.leader_election else None
    stop_flag = stop_flag or (asyncio.Event() if leadership else None)
    tasks = [asyncio.create_task(leadership.keep()), asyncio.create_task(_stop_when_lost(leadership, stop_flag))] if leadership else []  # fmt: skip
    try:
        await kopf.operator(
            clusterwide=not watched,
            namespaces=watched,
            standalone=peering is None,
            peering_name=peering,  # None: no peering at all (a name makes kopf require the peering CRD)
            priority=priority,
            liveness_endpoint=liveness,
            stop_flag=stop_flag,
            ready_flag=ready_flag,
        )
    finally:
        for task in tasks:
            task.cancel()
        if leadership is not None:
            if not leadership.lost.is_set():
                await leadership.release()
            await leadership.kube.close()
    if leadership is not None and leadership.lost.is_set():
        raise SystemExit(1)


async def lead(settings: OperatorSettings, kubeconfig: str | None, liveness: str | None) -> Leadership:
    """Wait (answering the liveness probe meanwhile: a standby is healthy) until this process holds the Lease."""
    namespace = settings.lease_namespace or own_namespace()
    if not namespace:
        raise SystemExit("leader election needs the Lease's namespace: POSTTRAIN_LEASE_NAMESPACE")
    kube = Kube.from_env(kubeconfig)
    kube.read_timeout = settings.api_timeout_seconds
    leadership = Leadership(kube, namespace, settings.lease_name, lease_seconds=settings.lease_seconds)
    async with standby_liveness(liveness):
        await leadership.acquire()
    return leadership


async def _stop_when_lost(leadership: Leadership, stop_flag: Any) -> None:
    await leadership.lost.wait()
    stop_flag.set()  # kopf stops its handlers and our loops (the cleanup handler) ...
    await asyncio.sleep(leadership.lease_seconds / 3)
    os._exit(1)  # ... or the process goes before a standby may take over


@contextlib.asynccontextmanager
async def standby_liveness(endpoint: str | None) -> AsyncIterator[None]:
    """The liveness endpoint of a process waiting for the Lease (kopf serves it once it runs)."""
    if not endpoint:
        yield
        return
    from aiohttp import web

    parts = urlsplit(endpoint)

    async def alive(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})

    app = web.Application()
    app.router.add_get(parts.path or "/", alive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, parts.hostname or "0.0.0.0", parts.port or 80)
    await site.start()
    try:
        yield
    finally:
        await runner.cleanup()


def run(**kwargs: Any) -> None:
    """Blocking entry point (`posttrain operator`)."""
    asyncio.run(operate(**kwargs))
