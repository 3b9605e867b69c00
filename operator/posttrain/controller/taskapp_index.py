"""kopf glue: an in-memory index of the TaskApps, keyed by (namespace, name), parsed once per watch event.
A job that names a TaskApp reads it here instead of GETting it on every pass, and trusts its Verified
condition: the TaskApp's own loop checks it every periodSeconds, so its jobs need no check of their own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kopf

from posttrain.api.resources import DEFAULT_API_KEY_SECRET_KEY, GROUP, VERSION
from posttrain.controller.objects import TaskAppObject, parse_task_app
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.spec_errors import SpecError
from posttrain.controller.status import TASKAPP_VERIFIED, get_condition

TASKAPP_INDEX = "posttrain_taskapps"


@dataclass(frozen=True)
class TaskAppView:
    app: TaskAppObject | None  # None when its spec cannot be read (`error` says why)
    error: str = ""


def view_verified(app: TaskAppObject) -> bool:
    """The TaskApp's loop verified this generation of it."""
    cond = get_condition(app.status, TASKAPP_VERIFIED) or {}
    return cond.get("status") == "True" and cond.get("observedGeneration") == app.owner.generation


def trusts_the_apps_check(target: TaskAppTarget, app: TaskAppObject) -> bool:
    """A TaskApp's Verified condition speaks for a job only when the job uses the TaskApp's own key: a job
    that names the TaskApp but its own key Secret (a wrong key, another tenant's) checks that key itself."""
    if not view_verified(app):
        return False
    own = app.spec.api_key_secret_ref
    own_key = ((own.name if own else None), (own.key if own else None) or DEFAULT_API_KEY_SECRET_KEY)
    return (target.secret_name, target.secret_key) == own_key


@kopf.index(GROUP, VERSION, "taskapps")
async def posttrain_taskapps(body: Any, meta: Any, **_: Any) -> dict[tuple[str, str], TaskAppView]:
    obj = dict(body)
    try:
        view = TaskAppView(parse_task_app(obj))
    except SpecError as err:
        view = TaskAppView(None, str(err))
    return {(meta["namespace"], meta["name"]): view}
