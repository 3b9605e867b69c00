"""The reconcile loop of one RLJob or SFTJob: observe (the in-memory indexes of controller/child_watch.py
and kopf, through controller/apply.py), parse the job (controller.objects), verify its task app (RLJob,
controller/taskapp_resolve.py), render (pure), apply what is missing or drifted (server-side apply), derive
status (pure), patch what changed, post an Event per phase transition, and clean up when the job ends.
Idempotent: running it twice, or after a restart, changes nothing that is already right.

A job always ends with a truthful status: a spec posttrain's models refuse, a spec that cannot be
rendered, a child the API server refuses with 422, or a status the API server refuses with 422 ends the
job Failed with reason InvalidSpec and a message naming the field, instead of a retry loop that never
writes a phase. The TaskApp's loop is controller/reconcile_taskapp.py."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import kopf

from posttrain.controller import gang, render
from posttrain.controller.apply import (
    KIND_LABELS,
    Applied,
    ChildRefused,
    NotOwned,
    create_owned,
    ensure_children,
    key_of,
    namespace_objects_seen,
    observe,
    snapshot,
    utcnow,
    with_applied,
)
from posttrain.controller.bounds import bound_status, event_message
from posttrain.controller.kube import KubeError, collection_path, object_path
from posttrain.controller.objects import Job, Owner, owner_of, parse_job
from posttrain.controller.render.model import bucket, check_model_access
from posttrain.controller.render.names import SERVER_ROLES, child_name, config_name
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.render.token import derived_token, with_token
from posttrain.controller.render.workload import held
from posttrain.controller.runtime import Runtime
from posttrain.controller.scheduling_policy import check_scheduling
from posttrain.controller.settings import LABEL_JOB, LABEL_KIND, LABEL_MANAGED_BY, LABEL_ROLE, MANAGER
from posttrain.controller.spec_errors import SpecError, render_failure_message, unprocessable_message
from posttrain.controller.status import (
    COND_READY,
    COND_VERIFIED,
    FAILED,
    INVALID_SPEC,
    PENDING,
    PREEMPTED,
    PROVISIONING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    TERMINAL,
    VERIFYING,
    Expected,
    Observed,
    PodObs,
    Verification,
    derive_status,
    get_condition,
    iso,
    parse_time,
    status_patch,
    status_write_needed,
)
from posttrain.controller.taskapp_resolve import check_job_task_app, resolve_task_app
from posttrain.controller.tenancy import reach_refusal
from posttrain.controller.verify import verify_with_retries

logger = logging.getLogger(__name__)
# Events are for people to look at: a job paused or ended. The way there (Pending, Verifying,
# Provisioning, Running) is in its status; a Running job is the normal case, not news.
EVENT_PHASES = {SUSPENDED, SUCCEEDED, FAILED}
SECRET_CHECK_STUCK_SECONDS = 5.0  # a job stuck Provisioning looks for its Secret at most this often


@dataclass
class JobState:
    """Per-job memory of one reconcile loop (lost on restart, which is fine: it only saves API calls)."""

    applied: Applied = field(default_factory=dict)
    spec: tuple[tuple[str, Any], Any] | None = None  # ((uid, generation), the parsed spec)
    # the task app, verified once
    verification: Verification | None = None
    target: TaskAppTarget | None = None
    plan: Plan | None = None  # the children rendered for one (uid, generation, task app)
    invalid: str | None = None  # why the spec cannot be acted on (sticky: a spec does not change)
    conflict: str | None = None  # an object under a child's name the job does not own (NotOwned)
    secret_ensured: bool = False  # the job's Secret was created (or found) by this loop
    secret_checked: float = 0.0  # monotonic time a stuck job last looked for its Secret
    provisioning_since: float | None = None  # wall-clock time the job was first seen Provisioning
    # its status writes
    written: dict[str, Any] = field(default_factory=dict)  # status fields this loop wrote (newer than a lagging watch)
    last_write: float = 0.0  # monotonic time of the last status write
    deferred: bool = False  # a message-only status change waits for the next pass
    last_phase: str | None = None
    pruned: set[str] = field(default_factory=set)  # status fields the CRD's schema prunes: never written again


@dataclass(frozen=True)
class Plan:
    """A job's children and what its status expects of them, rendered once per (uid, generation, task
    app): a pass that finds nothing changed does not render again."""

    key: tuple[str, Any, Any]
    rendered: render.Rendered
    expected: Expected


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
    return Expected(
        trainer=trainer,
        nodes=rendered.topology.nodes,
        deployments=deployments,
        others=tuple(others),
        roles=roles,
    )


async def ensure_job_secret(
    rt: Runtime, owner: Owner, rendered: render.Rendered, observed: Observed, state: JobState, stuck: bool
) -> None:
    """The job's Secret (job file, TOML, an RLJob's rollout token): created once per loop (a 409 means it
    exists; the operator never reads it back: it may not list or watch Secrets), and again when a pod
    cannot start for want of a Secret (CreateContainerConfigError) or when the job finds it gone (a GET by
    name every settings.secret_check_seconds, sooner when stuck): someone deleted it, and a trainer pod
    restarted meanwhile could not mount it."""
    config_error = any("CreateContainerConfigError" in p.problem for p in observed.pods)
    now = time.monotonic()
    if state.secret_ensured and not config_error:
        if now - state.secret_checked < rt.settings.secret_check_seconds and not (
            stuck and now - state.secret_checked >= SECRET_CHECK_STUCK_SECONDS
        ):
            return
        state.secret_checked = now
        if await rt.kube.exists(object_path("v1", "Secret", owner.namespace, config_name(owner.name))):
            return
    # the TOML is not kept in memory (controller/loop.py): read once from the job itself
    fresh = await rt.kube.get(object_path(owner.api_version, owner.kind, owner.namespace, owner.name))
    original = ((fresh or {}).get("spec") or {}).get("originalToml")
    secret = rendered.secret_with(original if isinstance(original, str) else None)
    if rendered.rollout_token:
        secret = with_token(secret, derived_token(rt.token_key, owner))
    await create_owned(rt, secret)
    state.secret_ensured = True
    state.secret_checked = now


async def patch_status(
    rt: Runtime, owner: Owner, current: dict[str, Any], desired: dict[str, Any], state: JobState
) -> bool:
    """Merge-patch the owned status fields that changed, every string within the CRD's limits; `current`
    (the status this pass started from) is updated to what was written. A 422 (a value the status schema
    cannot hold) ends the job Failed/InvalidSpec naming the refused field."""
    desired = bound_status(owner.kind, desired)
    current.update(state.written)  # what this loop wrote is newer than what the watch may show yet
    patch = {k: v for k, v in status_patch(current, desired).items() if k not in state.pruned}
    now = time.monotonic()
    interval = rt.settings.status_message_seconds
    if not status_write_needed(current, patch, since_last_write=now - state.last_write, interval=interval):
        state.deferred = bool(patch)
        return False
    state.deferred = False
    path = object_path(owner.api_version, owner.kind, owner.namespace, owner.name) + "/status"
    try:
        response = await rt.kube.merge_patch(path, {"status": patch})
    except KubeError as err:
        if err.status != 422 or desired.get("reason") == INVALID_SPEC:
            raise
        logger.warning("status of %s refused with 422: %s", owner.name, err)
        message = unprocessable_message("the status derived from the spec", err.details, str(err)[:200])
        return await patch_status(rt, owner, current, invalid_spec_status(owner, current, message), state)
    state.last_write = now
    state.written.update(patch)
    if response is not None:
        # A field the CRD's status schema does not declare is pruned by the API server: never chase it.
        written = response.get("status") or {}
        for key in patch:
            if key not in written and patch[key] is not None:
                state.pruned.add(key)
                logger.warning("status.%s is pruned by the CRD schema of %s; not writing it again", key, owner.kind)
    old = state.last_phase or current.get("phase") or PENDING
    old_reason = current.get("reason")
    # Keep the snapshot in line so a second derivation in the same pass starts from what we wrote.
    current.update(patch)
    new = desired.get("phase")
    if new and new != old and new in EVENT_PHASES:
        etype = "Warning" if new == FAILED else "Normal"
        kopf.event(owner.reference(), type=etype, reason=new, message=event_message(desired.get("message")))
    if desired.get("reason") == PREEMPTED and old_reason != PREEMPTED:  # Kueue preempted it (gang.py)
        kopf.event(owner.reference(), type="Warning", reason=PREEMPTED, message=event_message(desired.get("message")))
    if new:
        state.last_phase = new
    return True


def invalid_spec_status(owner: Owner, current: dict[str, Any], message: str) -> dict[str, Any]:
    """The smallest status that says the job failed for its spec: phase, reason, message, the Failed and
    Ready conditions and the generation, without any field derived from the spec that might itself be
    what the API server refuses."""
    now = utcnow()
    conditions = [c for c in current.get("conditions") or [] if c.get("type") not in ("Failed", "Ready")]
    for ctype in ("Failed", "Ready"):
        conditions.append(
            {
                "type": ctype,
                "status": "True" if ctype == "Failed" else "False",
                "reason": INVALID_SPEC,
                "message": message,
                "lastTransitionTime": iso(now),
                "observedGeneration": owner.generation,
            }
        )
    return {
        "phase": FAILED,
        "reason": INVALID_SPEC,
        "message": message,
        "observedGeneration": owner.generation,
        "conditions": conditions,
        "startTime": current.get("startTime") or iso(now),
        "completionTime": iso(now),
    }


async def verify_job_task_app(
    rt: Runtime, job: Job, state: JobState, observed: Observed, indexes: dict[str, Any]
) -> Verification:
    """Verified once per job: a True TaskAppVerified condition (e.g. after a restart) is trusted, and so is
    a TaskApp's own Verified condition (the TaskApp's loop checks it every periodSeconds). Otherwise the
    job checks its task app itself, with retries; a status is written only when a check fails (a job whose
    first check passes goes straight on)."""
    cond = get_condition(job.status, COND_VERIFIED)
    if cond and cond.get("status") == "True":
        return Verification(state="ok", target="task app", message=cond.get("message", ""), reason="Verified")
    if cond and cond.get("status") == "False":
        return Verification(
            state="failed", target="task app", message=cond.get("message", ""), reason=cond.get("reason", "")
        )
    resolved = await resolve_task_app(rt, job, indexes)
    if state.verification is not None and state.verification.state != "pending":
        return state.verification
    if resolved.trusted:
        return Verification(state="ok", target=resolved.display, reason="Verified",
                            message=f"{resolved.display} is verified by the operator")  # fmt: skip
    started = time.time()
    if cond and cond.get("status") == "Unknown":  # resumed after a restart: the bound still holds
        since = parse_time(cond.get("lastTransitionTime"))
        started = since.timestamp() if since else started

    async def report(pending: Verification) -> None:
        desired = derive_status(job, observed=observed, expected=None, verification=pending, now=utcnow(),
                                bucket=bucket(job.spec, rt.settings), complete_pass=False)  # fmt: skip
        await patch_status(rt, job.owner, job.status, desired, state)

    result = await verify_with_retries(
        lambda: check_job_task_app(rt, job, resolved.policy, indexes),
        resolved.policy,
        resolved.display,
        started=started,
        clock=time.time,
        on_attempt=report,
    )
    state.verification = result
    return result


# ----------------------------------------------------------------------------------------------- jobs
async def finish_job(rt: Runtime, owner: Owner, observed: Observed, phase: str, queued: bool = False) -> None:
    """A finished job frees its GPUs: rollout/reference/judge Deployments and Services go; a failed job's
    trainer is suspended (its pods go, the Job and its status stay); a `queued` job's Kueue Workload goes
    (its quota is released)."""
    ns = owner.namespace
    for name, dep in list(observed.deployments.items()):
        if dep.role in SERVER_ROLES:
            await rt.kube.delete(object_path("apps/v1", "Deployment", ns, name))
            observed.deployments.pop(name, None)
    for role in SERVER_ROLES:
        svc = child_name(owner.name, role)
        if f"Service/{svc}" in observed.others:
            await rt.kube.delete(object_path("v1", "Service", ns, svc))
            observed.others.discard(f"Service/{svc}")
    if queued:
        await gang.release(rt, owner)
    trainer = observed.trainer
    if phase == FAILED and trainer is not None and not trainer.suspended and trainer.active > 0:
        terminal = trainer.is_true("Failed") or trainer.is_true("Complete")
        if not terminal:
            await rt.kube.merge_patch(
                object_path("batch/v1", "Job", ns, trainer.name), {"spec": {"suspend": True}}
            )


async def verified_target(
    rt: Runtime, job: Job, state: JobState, observed: Observed, indexes: dict[str, Any]
) -> tuple[Verification | None, TaskAppTarget | None]:
    """An RLJob's task app, verified (once per loop; a suspended job is not checked until it resumes)."""
    if state.target is not None and state.verification is not None:
        return state.verification, state.target  # verified once: no more lookups
    if state.invalid is not None:
        return None, None
    cond = get_condition(job.status, COND_VERIFIED)
    verification = None
    if not job.spec.suspend or (cond and cond.get("status") == "True"):
        verification = await verify_job_task_app(rt, job, state, observed, indexes)
    if verification is None or verification.state != "ok":
        return verification, None
    target = (await resolve_task_app(rt, job, indexes)).target
    if target is None:  # the TaskApp went away: verify again on the next pass
        state.verification = None
        return Verification(state="pending", target="task app", message="task app not found"), None
    state.verification, state.target = verification, target
    return verification, target


def planned(rt: Runtime, job: Job, target: TaskAppTarget | None, state: JobState) -> Plan | None:
    """The job's children and what its status expects of them, rendered once per (uid, generation, task
    app); None (with state.invalid saying why, when the spec is to blame) when there is nothing to render."""
    if state.invalid is not None or (job.is_rl and target is None):
        return None
    key = (job.owner.uid, job.owner.generation, target)
    if state.plan is not None and state.plan.key == key:
        return state.plan
    try:
        rendered = render.render_job(job, rt.settings, target)
    except Exception as exc:  # noqa: BLE001 - a spec that cannot render is the user's to fix
        state.invalid = render_failure_message(exc)
        logger.warning("%s %s cannot be rendered: %s", job.owner.kind, job.owner.name, state.invalid)
        return None
    state.plan = Plan(key, rendered, expected_of(rendered))
    return state.plan


def stuck_for(state: JobState, phase: str, now: float, status: dict[str, Any]) -> float:
    """Seconds (wall clock) the job has been Provisioning, 0 when it is not. A job that was Provisioning
    before this loop started (a restarted operator) counts from its Ready condition's last transition."""
    if phase != PROVISIONING:
        state.provisioning_since = None
        return 0.0
    if state.provisioning_since is None:
        state.provisioning_since = now
        ready = get_condition(status, COND_READY) or {}
        since = parse_time(ready.get("lastTransitionTime")) if status.get("phase") == PROVISIONING else None
        if since is not None and ready.get("status") == "False":
            state.provisioning_since = min(now, since.timestamp())
    return now - state.provisioning_since


async def list_pods(rt: Runtime, owner: Owner) -> list[PodObs]:
    """The job's pods, read once for a job that is stuck (without a pods index): why they do not run."""
    selector = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_JOB}={owner.name},{LABEL_KIND}={KIND_LABELS[owner.kind]}"
    try:
        items = await rt.kube.list(collection_path("v1", "Pod", owner.namespace), selector)
    except KubeError as err:  # e.g. RBAC without pods list: the status says less, the job goes on
        logger.warning("cannot list the pods of %s %s: %s", owner.kind, owner.name, err)
        return []
    return [PodObs.from_object(p) for p in items]


async def read_result(rt: Runtime, job: Job, observed: Observed) -> None:
    """A completed trainer's result may still be on its way through our watch: read the job once, fresh."""
    trainer = observed.trainer
    if trainer is None or not trainer.is_true("Complete") or job.status.get("result"):
        return
    owner = job.owner
    fresh = await rt.kube.get(object_path(owner.api_version, owner.kind, owner.namespace, owner.name))
    if fresh and (fresh.get("status") or {}).get("result"):
        job.status["result"] = fresh["status"]["result"]


def next_pass(rt: Runtime, job: Job, desired: dict[str, Any], now: datetime, state: JobState) -> float:
    """Seconds to the next pass: the resync interval, sooner when activeDeadlineSeconds runs out or a
    message-only status change is waiting to be written."""
    wait = rt.settings.resync_seconds
    if state.deferred:
        wait = min(wait, max(0.5, rt.settings.status_message_seconds - (time.monotonic() - state.last_write)))
    if state.provisioning_since is not None and not rt.settings.watch_pods:  # look at the pods once stuck
        left = rt.settings.stuck_seconds - (time.time() - state.provisioning_since)
        if left > 0:
            wait = min(wait, left + 0.1)
    if state.secret_ensured and desired.get("phase") in (PROVISIONING, RUNNING):  # its Secret is looked for
        left = rt.settings.secret_check_seconds - (time.monotonic() - state.secret_checked)
        wait = min(wait, max(0.5, left + 0.1))
    deadline = job.spec.active_deadline_seconds
    if deadline:
        start = parse_time(desired.get("startTime")) or now
        left = float(deadline) - (now - start).total_seconds()
        wait = max(0.5, min(wait, left + 0.5))
    return wait


async def reconcile_invalid(rt: Runtime, obj: dict[str, Any], observed: Observed, state: JobState, err: SpecError) -> None:
    """A job whose spec posttrain's models refuse: Failed with reason InvalidSpec, its servers freed."""
    owner = owner_of(obj)
    state.invalid = render_failure_message(err)
    logger.warning("%s %s: %s", owner.kind, owner.name, state.invalid)
    current = dict(obj.get("status") or {})
    await patch_status(rt, owner, current, invalid_spec_status(owner, current, state.invalid), state)
    await finish_job(rt, owner, observed, FAILED)


def parse_cached(obj: dict[str, Any], state: JobState) -> Job:
    """The job with its spec parsed once per (uid, generation): a spec does not change otherwise."""
    owner = owner_of(obj)
    key = (owner.uid, owner.generation)
    if state.spec is None or state.spec[0] != key:
        state.spec = (key, parse_job(obj).spec)
    status = dict(obj.get("status") or {})
    status.update(state.written)  # what this loop wrote is newer than what the watch may show yet
    return Job(owner=owner, spec=state.spec[1], status=status)


async def reconcile_job(rt: Runtime, body: Any, indexes: dict[str, Any], state: JobState) -> float | None:
    """One pass. Returns the seconds until the next pass is due, or None when the job is finished."""
    rt.reconciles += 1
    obj = snapshot(body)
    owner = owner_of(obj)
    observed = observe(key_of(owner), indexes, owner.uid)
    phase = state.written.get("phase") or (obj.get("status") or {}).get("phase")
    queued = bool(((obj.get("spec") or {}).get("scheduling") or {}).get("queueName"))
    if phase in TERMINAL:
        await finish_job(rt, owner, observed, phase, queued)
        return None
    try:
        job = parse_cached(obj, state)
        # before the task app is verified: another namespace's model fails the job at once
        check_model_access(job.spec, owner.namespace, rt.settings)
        check_scheduling(job.spec.scheduling, rt.settings)  # what the platform allows (scheduling_policy.py)
    except SpecError as err:
        await reconcile_invalid(rt, obj, observed, state, err)
        return None
    verification, target = (
        await verified_target(rt, job, state, observed, indexes) if job.is_rl else (None, None)
    )
    plan = planned(rt, job, target, state)
    await read_result(rt, job, observed)
    # A job with a Kueue queue: its Workload, and whether Kueue admitted it (controller/gang.py).
    admission = await gang.admission_of(rt, job, plan.rendered) if plan is not None else None
    now = utcnow()

    def derive(seen: Observed, blocked: tuple[str, str] | None = None) -> dict[str, Any]:
        expected = plan.expected if plan is not None else None
        return derive_status(job, observed=seen, expected=expected, verification=verification, now=now,
                             bucket=bucket(job.spec, rt.settings), invalid=state.invalid,
                             conflict=state.conflict, blocked=blocked, admission=admission)  # fmt: skip

    desired = derive(observed)
    stuck_seconds = stuck_for(state, desired["phase"], time.time(), job.status)
    stuck = plan is not None and stuck_seconds >= rt.settings.stuck_seconds
    if stuck and not rt.settings.watch_pods:
        observed.pods = await list_pods(rt, owner)
        desired = derive(observed)
    if plan is not None and desired["phase"] not in TERMINAL:
        try:
            seen = namespace_objects_seen(owner, indexes)
            await rt.namespace_objects.ensure(rt.kube, rt.settings, owner.namespace, seen)
            await ensure_job_secret(rt, owner, plan.rendered, observed, state, stuck)
            children = plan.rendered.children
            if admission is not None and not admission.admitted:
                children = held(children)  # not admitted (yet, or any more): no pods
            if await ensure_children(rt, children, observed, state.applied):
                desired = derive(with_applied(observed, children))
        except ChildRefused as refused:
            state.invalid = refused.message
            logger.warning("%s %s: %s", owner.kind, owner.name, refused)
            desired = derive(observed)
        except NotOwned as conflict:
            state.conflict = conflict.message
            logger.warning("%s %s: %s", owner.kind, owner.name, conflict)
            desired = derive(observed)
        except KubeError as err:
            # the operator's reach policy, e.g. this namespace has not opted in (controller/tenancy.py):
            # the job waits with that reason and is tried again at the next pass
            if (refused := reach_refusal(err, owner.namespace)) is None:
                raise
            logger.warning("%s %s: %s", owner.kind, owner.name, refused[1])
            desired = derive(observed, refused)
    await patch_status(rt, owner, job.status, desired, state)
    phase = job.status.get("phase") or desired["phase"]
    if phase in TERMINAL:
        await finish_job(rt, owner, observed, phase, queued)
        return None
    wait = next_pass(rt, job, desired, now, state)
    if admission is not None:  # Kueue's admission (and preemption) sends no event here
        wait = min(wait, rt.settings.admitted_poll_seconds if admission.admitted else rt.settings.queue_poll_seconds)
    return wait


__all__ = ["JobState", "reconcile_job", "SUCCEEDED", "VERIFYING"]
