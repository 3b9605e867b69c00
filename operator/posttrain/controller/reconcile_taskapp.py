"""The reconcile loop of one TaskApp: its Deployment and Service when it is deployed from an image, then a
check of its URL with its key; status.verified/url/taskInfo and the condition Verified say how that went.
A healthy task app is checked again every periodSeconds; a failing one with backoff until timeoutSeconds,
and an outage of a task app that was verified flips the condition at once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import kopf

from posttrain.api.resources import DEFAULT_API_KEY_SECRET_KEY
from posttrain.controller.apply import (
    Applied,
    ChildRefused,
    NotOwned,
    ensure_children,
    key_of,
    namespace_objects_seen,
    observe,
    snapshot,
    utcnow,
)
from posttrain.controller.bounds import bound_status, event_message
from posttrain.controller.kube import KubeError, object_path
from posttrain.controller.objects import Owner, TaskAppObject, owner_of, parse_task_app
from posttrain.controller.render.taskapp import render_task_app, secrets_of, task_app_service_url
from posttrain.controller.runtime import Runtime
from posttrain.controller.scheduling_policy import check_scheduling, check_task_app_replicas
from posttrain.controller.spec_errors import SpecError, render_failure_message
from posttrain.controller.status import (
    CHILD_NOT_OWNED,
    INVALID_SPEC,
    TASKAPP_VERIFIED,
    Verification,
    get_condition,
    parse_time,
    status_patch,
    taskapp_status,
)
from posttrain.controller.taskapp_resolve import check_task_app, secret_access, unlabelled_secret
from posttrain.controller.tenancy import reach_refusal
from posttrain.controller.verify import Attempt, VerifyPolicy, as_verification


@dataclass
class TaskAppState:
    """Per-TaskApp memory of its loop (lost on restart: the condition's lastTransitionTime carries over)."""

    applied: Applied = field(default_factory=dict)
    verify_started: float | None = None  # wall-clock time the current run of failed checks began
    verified_before: bool = False  # a check passed since: an outage flips the condition at once
    delays: Iterator[float] | None = None  # the backoff of the current run of failed checks


async def _check(
    rt: Runtime, app: TaskAppObject, state: TaskAppState, observed: Any, seen: set[str]
) -> tuple[str, Attempt]:
    """(URL, the check's outcome): its children applied first; a child the API server refuses is the
    outcome (its spec holds a value it cannot take: no check). A deployed task app gets no Secret that is
    not labelled for task apps: then nothing is applied. Before any of that, the namespace's own objects
    (`seen`: as the watches hold them), with the operator's read of the namespace's Secrets: a TaskApp may
    be the first object of its namespace."""
    needs_access = bool(app.spec.image or app.spec.api_key_secret_ref)
    if needs_access and (refused := await secret_access(rt, app.owner.namespace, seen)) is not None:
        return task_app_service_url(app), refused
    if app.spec.image:
        refused = await unlabelled_secret(rt, app.owner.namespace, secrets_of(app))
        if refused is not None:
            return task_app_service_url(app), refused
    try:
        await ensure_children(rt, render_task_app(app, rt.settings), observed, state.applied)
    except ChildRefused as refused:
        return task_app_service_url(app), Attempt(False, INVALID_SPEC, refused.message)
    except NotOwned as conflict:  # an object of someone else's under its Deployment's or Service's name
        return task_app_service_url(app), Attempt(False, CHILD_NOT_OWNED, conflict.message)
    except KubeError as err:  # the reach policy, e.g. the namespace has not opted in (controller/tenancy.py)
        if (refused := reach_refusal(err, app.owner.namespace)) is None:
            raise
        return task_app_service_url(app), Attempt(False, *refused)
    url = task_app_service_url(app)
    secret = app.spec.api_key_secret_ref
    name = secret.name if secret else None
    key = (secret.key if secret else None) or DEFAULT_API_KEY_SECRET_KEY
    policy = VerifyPolicy.from_settings(rt.settings, app.spec.verification)
    return url, await check_task_app(rt, app.owner.namespace, url, name, key, policy)


def _outcome(
    attempt: Attempt, owner: Owner, policy: VerifyPolicy, state: TaskAppState, current: dict[str, Any]
) -> tuple[Verification, float]:
    """(what the status says, seconds to the next check) after one check."""
    now_s = time.time()
    cond = get_condition(current, TASKAPP_VERIFIED)
    if state.verify_started is None:
        unknown = cond and cond.get("status") == "Unknown"
        since = parse_time(cond.get("lastTransitionTime")) if unknown and cond else None
        state.verify_started = since.timestamp() if since else now_s
        state.verified_before = bool(cond and cond.get("status") == "True")
    target = f"TaskApp {owner.name}"
    if attempt.ok:
        state.verified_before = True
        state.delays = None
        return as_verification(attempt, target, state="ok", attempts=1), policy.period_seconds
    if state.delays is None:
        state.delays = policy.delays()
    delay = next(state.delays)
    give_up = (
        state.verified_before  # an outage of a verified task app flips the condition at once
        or not attempt.retryable
        or attempt.reason == CHILD_NOT_OWNED  # waiting does not make it the TaskApp's
        or now_s - state.verify_started + delay > policy.timeout_seconds
    )
    verification = as_verification(attempt, target, state="failed" if give_up else "pending", attempts=1)
    wait = min(delay, policy.period_seconds) if not give_up or state.verified_before else policy.period_seconds
    return verification, wait


async def reconcile_task_app(rt: Runtime, body: Any, indexes: dict[str, Any], state: TaskAppState) -> float:
    """One pass. Returns the seconds until the next check (periodSeconds when healthy, backoff otherwise)."""
    rt.reconciles += 1
    obj = snapshot(body)
    owner = owner_of(obj)
    current = dict(obj.get("status") or {})
    try:
        app = parse_task_app(obj)
        check_scheduling(app.spec.scheduling, rt.settings, job=False)  # controller/scheduling_policy.py
        check_task_app_replicas(app.spec.replicas, rt.settings)
    except SpecError as err:  # the CRD let through what posttrain's models refuse: say so, do not check
        url, policy = str(current.get("url") or ""), VerifyPolicy.from_settings(rt.settings)
        attempt = Attempt(False, INVALID_SPEC, render_failure_message(err))
    else:
        policy = VerifyPolicy.from_settings(rt.settings, app.spec.verification)
        observed = observe(key_of(owner), indexes, owner.uid)
        url, attempt = await _check(rt, app, state, observed, namespace_objects_seen(owner, indexes))
    verification, wait = _outcome(attempt, owner, policy, state, current)
    desired = taskapp_status(owner, current, url, verification, utcnow())
    old = (get_condition(current, TASKAPP_VERIFIED) or {}).get("status")
    new_cond = get_condition(desired, TASKAPP_VERIFIED) or {}
    await _patch(rt, owner, current, desired, old, new_cond)
    return wait


async def _patch(
    rt: Runtime, owner: Owner, current: dict[str, Any], desired: dict[str, Any], old: Any, new: dict[str, Any]
) -> None:
    patch = status_patch(current, bound_status("TaskApp", desired))
    if not patch:
        return
    path = object_path(owner.api_version, "TaskApp", owner.namespace, owner.name) + "/status"
    await rt.kube.merge_patch(path, {"status": patch})
    if new.get("status") != old:
        etype = "Normal" if new.get("status") == "True" else "Warning"
        reason = {"True": "Verified", "False": "VerificationFailed"}.get(new.get("status", ""), "Verifying")
        kopf.event(owner.reference(), type=etype, reason=reason, message=event_message(new.get("message")))
