"""The reconcile loop of one job or task app: observe (kopf indexes), verify (RLJob), render (pure), apply
what is missing or drifted (server-side apply), derive status (pure), patch what changed, post an Event
per phase transition, and clean up when the job ends. Idempotent: running it twice, or after a restart,
changes nothing that is already right.

A job always ends with a truthful status: a spec that cannot be rendered, a child the API server refuses
with 422, or a status the API server refuses with 422 ends the job Failed with reason InvalidSpec and a
message naming the field, instead of a retry loop that never writes a phase."""

from __future__ import annotations

import copy
import logging
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf

from posttrain.controller import render, specs
from posttrain.controller.bounds import bound_status, event_message
from posttrain.controller.kube import KubeError, object_path
from posttrain.controller.runtime import Key, Runtime
from posttrain.controller.settings import API_VERSION, LABEL_ROLE
from posttrain.controller.spec_errors import render_failure_message, unprocessable_message
from posttrain.controller.status import (
    COND_VERIFIED,
    FAILED,
    INVALID_SPEC,
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
    iso,
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
    invalid: str | None = None  # why the spec cannot be acted on (sticky: a spec does not change)
    token_ensured: bool = False  # the RLJob's rollout token Secret was created (or found) by this loop


class ChildRefused(Exception):
    """The API server refused a rendered child with 422: the spec holds a value it cannot take."""

    def __init__(self, kind: str, name: str, error: KubeError):
        super().__init__(f"{kind} {name}: {error}")
        self.message = unprocessable_message(f"{kind} {name}", error.details, str(error)[:200])


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
        elif child["kind"] in render.SUPPORTING_KINDS:
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
    """Server-side apply each child that is absent (made again when someone deleted it) or whose
    replicas/suspend drifted. Returns how many. A 422 on a child raises ChildRefused."""
    now = time.monotonic()
    applied = 0
    for child in children:
        ident = (child["kind"], child["metadata"]["name"])
        want = render.desired_state(child)
        have = _observed_state(child, observed)
        recent = state.applied.get(ident)
        if have == want:
            continue
        if recent and recent[0] == want and now - recent[1] < APPLY_GRACE:
            continue  # we applied it a moment ago; the watch has not caught up yet
        try:
            await rt.kube.apply(child)
        except KubeError as err:
            if err.status == 422:
                raise ChildRefused(*ident, err) from err
            raise
        state.applied[ident] = (want, now)
        applied += 1
    return applied


async def ensure_token_secret(
    rt: Runtime, job: dict[str, Any], rendered: render.Rendered, observed: Observed, state: LoopState
) -> None:
    """The RLJob's rollout token Secret: created once per loop (a 409 means it exists; the operator never
    reads it back), and again when a pod cannot start for want of a Secret (someone deleted it)."""
    if not rendered.token_secret:
        return
    config_error = any("CreateContainerConfigError" in p.problem for p in observed.pods)
    if state.token_ensured and not config_error:
        return
    await rt.kube.create(render.render_token_secret(job, secrets.token_urlsafe(32)))
    state.token_ensured = True


async def patch_status(
    rt: Runtime, job: dict[str, Any], desired: dict[str, Any], state: LoopState, *, event_kind: str = ""
) -> bool:
    """Merge-patch the owned status fields that changed, every string within the CRD's limits. A 422 (a
    value the status schema cannot hold) ends the job Failed/InvalidSpec naming the refused field."""
    desired = bound_status(job["kind"], desired)
    current = job.get("status") or {}
    patch = {k: v for k, v in status_patch(current, desired).items() if k not in state.pruned}
    if not patch:
        return False
    now = time.monotonic()
    if state.last_patch and state.last_patch[0] == patch and now - state.last_patch[1] < 10.0:
        return False
    meta = job["metadata"]
    path = object_path(API_VERSION, job["kind"], meta["namespace"], meta["name"]) + "/status"
    try:
        response = await rt.kube.merge_patch(path, {"status": patch})
    except KubeError as err:
        if err.status != 422 or desired.get("reason") == INVALID_SPEC:
            raise
        logger.warning("status of %s refused with 422: %s", meta["name"], err)
        message = unprocessable_message("the status derived from the spec", err.details, str(err)[:200])
        desired = invalid_spec_status(job, message)
        return await patch_status(rt, job, desired, state, event_kind=event_kind)
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
        kopf.event(job, type=etype, reason=new, message=event_message(desired.get("message")))
    if new:
        state.last_phase = new
    return True


def invalid_spec_status(job: dict[str, Any], message: str) -> dict[str, Any]:
    """The smallest status that says the job failed for its spec: phase, reason, message, the Failed and
    Ready conditions and the generation, without any field derived from the spec that might itself be
    what the API server refuses."""
    now = utcnow()
    status = job.get("status") or {}
    generation = job["metadata"].get("generation", 1)
    conditions = [c for c in status.get("conditions") or [] if c.get("type") not in ("Failed", "Ready")]
    for ctype in ("Failed", "Ready"):
        conditions.append(
            {
                "type": ctype,
                "status": "True" if ctype == "Failed" else "False",
                "reason": INVALID_SPEC,
                "message": message,
                "lastTransitionTime": iso(now),
                "observedGeneration": generation,
            }
        )
    return {
        "phase": FAILED,
        "reason": INVALID_SPEC,
        "message": message,
        "observedGeneration": generation,
        "conditions": conditions,
        "startTime": status.get("startTime") or iso(now),
        "completionTime": iso(now),
    }


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
    return await check_task_app(
        rt, job["metadata"]["namespace"], target.url, target.secret_name, target.secret_key, policy
    )


async def check_task_app(
    rt: Runtime, namespace: str, url: str, secret_name: str | None, secret_key: str, policy: VerifyPolicy
) -> Attempt:
    """One check of a task app with the key from its Secret, through the shared check cache."""
    key = version = None
    secret = None
    if secret_name:
        found = await rt.secret_key(namespace, secret_name, secret_key)
        if found.value is None:
            return Attempt(False, SECRET_MISSING, f"Secret {secret_name} (key {secret_key}) not found")
        key, version, secret = found.value, found.version, (namespace, secret_name, secret_key)
    ttl = min(rt.settings.verify_cache_seconds, policy.period_seconds)
    return await rt.check_task_app(
        url,
        key,
        secret=secret,
        secret_version=version,
        deadline=policy.request_timeout,
        ttl=ttl,
        failure_ttl=min(ttl, policy.backoff_initial),
    )


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
            job,
            observed=observed,
            expected=None,
            verification=pending,
            now=utcnow(),
            bucket=_bucket(rt, job),
            complete_pass=False,
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
    elif is_rl and state.invalid is None:
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
    renderable = not is_rl or (verification is not None and verification.state == "ok" and target is not None)
    if renderable and state.invalid is None:
        try:
            rendered = render_job(rt, job, target)
            expected = expected_of(rendered)
        except Exception as exc:  # noqa: BLE001 - a spec that cannot render is the user's to fix
            state.invalid = render_failure_message(exc)
            logger.warning("%s %s cannot be rendered: %s", job["kind"], meta["name"], state.invalid)
    trainer = observed.trainer
    if trainer is not None and trainer.is_true("Complete") and not status.get("result"):
        # The trainer's result may still be on its way through our watch: read the job once, fresh.
        fresh = await rt.kube.get(object_path(API_VERSION, job["kind"], meta["namespace"], meta["name"]))
        if fresh and (fresh.get("status") or {}).get("result"):
            job.setdefault("status", {})["result"] = fresh["status"]["result"]
    now = utcnow()

    def derive() -> dict[str, Any]:
        return derive_status(
            job,
            observed=observed,
            expected=expected,
            verification=verification,
            now=now,
            bucket=_bucket(rt, job),
            needs_verification=is_rl,
            invalid=state.invalid,
        )

    desired = derive()
    if rendered is not None and desired["phase"] not in TERMINAL:
        try:
            await ensure_token_secret(rt, job, rendered, observed, state)
            await ensure_children(rt, rendered.children, observed, state)  # their watch events wake us
        except ChildRefused as refused:
            state.invalid = refused.message
            logger.warning("%s %s: %s", job["kind"], meta["name"], refused)
            desired = derive()
    await patch_status(rt, job, desired, state)
    phase = (job.get("status") or {}).get("phase") or desired["phase"]
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
    refused: ChildRefused | None = None
    if children:
        try:
            await ensure_children(rt, children, observed, state)
        except ChildRefused as err:
            refused = err  # its spec holds a value the API server refuses: say so, do not check
    policy = VerifyPolicy.from_settings(rt.settings, spec.get("verification"))
    url = render.task_app_service_url(ta)
    secret = spec.get("apiKeySecretRef") or {}
    if refused is not None:
        attempt = Attempt(False, INVALID_SPEC, refused.message)
    else:
        attempt = await check_task_app(
            rt, meta["namespace"], url, secret.get("name"), secret.get("key") or "ENVIRONMENT_API_KEY", policy
        )
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
    patch = status_patch(current, bound_status("TaskApp", desired))
    if not patch:
        return
    meta = ta["metadata"]
    path = object_path(API_VERSION, "TaskApp", meta["namespace"], meta["name"]) + "/status"
    await rt.kube.merge_patch(path, {"status": patch})
    if new.get("status") != old:
        etype = "Normal" if new.get("status") == "True" else "Warning"
        reason = {"True": "Verified", "False": "VerificationFailed"}.get(new.get("status", ""), "Verifying")
        kopf.event(ta, type=etype, reason=reason, message=event_message(new.get("message")))


__all__ = [
    "LoopState",
    "reconcile_job",
    "reconcile_task_app",
    "SUCCEEDED",
    "VERIFYING",
]
