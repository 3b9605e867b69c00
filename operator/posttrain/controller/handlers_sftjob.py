"""kopf glue for SFTJob: one reconcile loop (a kopf daemon) per job, woken by the job's and its children's
watch events. The loop lives in controller/loop.py, the logic in controller/reconcile.py."""

from __future__ import annotations

from typing import Any

import kopf

from posttrain.api.resources import GROUP, VERSION
from posttrain.controller.loop import run_loop
from posttrain.controller.reconcile import reconcile_job
from posttrain.controller.runtime import runtime_of


@kopf.daemon(GROUP, VERSION, "sftjobs", cancellation_timeout=2.0)
async def sftjob_loop(body: Any, memo: Any, stopped: Any, logger: Any, **kwargs: Any) -> None:
    await run_loop(reconcile_job, body=body, memo=memo, stopped=stopped, logger=logger, indexes=kwargs)


@kopf.on.event(GROUP, VERSION, "sftjobs")
async def sftjob_changed(meta: Any, memo: Any, **_: Any) -> None:
    runtime_of(memo).wake((meta["namespace"], "sftjob", meta["name"]))
