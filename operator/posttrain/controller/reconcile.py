"""The reconcile loop of one job or task app: observe (kopf indexes), verify (RLJob), render (pure), apply
what is missing or drifted (server-side apply), derive status (pure), patch what changed, post an Event
per phase transition, and clean up when the job ends. Idempotent: running it twice, or after a restart,
changes nothing that is already right."""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from posttrain.controller import render, specs
from posttrain.controller.kube import object_path
from posttrain.controller.runtime import Key, Runtime
from posttrain.controller.settings import API_VERSION, LABEL_ROLE
from posttrain.controller.status import (
    COND_VERIFIED,
    FAILED,
    PENDING,
    SUCCEEDED,
    TASKAPP_VERIFIED,
    TERMINAL,
    VERIFYING,
    DeploymentObs,
    Expected,
    Observed,
    PodObs,
    TrainerObs,
    Verification,
    derive_status,
    get_condition,
    parse_time,
    status_patch,
    taskapp_status,
)
from posttrain.controller.verify import (
    SECRET_MISSING,
    TASKAPP_MISSING,
    Attempt,
    VerifyPolicy,
    as_verification,
    check_once,
    verify_with_retries,
)

logger = logging.getLogger(__name__)
KIND_LABELS = {"RLJob": "rljob", "SFTJob": "sftjob", "TaskApp": "taskapp"}
SERVER_ROLES = (render.ROLE_ROLLOUT, render.ROLE_REFERENCE, render.ROLE_JUDGE)
APPLY_GRACE = 15.0  # seconds to wait for our own apply to show up in the watch before re-applying


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass
class LoopState:
    """Per-object memory of one reconcile loop (lost on restart, which is fine: it only saves API calls)."""

    applied: dict[tuple[str, str], tuple[dict[str, Any], float]] = field(default_factory=dict)
    last_patch: tuple[dict[str, Any], float] | None = None
    last_phase: str | None = None
    verification: Verification | None = None
    verify_started: float | None = None
    verified_before: bool = False
    delays: Any = None
    target: Any = None
    generation: Any = None
    pruned: set[str] = field(default_factory=set)


def snapshot(body: Any) -> dict[str, Any]:
    return copy.deepcopy(dict(body))


def observe(key: Key, indexes: dict[str, Any]) -> Observed:
    observed = Observed()
    for obs in indexes.get("posttrain_deployments", {}).get(key, []):
        if isinstance(obs, DeploymentObs):
            observed.deployments[obs.name] = obs
    for obs in indexes.get("posttrain_jobs", {}).get(key, []):
        if isinstance(obs, TrainerObs):
            observed.trainer = obs
    for name in indexes.get("posttrain_services", {}).get(key, []):
        observed.others.add(f"Service/{name}")
    for name in indexes.get("posttrain_configmaps", {}).get(key, []):
        observed.others.add(f"ConfigMap/{name}")
    observed.pods = [p for p in indexes.get("posttrain_pods", {}).get(key, []) if isinstance(p, PodObs)]
    return observed


def expected_of(rendered: render.Rendered) -> Expected:
    deployments: dict[str, int] = {}
    others: list[str] = []
    roles: dict[str, str] = {}
    trainer = ""
    for child in rendered.children:
        name = child["metadata"]["name"]
        role = child["metadata"]["labels"][LABEL_ROLE]
        if child["kind"] == "Deployment":
            deployments[name] = child["spec"]["replicas"]
            roles[name] = role
        elif child["kind"] == "Job":
            trainer = name
        elif child["kind"] in render.IDENTITY_KINDS:
            continue
        else:
            others.append(f"{child['kind']}/{name}")
            roles[f"{child['kind']}/{name}"] = f"{child['kind'].lower()} ({role})"
    assert rendered.topology is not None
    return Expected(
        trainer=trainer,
        nodes=rendered.topology.nodes,
        deployments=deployments,
        others=tuple(others),
        roles=roles,
    )


def _observed_state(child: dict[str, Any], observed: Observed) -> dict[str, Any] | None:
    name = child["metadata"]["name"]
    kind = child["kind"]
    if kind == "Deployment":
        dep = observed.deployments.get(name)
        return None if dep is None else {"replicas": dep.replicas}
    if kind == "Job":
        tr = observed.trainer
        if tr is None or tr.name != name:
            return None
        return {"suspend": tr.suspended} if "suspend" in child["spec"] else {}
    return {} if f"{kind}/{name}" in observed.others else None


async def ensure_children(
    rt: Runtime, children: list[dict[str, Any]], observed: Observed, state: LoopState
) -> int:
    """Server-side apply each child that is absent or whose replicas/suspend drifted. Returns how many."""
    now = time.monotonic()
    applied = 0
    for child in children:
        ident = (child["kind"], child["metadata"]["name"])
        if child["kind"] in render.IDENTITY_KINDS:
            # Not watched (no index): made once, in the pass that creates the trainer Job.
            if observed.trainer is not None or ident in state.applied:
                continue
            await rt.kube.apply(child)
            state.applied[ident] = ({}, now)
            applied += 1
            continue
        want = render.desired_state(child)
        have = _observed_state(child, observed)
        recent = state.applied.get(ident)
        if have == want:
            continue
        if recent and recent[0] == want and now - recent[1] < APPLY_GRACE:
            continue  # we applied it a moment ago; the watch has not caught up yet
        await rt.kube.apply(child)
        state.applied[ident] = (want, now)
        applied += 1
    return applied


async def patch_status(
    rt: Runtime, job: dict[str, Any], desired: dict[str, Any], state: LoopState, *, event_kind: str = ""
) -> bool:
    current = job.get("status") or {}
    patch = {k: v for k, v in status_patch(current, desired).items() if k not in state.pruned}
    if not patch:
        return False
    now = time.monotonic()
    if state.last_patch and state.last_patch[0] == patch and now - state.last_patch[1] < 10.0:
        return False
    meta = job["metadata"]
    path = object_path(API_VERSION, job["kind"], meta["namespace"], meta["name"]) + "/status"
    response = await rt.kube.merge_patch(path, {"status": patch})
    state.last_patch = (patch, now)
    if response is not None:
        # A field the CRD's status schema does not declare is pruned by the API server: never chase it.
        written = response.get("status") or {}
        for key in patch:
            if key not in written and patch[key] is not None:
                state.pruned.add(key)
                logger.warning(
                    "status.%s is pruned by the CRD schema of %s; not writing it again", key, job["kind"]
                )
    # Keep the snapshot in line so a second derivation in the same pass starts from what we wrote.
    job.setdefault("status", {}).update(patch)
    old = state.last_phase or current.get("phase") or PENDING
    new = desired.get("phase")
    if new and new != old:
        etype = "Warning" if new == FAILED else "Normal"
        kopf.event(job, type=etype, reason=new, message=str(desired.get("message") or "")[:1000])
    if new:
        state.last_phase = new
    return True


# ----------------------------------------------------------------------------------------------- jobs
async def _resolve_task_app(
    rt: Runtime, job: dict[str, Any]
) -> tuple[render.TaskAppTarget | None, VerifyPolicy, str, Attempt | None]:
    """(target, policy, display name, an Attempt describing why there is no target)."""
    spec = job["spec"]
    ns = job["metadata"]["namespace"]
    ref = specs.section(spec, "taskApp")
    name = ref.get("name")
    policy = VerifyPolicy.from_settings(rt.settings)
    task_app = None
    if name:
        task_app = await rt.kube.get(object_path(API_VERSION, "TaskApp", ns, name))
        if task_app is None:
            return (
                None,
                policy,
                f"TaskApp {name}",
                Attempt(False, TASKAPP_MISSING, f"TaskApp {name} not found"),
            )
        policy = VerifyPolicy.from_settings(rt.settings, (task_app.get("spec") or {}).get("verification"))
    target = render.task_app_target(spec, task_app, ns)
    if target is None:
        display = f"TaskApp {name}" if name else "task app"
        return None, policy, display, Attempt(False, TASKAPP_MISSING, "no task app URL (spec.taskApp)")
    return target, policy, target.display, None


async def _attempt(rt: Runtime, job: dict[str, Any], policy: VerifyPolicy) -> Attempt:
    target, _, _, problem = await _resolve_task_app(rt, job)
    if problem is not None or target is None:
        return problem or Attempt(False, TASKAPP_MISSING, "no task app")
    key = None
    if target.secret_name:
        key = await rt.secret_value(job["metadata"]["namespace"], target.secret_name, target.secret_key)
        if key is None:
            return Attempt(
                False, SECRET_MISSING, f"Secret {target.secret_name} (key {target.secret_key}) not found"
            )
    return await check_once(target.url, key, request_timeout=policy.request_timeout)


async def verify_job_task_app(
    rt: Runtime, job: dict[str, Any], state: LoopState, observed: Observed
) -> Verification:
    """Verified once per job: a True TaskAppVerified condition (e.g. after a restart) is trusted."""
    status = job.get("status") or {}
    cond = get_condition(status, COND_VERIFIED)
    if cond and cond.get("status") == "True":
        return Verification(state="ok", target="task app", message=cond.get("message", ""), reason="Verified")
    if cond and cond.get("status") == "False":
        return Verification(
            state="failed", target="task app", message=cond.get("message", ""), reason=cond.get("reason", "")
        )
    _, policy, display, _ = await _resolve_task_app(rt, job)
    if state.verification is not None and state.verification.state != "pending":
        return state.verification
    started = time.time()
    if cond and cond.get("status") == "Unknown":  # resumed after a restart: the bound still holds
        since = parse_time(cond.get("lastTransitionTime"))
        started = since.timestamp() if since else started

    async def report(pending: Verification) -> None:
        desired = derive_status(
            job, observed=observed, expected=None, verification=pending, now=utcnow(), bucket=_bucket(rt, job)
        )
        await patch_status(rt, job, desired, state)

    await report(
        Verification(
            state="pending", target=display, message="checking /health and /task_info", reason="Verifying"
        )
    )
    result = await verify_with_retries(
        lambda: _attempt(rt, job, policy),
        policy,
        display,
        started=started,
        clock=time.time,
        on_attempt=report,
    )
    state.verification = result
    return result


def _bucket(rt: Runtime, job: dict[str, Any]) -> str:
    return specs.get(specs.section(job.get("spec") or {}, "storage"), "bucket") or rt.settings.s3_bucket


def render_job(rt: Runtime, job: dict[str, Any], target: render.TaskAppTarget | None) -> render.Rendered:
    kind = job["kind"]
    config = specs.spec_to_config(job["spec"], "rl" if kind == "RLJob" else "sft")
    if kind == "RLJob":
        assert target is not None
        return render.render_rljob(job, rt.settings, target, config)
    return render.render_sftjob(job, rt.settings, config)


async def finish_job(rt: Runtime, job: dict[str, Any], observed: Observed, phase: str) -> None:
    """A finished job frees its GPUs: rollout/reference/judge Deployments and Services go; a failed job's
    trainer is suspended (its pods go, the Job and its status stay)."""
    meta = job["metadata"]
    ns = meta["namespace"]
    for name, dep in list(observed.deployments.items()):
        if dep.role in SERVER_ROLES:
            await rt.kube.delete(object_path("apps/v1", "Deployment", ns, name))
            observed.deployments.pop(name, None)
    for role in SERVER_ROLES:
        svc = render.child_name(meta["name"], role)
        if f"Service/{svc}" in observed.others:
            await rt.kube.delete(object_path("v1", "Service", ns, svc))
            observed.others.discard(f"Service/{svc}")
    trainer = observed.trainer
    if phase == FAILED and trainer is not None and not trainer.suspended and trainer.active > 0:
        terminal = trainer.is_true("Failed") or trainer.is_true("Complete")
        if not terminal:
            await rt.kube.merge_patch(
                object_path("batch/v1", "Job", ns, trainer.name), {"spec": {"suspend": True}}
            )


async def reconcile_job(rt: Runtime, body: Any, indexes: dict[str, Any], state: LoopState) -> float | None:
    """One pass. Returns the seconds until the next pass is due, or None when the job is finished."""
    rt.reconciles += 1
    job = snapshot(body)
    job.setdefault("apiVersion", API_VERSION)
    meta = job["metadata"]
    key: Key = (meta["namespace"], KIND_LABELS[job["kind"]], meta["name"])
    observed = observe(key, indexes)
    status = job.get("status") or {}
    if status.get("phase") in TERMINAL:
        await finish_job(rt, job, observed, status["phase"])
        return None
    is_rl = job["kind"] == "RLJob"
    verification: Verification | None = None
    target = None
    if is_rl and state.target is not None and state.verification is not None:
        verification, target = state.verification, state.target  # verified once: no more lookups
    elif is_rl:
        cond = get_condition(status, COND_VERIFIED)
        verified = bool(cond and cond.get("status") == "True")
        if not job["spec"].get("suspend") or verified:
            verification = await verify_job_task_app(rt, job, state, observed)
        if verification is not None and verification.state == "ok":
            target, _, _, _ = await _resolve_task_app(rt, job)
            if target is None:  # the TaskApp went away: verify again on the next pass
                verification = Verification(state="pending", target="task app", message="task app not found")
                state.verification = None
            else:
                state.verification, state.target = verification, target
    rendered = None
    expected = None
    if not is_rl or (verification is not None and verification.state == "ok" and target is not None):
        rendered = render_job(rt, job, target)
        expected = expected_of(rendered)
    trainer = observed.trainer
    if trainer is not None and trainer.is_true("Complete") and not status.get("result"):
        # The trainer's result may still be on its way through our watch: read the job once, fresh.
        fresh = await rt.kube.get(object_path(API_VERSION, job["kind"], meta["namespace"], meta["name"]))
        if fresh and (fresh.get("status") or {}).get("result"):
            job.setdefault("status", {})["result"] = fresh["status"]["result"]
    now = utcnow()
    desired = derive_status(
        job,
        observed=observed,
        expected=expected,
        verification=verification,
        now=now,
        bucket=_bucket(rt, job),
        needs_verification=is_rl,
    )
    phase = desired["phase"]
    if rendered is not None and phase not in TERMINAL:
        await ensure_children(rt, rendered.children, observed, state)  # their watch events wake us again
    await patch_status(rt, job, desired, state)
    if phase in TERMINAL:
        await finish_job(rt, job, observed, phase)
        return None
    deadline = job["spec"].get("activeDeadlineSeconds")
    wait = rt.settings.resync_seconds
    if deadline:
        start = parse_time(desired.get("startTime")) or now
        left = float(deadline) - (now - start).total_seconds()
        wait = max(0.5, min(wait, left + 0.5))
    return wait


# ------------------------------------------------------------------------------------------- task apps
async def reconcile_task_app(rt: Runtime, body: Any, indexes: dict[str, Any], state: LoopState) -> float:
    """Deployment + Service for spec.image; verify; status.verified/url/taskInfo + condition Verified.
    Returns the seconds until the next verification (periodSeconds when healthy, backoff otherwise)."""
    rt.reconciles += 1
    ta = snapshot(body)
    ta.setdefault("apiVersion", API_VERSION)
    meta = ta["metadata"]
    spec = ta.get("spec") or {}
    key: Key = (meta["namespace"], "taskapp", meta["name"])
    observed = observe(key, indexes)
    children = render.render_task_app(ta, rt.settings)
    if children:
        await ensure_children(rt, children, observed, state)
    policy = VerifyPolicy.from_settings(rt.settings, spec.get("verification"))
    url = render.task_app_service_url(ta)
    secret = spec.get("apiKeySecretRef") or {}
    api_key = None
    attempt: Attempt | None = None
    if secret.get("name"):
        api_key = await rt.secret_value(
            meta["namespace"], secret["name"], secret.get("key") or "ENVIRONMENT_API_KEY"
        )
        if api_key is None:
            attempt = Attempt(False, SECRET_MISSING, f"Secret {secret['name']} not found")
    if attempt is None:
        attempt = await check_once(url, api_key, request_timeout=policy.request_timeout)
    now_s = time.time()
    status = ta.get("status") or {}
    cond = get_condition(status, TASKAPP_VERIFIED)
    if state.verify_started is None:
        since = (
            parse_time(cond.get("lastTransitionTime")) if cond and cond.get("status") == "Unknown" else None
        )
        state.verify_started = since.timestamp() if since else now_s
        state.verified_before = bool(cond and cond.get("status") == "True")
    if attempt.ok:
        verification = as_verification(attempt, f"TaskApp {meta['name']}", state="ok", attempts=1)
        state.verified_before = True
        state.delays = None
        wait = policy.period_seconds
    else:
        if state.delays is None:
            state.delays = policy.delays()
        delay = next(state.delays)
        give_up = (
            state.verified_before  # an outage of a verified task app flips the condition at once
            or not attempt.retryable
            or now_s - state.verify_started + delay > policy.timeout_seconds
        )
        verification = as_verification(
            attempt, f"TaskApp {meta['name']}", state="failed" if give_up else "pending", attempts=1
        )
        wait = (
            min(delay, policy.period_seconds)
            if not give_up or state.verified_before
            else policy.period_seconds
        )
    desired = taskapp_status(ta, url, verification, utcnow())
    old = (cond or {}).get("status")
    new_cond = get_condition(desired, TASKAPP_VERIFIED) or {}
    if new_cond.get("status") != old:
        state.last_phase = None
    await _patch_taskapp(rt, ta, desired, state, old, new_cond)
    return wait


async def _patch_taskapp(
    rt: Runtime, ta: dict[str, Any], desired: dict[str, Any], state: LoopState, old: Any, new: dict[str, Any]
) -> None:
    current = ta.get("status") or {}
    patch = status_patch(current, desired)
    if not patch:
        return
    meta = ta["metadata"]
    path = object_path(API_VERSION, "TaskApp", meta["namespace"], meta["name"]) + "/status"
    await rt.kube.merge_patch(path, {"status": patch})
    if new.get("status") != old:
        etype = "Normal" if new.get("status") == "True" else "Warning"
        reason = {"True": "Verified", "False": "VerificationFailed"}.get(new.get("status", ""), "Verifying")
        kopf.event(ta, type=etype, reason=reason, message=str(new.get("message") or "")[:1000])


__all__ = [
    "LoopState",
    "reconcile_job",
    "reconcile_task_app",
    "SUCCEEDED",
    "VERIFYING",
]
