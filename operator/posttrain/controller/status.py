"""Pure status derivation: (a job parsed into posttrain.api's models, what its children look like, the
task-app verification, now) -> the status fields the operator owns. No I/O; table-tested in
tests/unit/test_status.py.

Phases: Pending -> Verifying (RLJob) -> [Queued] -> Provisioning -> Running -> Succeeded | Failed, or
Suspended. Queued: the job is in a Kueue queue (spec.scheduling.queueName) and Kueue has not admitted its
Workload yet (or evicted it); its children are held with no pods (render/workload.py).
Succeeded and Failed are terminal: a terminal job never goes back (its status is only kept)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from posttrain.api import model_ids
from posttrain.api.convert import spec_to_config
from posttrain.api.settings import trainer_mode
from posttrain.controller.objects import Job, Owner

PENDING = "Pending"
VERIFYING = "Verifying"
PROVISIONING = "Provisioning"
RUNNING = "Running"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
QUEUED = "Queued"
TERMINAL = {SUCCEEDED, FAILED}

# Condition types (batch-Job vocabulary + ours).
COND_VERIFIED = "TaskAppVerified"
COND_PROVISIONED = "Provisioned"
COND_RUNNING = "Running"
COND_SUSPENDED = "Suspended"
COND_COMPLETE = "Complete"
COND_FAILED = "Failed"
COND_READY = "Ready"
COND_ADMITTED = "Admitted"  # Kueue admitted the job's Workload (only for a job with a queue)
# Kueue preempted the job: True from its eviction until it is admitted again (reason Readmitted, False)
COND_PREEMPTED = "Preempted"
PREEMPTED = "Preempted"
READMITTED = "Readmitted"
TASKAPP_VERIFIED = "Verified"
INVALID_SPEC = "InvalidSpec"
CHILD_NOT_OWNED = "ChildNotOwned"  # an object under a child's name that the job does not own

OWNED_FIELDS = (
    "phase",
    "conditions",
    "observedGeneration",
    "model",
    "trainerMode",
    "linkedJobId",
    "fineTunedModel",
    "artifacts",
    "startTime",
    "completionTime",
    "message",
    "reason",
)


def iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------ observations
PROBLEM_MAX = 300  # one pod's or Deployment's problem in a status message


def owner_uid(obj: dict[str, Any]) -> str:
    """The uid of the object's controlling owner (its job), "" when it has none."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    for ref in refs:
        if isinstance(ref, dict) and ref.get("controller"):
            return str(ref.get("uid") or "")
    return ""


@dataclass(frozen=True)
class DeploymentObs:
    name: str
    role: str
    replicas: int = 0  # spec.replicas
    ready: int = 0  # status.readyReplicas
    problem: str = ""  # why pods are not being made: ReplicaFailure (quota, Pod Security), no progress
    owner: str = ""  # the uid of the job that owns it (controller/apply.py observes only its own)

    @staticmethod
    def from_object(obj: dict[str, Any], role: str = "") -> DeploymentObs:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return DeploymentObs(
            name=obj["metadata"]["name"],
            role=role or labels.get("posttrain.dev/role", ""),
            replicas=int(spec.get("replicas") if spec.get("replicas") is not None else 1),
            ready=int(status.get("readyReplicas") or 0),
            problem=deployment_problem(status),
            owner=owner_uid(obj),
        )


def deployment_problem(status: dict[str, Any]) -> str:
    """The Deployment controller's own account of pods it could not create (ReplicaFailure: a quota, a
    Pod Security refusal, a missing ServiceAccount) or of a rollout that stopped progressing."""
    for cond in status.get("conditions") or []:
        kind, state = cond.get("type"), cond.get("status")
        if (kind == "ReplicaFailure" and state == "True") or (kind == "Progressing" and state == "False"):
            text = f"{cond.get('reason') or kind}: {cond.get('message') or ''}".strip().rstrip(":")
            return text[:PROBLEM_MAX]
    return ""


@dataclass(frozen=True)
class TrainerObs:
    name: str
    completions: int = 1
    active: int = 0
    ready: int = 0
    succeeded: int = 0
    failed: int = 0
    suspended: bool = False
    conditions: tuple[tuple[str, str, str, str], ...] = ()  # (type, status, reason, message)
    start_time: str | None = None
    completion_time: str | None = None
    owner: str = ""  # the uid of the job that owns it

    def condition(self, ctype: str) -> tuple[str, str, str] | None:
        for t, status, reason, message in self.conditions:
            if t == ctype:
                return status, reason, message
        return None

    def is_true(self, ctype: str) -> bool:
        cond = self.condition(ctype)
        return bool(cond and cond[0] == "True")

    @staticmethod
    def from_object(obj: dict[str, Any]) -> TrainerObs:
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        conds = tuple(
            (
                str(c.get("type")),
                str(c.get("status")),
                str(c.get("reason") or ""),
                str(c.get("message") or ""),
            )
            for c in status.get("conditions") or []
        )
        return TrainerObs(
            name=obj["metadata"]["name"],
            completions=int(spec.get("completions") or 1),
            active=int(status.get("active") or 0),
            ready=int(status.get("ready") or 0),
            # the Job controller counts a finished pod in two steps: first in uncountedTerminatedPods
            succeeded=int(status.get("succeeded") or 0)
            + len((status.get("uncountedTerminatedPods") or {}).get("succeeded") or []),
            failed=int(status.get("failed") or 0),
            suspended=bool(spec.get("suspend")),
            conditions=conds,
            start_time=status.get("startTime"),
            completion_time=status.get("completionTime"),
            owner=owner_uid(obj),
        )


@dataclass(frozen=True)
class PodObs:
    """Why a child's pod is not running, when it is not (unschedulable, image pull, crash, OOMKilled)."""

    name: str
    role: str
    phase: str
    problem: str = ""

    @staticmethod
    def from_object(obj: dict[str, Any]) -> PodObs:
        meta = obj.get("metadata") or {}
        status = obj.get("status") or {}
        problem = ""
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                problem = f"{cond.get('reason') or 'Unschedulable'}: {cond.get('message') or ''}".strip()
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            state = cs.get("state") or {}
            waiting = state.get("waiting") or {}
            terminated = state.get("terminated") or {}
            last = (cs.get("lastState") or {}).get("terminated") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating", "PodInitializing"):
                problem = f"{cs.get('name')}: {waiting['reason']}"
            elif terminated.get("reason") == "OOMKilled" or last.get("reason") == "OOMKilled":
                problem = f"{cs.get('name')}: OOMKilled"
            elif terminated and terminated.get("exitCode") not in (None, 0):
                problem = f"{cs.get('name')}: exit code {terminated.get('exitCode')}"
            if problem:
                break
        return PodObs(
            name=meta.get("name", ""),
            role=(meta.get("labels") or {}).get("posttrain.dev/role", ""),
            phase=status.get("phase") or "Pending",
            problem=problem[:PROBLEM_MAX],
        )


@dataclass
class Observed:
    """The job's children as the operator's watches see them, keyed by name."""

    deployments: dict[str, DeploymentObs] = field(default_factory=dict)
    trainer: TrainerObs | None = None
    others: set[str] = field(default_factory=set)  # "Kind/name" of Services (and identity objects) that exist
    pods: list[PodObs] = field(default_factory=list)


@dataclass(frozen=True)
class Expected:
    """What the job should have, from render: names and desired replicas."""

    trainer: str
    nodes: int
    deployments: dict[str, int] = field(default_factory=dict)  # name -> replicas
    others: tuple[str, ...] = ()  # "Kind/name" of Services
    roles: dict[str, str] = field(default_factory=dict)  # name -> role, for messages


@dataclass(frozen=True)
class Admission:
    """What Kueue says of a queued job's Workload (render/workload.py admission()): admitted, or why not."""

    admitted: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Verification:
    """Result of verifying a task app. state: ok | failed | pending (still retrying)."""

    state: str
    target: str  # "TaskApp math (http://...)" or "task app http://..."
    message: str = ""
    reason: str = ""
    http_status: int | None = None
    task_info: dict[str, Any] | None = None
    attempts: int = 0


# --------------------------------------------------------------------------------------------- conditions
def set_condition(
    conditions: list[dict[str, Any]],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """A new list with `ctype` set; lastTransitionTime only moves when the status changes; the condition
    says which generation of the object it was computed for."""
    out = [dict(c) for c in conditions if c.get("type") != ctype]
    old = next((c for c in conditions if c.get("type") == ctype), None)
    changed = old is None or old.get("status") != status
    cond: dict[str, Any] = {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": iso(now) if changed else old.get("lastTransitionTime", iso(now)),
    }
    if generation is not None:
        cond["observedGeneration"] = generation
    elif old is not None and "observedGeneration" in old:
        cond["observedGeneration"] = old["observedGeneration"]
    out.append(cond)
    order = {c.get("type"): i for i, c in enumerate(conditions)}
    out.sort(key=lambda c: order.get(c["type"], len(order)))
    return out


def get_condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in status.get("conditions") or []:
        if cond.get("type") == ctype:
            return cond
    return None


# ------------------------------------------------------------------------------------------------ derive
def _artifacts_fallback(job: Job, bucket: str) -> dict[str, str]:
    owner = job.owner
    root = f"s3://{bucket}/" + model_ids.job_artifact_prefix(owner.namespace, owner.name, owner.uid)
    return {
        "model": f"{root}final/",
        "manifest": f"{root}manifest.json",
        "checkpoints": f"{root}checkpoints/",
        "logs": f"{root}metrics.jsonl",
    }


def _result(job: Job, bucket: str) -> tuple[str, dict[str, Any], bool]:
    """(fineTunedModel, artifacts, reported by the trainer?) from status.result, else derived from the spec
    by the trainer's own rule (posttrain.api.model_ids)."""
    result = job.status.get("result") or {}
    model = result.get("fineTunedModel") or result.get("fine_tuned_model")
    artifacts = result.get("artifacts") or {}
    if model:
        return str(model), dict(artifacts), True
    owner, source = job.owner, job.spec.model.source
    base = job.spec.model.base or model_ids.source_weights(str(source), bucket)[0]
    prefix = "rl" if job.is_rl else "ft"
    ftm = model_ids.fine_tuned_model_id(prefix, base, owner.namespace, owner.name, owner.uid)
    return ftm, dict(artifacts) or _artifacts_fallback(job, bucket), False


class _Conditions:
    """A job's conditions as one pass of derive_status sets them, each stamped with the pass's time and the
    generation it was computed for."""

    def __init__(self, conditions: list[dict[str, Any]], now: datetime, generation: int):
        self.items = list(conditions)
        self.now = now
        self.generation = generation

    def set(self, ctype: str, status: str, reason: str, message: str) -> None:
        self.items = set_condition(self.items, ctype, status, reason, message, self.now, self.generation)

    def has(self, ctype: str) -> bool:
        return get_condition({"conditions": self.items}, ctype) is not None


@dataclass(frozen=True)
class _Outcome:
    phase: str
    reason: str
    message: str


def derive_status(
    job: Job,
    *,
    observed: Observed,
    expected: Expected | None,
    verification: Verification | None,
    now: datetime,
    bucket: str = "posttrain",
    invalid: str | None = None,
    complete_pass: bool = True,
    conflict: str | None = None,
    blocked: tuple[str, str] | None = None,
    admission: Admission | None = None,
) -> dict[str, Any]:
    """The operator-owned status fields of a job (see OWNED_FIELDS). `expected` is None until the children
    have been rendered (i.e. before an RLJob's task app is verified; an SFTJob needs no verification).
    `invalid` is why the spec cannot be turned into children (it names the field): the job fails with
    reason InvalidSpec; `conflict` names an object under a child's name that the job does not own (reason
    ChildNotOwned: the operator never adopts it). `blocked` is (reason, message) when the API server refuses
    the children for a reason a person outside the spec must fix (the namespace has not opted in): the job
    waits, Pending. observedGeneration moves only on a `complete_pass` (children applied, nothing
    failed); every condition carries the generation it was computed for. `admission` is Kueue's word on a
    job with a queue (None for a job without one): Queued until it is admitted.

    The phase is the first that holds of: the trainer Job finished (Succeeded/Failed), the job cannot run
    (invalid spec, deadline, task app refused: Failed; Suspended; Verifying), its children (Provisioning,
    Running)."""
    status = job.status
    out: dict[str, Any] = {k: status[k] for k in OWNED_FIELDS if k in status}
    if complete_pass:
        out["observedGeneration"] = job.owner.generation
    out["model"] = job.spec.model.base or job.spec.model.source
    out["trainerMode"] = trainer_mode(spec_to_config(job.spec))  # as the trainer's settings and manifest say
    start = parse_time(status.get("startTime")) or now
    out["startTime"] = iso(start)
    conds = _Conditions(list(status.get("conditions") or []), now, job.owner.generation)
    if (status.get("phase") or PENDING) in TERMINAL:
        out["conditions"] = conds.items
        return out
    if expected is not None:
        out["linkedJobId"] = f"{job.owner.namespace}/{expected.trainer}"
    if verification is not None:
        _verified_condition(conds, verification)
    outcome = (
        _finished(job, observed.trainer, bucket, now, out, conds)
        or (_Outcome(FAILED, CHILD_NOT_OWNED, conflict) if conflict else None)
        or _cannot_run(job, verification, invalid, start, now, conds)
        or (_Outcome(PENDING, *blocked) if blocked else None)
        or _finishing(job, status)
        or _queued(admission, conds, status)
        or _from_children(expected, observed, conds)
    )
    _phase_conditions(conds, outcome)
    if outcome.phase == FAILED:
        out["completionTime"] = iso(now)
    out.update(phase=outcome.phase, reason=outcome.reason, message=outcome.message, conditions=conds.items)
    return out


def _verified_condition(conds: _Conditions, verification: Verification) -> None:
    v_status = {"ok": "True", "failed": "False"}.get(verification.state, "Unknown")
    v_reason = verification.reason or {"ok": "Verified", "failed": "VerificationFailed"}.get(
        verification.state, "Verifying"
    )
    conds.set(COND_VERIFIED, v_status, v_reason, verification.message)


def _finished(
    job: Job, trainer: TrainerObs | None, bucket: str, now: datetime, out: dict[str, Any], conds: _Conditions
) -> _Outcome | None:
    """Succeeded (with the fine-tuned model and artifacts in `out`) or Failed, once the trainer Job ended."""
    if trainer is None:
        return None
    if trainer.is_true("Complete") or trainer.is_true("SuccessCriteriaMet"):
        ftm, artifacts, reported = _result(job, bucket)
        message = f"fine-tuned model {ftm}"
        if not reported:
            message += " (the trainer reported no result; id and artifacts derived from the job)"
        out["fineTunedModel"] = ftm
        out["artifacts"] = artifacts
        out["completionTime"] = trainer.completion_time or iso(now)
        conds.set(COND_COMPLETE, "True", "TrainerSucceeded", message)
        return _Outcome(SUCCEEDED, "TrainerSucceeded", message)
    if trainer.is_true("Failed") or trainer.is_true("FailureTarget"):
        cond = trainer.condition("Failed") or trainer.condition("FailureTarget") or ("True", "", "")
        job_reason = cond[1] or "TrainerFailed"
        reason = "DeadlineExceeded" if job_reason == "DeadlineExceeded" else "TrainerFailed"
        message = f"trainer Job {trainer.name} failed ({job_reason})" + (f": {cond[2]}" if cond[2] else "")
        return _Outcome(FAILED, reason, message)
    return None


def _cannot_run(
    job: Job,
    verification: Verification | None,
    invalid: str | None,
    start: datetime,
    now: datetime,
    conds: _Conditions,
) -> _Outcome | None:
    """Failed (invalid spec, deadline passed, task app refused), Suspended, or Verifying (an RLJob whose task
    app is not verified yet)."""
    deadline = job.spec.active_deadline_seconds
    if invalid:
        return _Outcome(FAILED, INVALID_SPEC, invalid)
    if deadline and (now - start).total_seconds() > float(deadline):
        return _Outcome(
            FAILED,
            "DeadlineExceeded",
            f"activeDeadlineSeconds ({int(deadline)}s) exceeded since {iso(start)}",
        )
    if job.is_rl and verification is not None and verification.state == "failed":
        return _Outcome(FAILED, "TaskAppVerificationFailed", f"{verification.target}: {verification.message}")
    if job.spec.suspend:
        message = "spec.suspend is true: pods removed, job kept"
        conds.set(COND_SUSPENDED, "True", "Suspended", message)
        return _Outcome(SUSPENDED, "Suspended", message)
    if job.is_rl and (verification is None or verification.state != "ok"):
        target = verification.target if verification else "the task app"
        detail = f": {verification.message}" if verification and verification.message else ""
        return _Outcome(VERIFYING, "VerifyingTaskApp", f"verifying {target}{detail}")
    return None


def _finishing(job: Job, status: dict[str, Any]) -> _Outcome | None:
    """Running while a trainer that has reported its final result exits: its pod stops being ready a moment
    before the Job counts it succeeded, and that is no reason to say Provisioning again (make e2e saw
    Running -> Provisioning -> Succeeded)."""
    result = status.get("result") or {}
    if status.get("phase") == RUNNING and (result.get("fineTunedModel") or result.get("fine_tuned_model")):
        return _Outcome(RUNNING, "Running", "the trainer reported its result and is finishing")
    return None


def _resumes_from(status: dict[str, Any]) -> str:
    checkpoint = (status.get("progress") or {}).get("lastCheckpoint")
    return f"the last checkpoint ({checkpoint})" if checkpoint else "the last checkpoint (none yet: from the start)"


def _queued(admission: Admission | None, conds: _Conditions, status: dict[str, Any]) -> _Outcome | None:
    """Queued (with Kueue's reason) until Kueue admits the job's Workload; the Admitted condition. A job
    Kueue preempted is Queued with reason Preempted (condition Preempted True) until it is admitted again; its
    trainer pods, made anew then, resume from the last checkpoint (the trainer saved one on SIGTERM)."""
    if admission is None:
        return None
    conds.set(COND_ADMITTED, "True" if admission.admitted else "False", admission.reason, admission.message)
    was_preempted = (get_condition({"conditions": conds.items}, COND_PREEMPTED) or {}).get("status") == "True"
    if admission.admitted:
        if was_preempted:
            conds.set(COND_PREEMPTED, "False", READMITTED,
                      f"admitted again by Kueue: the trainer resumes from {_resumes_from(status)}")  # fmt: skip
        return None
    if admission.reason == PREEMPTED:
        conds.set(COND_PREEMPTED, "True", PREEMPTED, admission.message)
        return _Outcome(QUEUED, PREEMPTED, f"{admission.message}; its pods stop (the trainer checkpoints "
                        f"first) and, admitted again, it resumes from {_resumes_from(status)}")  # fmt: skip
    if not was_preempted:
        return _Outcome(QUEUED, admission.reason, admission.message)
    return _Outcome(QUEUED, PREEMPTED, f"preempted by Kueue, waiting to be admitted again ({admission.message}); "
                    f"then the trainer resumes from {_resumes_from(status)}")  # fmt: skip


def _from_children(expected: Expected | None, observed: Observed, conds: _Conditions) -> _Outcome:
    """Provisioning until every child exists and its pods run, then Running."""
    if expected is None:
        return _Outcome(PROVISIONING, "Rendering", "creating children")
    missing = [
        n for n in (*expected.deployments, expected.trainer, *expected.others) if not _exists(n, observed)
    ]
    conds.set(
        COND_PROVISIONED,
        "False" if missing else "True",
        "ChildrenMissing" if missing else "ChildrenCreated",
        f"missing: {', '.join(missing)}" if missing else "every child exists",
    )
    waiting = _waiting_for(expected, observed)
    if not waiting:
        return _Outcome(RUNNING, "Running", "trainer and servers are running")
    message = "waiting for " + ", ".join(waiting)
    problems = _problems(expected, observed)
    if problems:
        return _Outcome(PROVISIONING, "PodsNotReady", message + "; " + "; ".join(problems[:3]))
    return _Outcome(PROVISIONING, "WaitingForPods", message)


def _phase_conditions(conds: _Conditions, outcome: _Outcome) -> None:
    """The conditions that follow the phase: Suspended (back to False on resume), Running, Failed, Ready."""
    phase, reason, message = outcome.phase, outcome.reason, outcome.message
    if phase != SUSPENDED and conds.has(COND_SUSPENDED):
        conds.set(COND_SUSPENDED, "False", "Resumed", "spec.suspend is false")
    if phase == RUNNING:
        conds.set(COND_RUNNING, "True", reason, message)
    elif conds.has(COND_RUNNING):
        conds.set(COND_RUNNING, "False", reason, message)
    if phase == FAILED:
        conds.set(COND_FAILED, "True", reason, message)
    conds.set(COND_READY, "True" if phase in (RUNNING, SUCCEEDED) else "False", reason, message)


def _problems(expected: Expected, observed: Observed) -> list[str]:
    """Why pods are missing or not running: the Deployments' ReplicaFailure first (no pod exists to say
    it), then each pod's own problem; one line per distinct problem."""
    lines = [
        f"{expected.roles.get(name, dep.role or name)} {dep.problem}"
        for name, dep in sorted(observed.deployments.items())
        if dep.problem and name in expected.deployments
    ]
    lines += sorted({f"{p.role} pod {p.problem}" for p in observed.pods if p.problem})
    return list(dict.fromkeys(lines))


def _exists(name: str, observed: Observed) -> bool:
    if observed.trainer is not None and observed.trainer.name == name:
        return True
    return name in observed.deployments or name in observed.others


def _waiting_for(expected: Expected, observed: Observed) -> list[str]:
    waiting: list[str] = []
    for name, replicas in expected.deployments.items():
        dep = observed.deployments.get(name)
        role = expected.roles.get(name, name)
        ready = dep.ready if dep else 0
        if dep is None or ready < replicas:
            waiting.append(f"{role} {ready}/{replicas} ready")
    trainer = observed.trainer
    # A trainer pod that exited 0 has done its part: until the Job controller marks the Job Complete (a
    # moment later), it is not a pod to wait for. Counted from the pods too, which can show Succeeded
    # before the Job's own `succeeded` does.
    finished = max(
        trainer.succeeded if trainer else 0,
        sum(1 for p in observed.pods if p.role == "trainer" and p.phase == "Succeeded"),
    )
    ready = (trainer.ready if trainer else 0) + finished
    if trainer is not None and trainer.suspended:
        waiting.append("trainer Job suspended")
    elif trainer is None or ready < expected.nodes:
        waiting.append(f"trainer {ready}/{expected.nodes} pods ready")
    for name in expected.others:
        if name not in observed.others:
            waiting.append(f"{expected.roles.get(name, name)} {name}")
    return waiting


def status_patch(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any]:
    """Only the owned fields that differ (a merge patch body for /status); {} when nothing changed."""
    return {k: v for k, v in desired.items() if current.get(k) != v}


def _decisions(conditions: Any) -> list[tuple[Any, ...]]:
    """A condition list without its words: what a client (kubectl wait, Argo CD) decides on."""
    return [(c.get("type"), c.get("status"), c.get("reason"), c.get("observedGeneration")) for c in conditions or []]


def status_write_needed(current: dict[str, Any], patch: dict[str, Any], *, since_last_write: float, interval: float) -> bool:
    """Whether a status patch is written now. Anything but words (the phase, a reason, a condition's
    status, the model, the artifacts, ...) is written at once; a patch that only rewords messages (how many
    pods are ready so far) at most once per `interval` seconds, so that a job's status is written about
    once per phase rather than once per pod."""
    if not patch:
        return False
    if set(patch) - {"message", "conditions"}:
        return True
    if "conditions" in patch and _decisions(current.get("conditions")) != _decisions(patch["conditions"]):
        return True
    return since_last_write >= interval


# --------------------------------------------------------------------------------------------- TaskApp
def taskapp_status(
    owner: Owner, status: dict[str, Any], url: str, verification: Verification, now: datetime
) -> dict[str, Any]:
    """A TaskApp's status after one check; `status` is its current one."""
    generation = owner.generation
    conds = list(status.get("conditions") or [])
    ok = verification.state == "ok"
    cstatus = "True" if ok else ("False" if verification.state == "failed" else "Unknown")
    reason = verification.reason or ("Verified" if ok else "Verifying")
    conds = set_condition(conds, TASKAPP_VERIFIED, cstatus, reason, verification.message, now, generation)
    conds = set_condition(
        conds, COND_READY, "True" if ok else "False", reason, verification.message, now, generation
    )
    out: dict[str, Any] = {
        "verified": ok,
        "url": url,
        "conditions": conds,
        "observedGeneration": generation,
        "reason": reason,
        "message": verification.message,
    }
    if ok and verification.task_info is not None:
        out["taskInfo"] = verification.task_info
    elif "taskInfo" in status:
        out["taskInfo"] = status["taskInfo"]
    return out
