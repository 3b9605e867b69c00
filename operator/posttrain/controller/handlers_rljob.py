"""kopf glue for RLJob: its watch events start and wake one reconcile loop per job (an asyncio task, no
finalizer). The loop lives in controller/loop.py, the logic in controller/reconcile_job.py."""

from __future__ import annotations

from typing import Any

import kopf

from posttrain.api.resources import GROUP, VERSION
from posttrain.controller.loop import on_event
from posttrain.controller.reconcile_job import JobState, reconcile_job


@kopf.on.event(GROUP, VERSION, "rljobs")
async def rljob_event(type: Any, body: Any, memo: Any, logger: Any, **kwargs: Any) -> None:
    on_event(reconcile_job, JobState, type, body, memo, logger, kwargs)
