"""kopf glue for TaskApp: one loop per task app that deploys it (spec.image), verifies it, and re-verifies
it every spec.verification.periodSeconds; an outage flips condition Verified to False."""

from __future__ import annotations

from typing import Any

import kopf

from posttrain.api.resources import GROUP, VERSION
from posttrain.controller.loop import run_loop
from posttrain.controller.reconcile_taskapp import reconcile_task_app
from posttrain.controller.runtime import runtime_of


@kopf.daemon(GROUP, VERSION, "taskapps", cancellation_timeout=2.0)
async def taskapp_loop(body: Any, memo: Any, stopped: Any, logger: Any, **kwargs: Any) -> None:
    await run_loop(reconcile_task_app, body=body, memo=memo, stopped=stopped, logger=logger, indexes=kwargs)


@kopf.on.event(GROUP, VERSION, "taskapps")
async def taskapp_changed(meta: Any, memo: Any, **_: Any) -> None:
    # Our own status patches arrive here too; only a new generation (a spec change) re-verifies at once.
    rt = runtime_of(memo)
    key = (meta["namespace"], "taskapp", meta["name"])
    if rt.generations.get(key) != meta.get("generation"):
        rt.generations[key] = meta.get("generation")
        rt.wake(key)
