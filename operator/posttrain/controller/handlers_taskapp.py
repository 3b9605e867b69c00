"""kopf glue for TaskApp: its watch events start one loop per task app (an asyncio task, no finalizer)
that deploys it (spec.image), verifies it, and re-verifies it every spec.verification.periodSeconds; an
outage flips condition Verified to False. Only a new generation (a spec change) re-verifies at once: our
own status patches do not wake the loop (controller/wake.py)."""

from __future__ import annotations

from typing import Any

import kopf

from posttrain.api.resources import GROUP, VERSION
from posttrain.controller.loop import on_event
from posttrain.controller.reconcile_taskapp import TaskAppState, reconcile_task_app


@kopf.on.event(GROUP, VERSION, "taskapps")
async def taskapp_event(type: Any, body: Any, memo: Any, logger: Any, **kwargs: Any) -> None:
    on_event(reconcile_task_app, TaskAppState, type, body, memo, logger, kwargs)
