"""status.py: (job, children, verification, now) -> status; table-tested."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fixtures.jobs import UID, job_object, rl_spec, sft_spec
from posttrain.controller.objects import Job, Owner, parse_job
from posttrain.controller.status import (
    Admission,
    DeploymentObs,
    Expected,
    Observed,
    PodObs,
    TrainerObs,
    Verification,
    derive_status,
    get_condition,
    set_condition,
    status_patch,
    taskapp_status,
)

NOW = datetime(2026, 11, 22, 14, 0, 0, tzinfo=UTC)
EXPECTED = Expected(
    trainer="j-trainer",
    nodes=1,
    deployments={"j-rollout": 1},
    others=("ConfigMap/j-config", "Service/j-rollout", "Service/j-trainer"),
    roles={"j-rollout": "rollout"},
)
OK = Verification(state="ok", target="task app http://t", message="GET /health 200, GET /task_info 200")
PENDING = Verification(state="pending", target="task app http://t", message="connection refused (attempt 2)")
BAD_KEY = Verification(
    state="failed",
    target="TaskApp math (http://t)",
    message="GET /health -> HTTP 400 unauthorised: API key missing or invalid",
    reason="Unauthorized",
    http_status=400,
)


def job(kind: str = "RLJob", status: dict | None = None, **spec: Any) -> Job:
    complete = (rl_spec if kind == "RLJob" else sft_spec)(model={"base": "Qwen/Qwen3-0.6B"}, **spec)
    return parse_job(job_object(kind, complete, uid=UID, generation=3, status=status or {}))


def trainer(**kw: Any) -> TrainerObs:
    conds = tuple(kw.pop("conds", ()))
    return TrainerObs(name="j-trainer", conditions=conds, **kw)


def all_children(ready: int = 1, trainer_obs: TrainerObs | None = None) -> Observed:
    return Observed(
        deployments={"j-rollout": DeploymentObs("j-rollout", "rollout", 1, ready)},
        trainer=trainer_obs or trainer(active=1, ready=1),
        others={"ConfigMap/j-config", "Service/j-rollout", "Service/j-trainer"},
    )


@dataclass
class Case:
    name: str
    job: Job
    observed: Observed = field(default_factory=Observed)
    expected: Expected | None = EXPECTED
    verification: Verification | None = OK
    phase: str = ""
    reason: str = ""
    message_has: str = ""
    sft: bool = False


CASES = [
    Case("new job, verification not started", job(), expected=None, verification=None, phase="Verifying"),
    Case("verification retrying", job(), expected=None, verification=PENDING, phase="Verifying",
         message_has="connection refused"),
    Case("bad key -> failed naming task app and HTTP status", job(), expected=None, verification=BAD_KEY,
         phase="Failed", reason="TaskAppVerificationFailed", message_has="TaskApp math (http://t): GET /health -> HTTP 400"),
    Case("verified, nothing observed yet", job(), phase="Provisioning", reason="WaitingForPods",
         message_has="rollout 0/1 ready"),
    Case("rollout not ready", job(), observed=all_children(ready=0), phase="Provisioning",
         message_has="rollout 0/1 ready"),
    Case("trainer pods not ready", job(), observed=all_children(trainer_obs=trainer(active=1, ready=0)),
         phase="Provisioning", message_has="trainer 0/1 pods ready"),
    Case("everything ready", job(), observed=all_children(), phase="Running", reason="Running"),
    Case("trainer complete", job(), observed=all_children(trainer_obs=trainer(succeeded=1, conds=[("Complete", "True", "", "")])),
         phase="Succeeded", reason="TrainerSucceeded", message_has="rl:Qwen/Qwen3-0.6B:ns.j.1234abcd"),
    Case("trainer failed", job(), observed=all_children(trainer_obs=trainer(failed=1, conds=[("Failed", "True", "BackoffLimitExceeded", "Job has reached the specified backoff limit")])),
         phase="Failed", reason="TrainerFailed", message_has="BackoffLimitExceeded"),
    Case("trainer job deadline", job(), observed=all_children(trainer_obs=trainer(conds=[("Failed", "True", "DeadlineExceeded", "")])),
         phase="Failed", reason="DeadlineExceeded"),
    Case("operator deadline while verifying", job(activeDeadlineSeconds=60, status={"startTime": "2026-11-22T13:58:00Z"}),
         expected=None, verification=PENDING, phase="Failed", reason="DeadlineExceeded"),
    Case("deadline not reached", job(activeDeadlineSeconds=600, status={"startTime": "2026-11-22T13:58:00Z"}),
         observed=all_children(), phase="Running"),
    Case("suspended", job(suspend=True), observed=all_children(ready=0), phase="Suspended", reason="Suspended"),
    Case("suspended before verification", job(suspend=True), expected=None, verification=None, phase="Suspended"),
    Case("terminal stays terminal", job(status={"phase": "Succeeded", "fineTunedModel": "x"}),
         observed=all_children(trainer_obs=trainer(failed=1, conds=[("Failed", "True", "", "")])), phase="Succeeded"),
    Case("failed stays failed", job(status={"phase": "Failed", "reason": "TrainerFailed"}), observed=all_children(),
         phase="Failed", reason="TrainerFailed"),
    Case("sft: no verification needed", job("SFTJob"), verification=None, expected=Expected(trainer="j-trainer", nodes=1),
         observed=Observed(trainer=trainer(active=1, ready=1)), phase="Running", sft=True),
    Case("sft complete uses ft: prefix", job("SFTJob"), verification=None, expected=Expected(trainer="j-trainer", nodes=1),
         observed=Observed(trainer=trainer(conds=[("Complete", "True", "", "")])), phase="Succeeded",
         message_has="ft:Qwen/Qwen3-0.6B:ns.j.1234abcd", sft=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_phase_table(case: Case) -> None:
    out = derive_status(
        case.job,
        observed=case.observed,
        expected=case.expected,
        verification=case.verification,
        now=NOW,
        bucket="bkt",
    )
    assert case.job.is_rl is not case.sft
    assert out["phase"] == case.phase
    if case.reason:
        assert out["reason"] == case.reason
    if case.message_has:
        assert case.message_has in out["message"]
    assert out["observedGeneration"] == 3
    assert out["model"] == "Qwen/Qwen3-0.6B"


def test_success_copies_trainer_result() -> None:
    result = {"fineTunedModel": "rl:Qwen/Qwen3-0.6B:ns.j.1234abcd", "artifacts": {"model": "s3://b/final/"}}
    out = derive_status(
        job(status={"phase": "Running", "result": result, "startTime": "2026-11-22T13:00:00Z"}),
        observed=all_children(
            trainer_obs=trainer(conds=[("Complete", "True", "", "")], completion_time="2026-11-22T13:59:00Z")
        ),
        expected=EXPECTED,
        verification=OK,
        now=NOW,
    )
    assert out["phase"] == "Succeeded"
    assert out["fineTunedModel"] == result["fineTunedModel"]
    assert out["artifacts"] == {"model": "s3://b/final/"}
    assert out["completionTime"] == "2026-11-22T13:59:00Z"
    assert out["startTime"] == "2026-11-22T13:00:00Z"
    assert out["linkedJobId"] == "ns/j-trainer"
    assert get_condition(out, "Complete")["status"] == "True"
    assert (get_condition(out, "Running") or {}).get("status") != "True"


def test_success_without_result_derives_id_and_artifacts() -> None:
    out = derive_status(
        job(),
        observed=all_children(trainer_obs=trainer(conds=[("Complete", "True", "", "")])),
        expected=EXPECTED,
        verification=OK,
        now=NOW,
        bucket="bkt",
    )
    assert out["fineTunedModel"] == "rl:Qwen/Qwen3-0.6B:ns.j.1234abcd"
    assert out["artifacts"]["model"] == "s3://bkt/jobs/ns/j-1234abcd/final/"
    assert "reported no result" in out["message"]


def test_conditions_verified_and_transition_times() -> None:
    first = derive_status(job(), observed=Observed(), expected=None, verification=PENDING, now=NOW)
    cond = get_condition(first, "TaskAppVerified")
    assert cond["status"] == "Unknown" and cond["lastTransitionTime"] == "2026-11-22T14:00:00Z"
    later = NOW + timedelta(seconds=30)
    second = derive_status(
        job(status=first), observed=Observed(), expected=None, verification=PENDING, now=later
    )
    assert get_condition(second, "TaskAppVerified")["lastTransitionTime"] == "2026-11-22T14:00:00Z"
    third = derive_status(
        job(status=second), observed=Observed(), expected=None, verification=BAD_KEY, now=later
    )
    cond = get_condition(third, "TaskAppVerified")
    assert cond["status"] == "False" and cond["reason"] == "Unauthorized"
    assert "HTTP 400" in cond["message"]
    assert cond["lastTransitionTime"] == "2026-11-22T14:00:30Z"
    assert get_condition(third, "Failed")["status"] == "True"
    assert third["completionTime"] == "2026-11-22T14:00:30Z"


def test_resume_after_suspend_sets_condition_false() -> None:
    suspended = derive_status(
        job(suspend=True), observed=Observed(), expected=EXPECTED, verification=OK, now=NOW
    )
    assert get_condition(suspended, "Suspended")["status"] == "True"
    resumed = derive_status(
        job(status=suspended), observed=all_children(), expected=EXPECTED, verification=OK, now=NOW
    )
    assert resumed["phase"] == "Running"
    assert get_condition(resumed, "Suspended")["status"] == "False"
    assert get_condition(resumed, "Suspended")["reason"] == "Resumed"


def test_status_patch_only_changes() -> None:
    out = derive_status(job(), observed=all_children(), expected=EXPECTED, verification=OK, now=NOW)
    assert status_patch(out, out) == {}
    assert status_patch({**out, "phase": "Provisioning"}, out) == {"phase": "Running"}


def test_set_condition_keeps_order() -> None:
    conds = set_condition([], "A", "True", "r", "m", NOW)
    conds = set_condition(conds, "B", "True", "r", "m", NOW)
    conds = set_condition(conds, "A", "False", "r2", "m2", NOW)
    assert [c["type"] for c in conds] == ["A", "B"]


def test_taskapp_status() -> None:
    ta = Owner("TaskApp", "math", "ns", UID, generation=1)
    info = {"id": "math", "name": "Arithmetic", "rubric": True}
    ok = taskapp_status(
        ta, {}, "http://t", Verification("ok", "TaskApp math", "fine", "Verified", 200, info), NOW
    )
    assert ok["verified"] is True and ok["taskInfo"] == info and ok["url"] == "http://t"
    cond = get_condition(ok, "Verified")
    assert cond["status"] == "True"
    outage = taskapp_status(
        ta,
        ok,
        "http://t",
        Verification("failed", "TaskApp math", "GET /health -> HTTP 503", "Unconfigured", 503),
        NOW + timedelta(minutes=1),
    )
    assert outage["verified"] is False and outage["taskInfo"] == info
    cond = get_condition(outage, "Verified")
    assert cond["status"] == "False" and "HTTP 503" in cond["message"] and cond["reason"] == "Unconfigured"


def test_pod_problems_show_in_message() -> None:
    from posttrain.controller.status import PodObs

    pod = PodObs.from_object(
        {
            "metadata": {"name": "j-trainer-0-x", "labels": {"posttrain.dev/role": "trainer"}},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ],
            },
        }
    )
    observed = all_children(trainer_obs=trainer(active=1, ready=0))
    observed.pods = [pod]
    out = derive_status(job(), observed=observed, expected=EXPECTED, verification=OK, now=NOW)
    assert out["phase"] == "Provisioning" and out["reason"] == "PodsNotReady"
    assert (
        "trainer pod Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu." in out["message"]
    )
    oom = PodObs.from_object(
        {
            "metadata": {"name": "p", "labels": {"posttrain.dev/role": "rollout"}},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "rollout", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {}}
                ],
            },
        }
    )
    assert oom.problem == "rollout: CrashLoopBackOff"


def test_suspended_trainer_message() -> None:
    observed = all_children(trainer_obs=trainer(suspended=True))
    out = derive_status(job(), observed=observed, expected=EXPECTED, verification=OK, now=NOW)
    assert out["phase"] == "Provisioning" and "trainer Job suspended" in out["message"]


def test_a_job_kueue_has_not_admitted_is_queued_with_kueues_reason() -> None:
    """A job with a queue waits, Queued, until Kueue admits its Workload; then it provisions as before."""
    short = "couldn't assign flavors to pod set trainer: insufficient quota for nvidia.com/gpu in flavor h100"
    queued = Admission(admitted=False, reason="Queued", message=short)
    out = derive_status(job(), observed=Observed(), expected=EXPECTED, verification=OK, now=NOW, admission=queued)
    assert (out["phase"], out["reason"], out["message"]) == ("Queued", "Queued", short)
    cond = next(c for c in out["conditions"] if c["type"] == "Admitted")
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "Queued", short)
    admitted = Admission(admitted=True, reason="Admitted", message="admitted by ClusterQueue gpus")
    later = job(status=out)
    out = derive_status(later, observed=all_children(), expected=EXPECTED, verification=OK, now=NOW,
                        admission=admitted)  # fmt: skip
    assert out["phase"] == "Running"
    assert next(c for c in out["conditions"] if c["type"] == "Admitted")["status"] == "True"
    evicted = Admission(admitted=False, reason="Evicted", message="evicted by Kueue (Preempted): ...")
    out = derive_status(job(status=out), observed=Observed(), expected=EXPECTED, verification=OK, now=NOW,
                        admission=evicted)  # fmt: skip
    assert (out["phase"], out["reason"]) == ("Queued", "Evicted")
    no_queue = derive_status(job(), observed=all_children(), expected=EXPECTED, verification=OK, now=NOW)
    assert not [c for c in no_queue["conditions"] if c["type"] == "Admitted"]


def test_a_preempted_job_is_queued_preempted_until_admitted_again_then_resumes() -> None:
    """Kueue preempts a running job: Queued with reason Preempted and condition Preempted True, through the
    passes where its fresh Workload waits (Kueue's own reason then is only Queued), naming the checkpoint
    it resumes from; admitted again, it runs, and the condition turns False (Readmitted)."""
    ckpt = "s3://posttrain/jobs/ns/j-1/checkpoints/step-7/"
    admitted = Admission(admitted=True, reason="Admitted", message="admitted")
    running = derive_status(job(status={"progress": {"step": 7, "lastCheckpoint": ckpt}}), observed=all_children(),
                            expected=EXPECTED, verification=OK, now=NOW, admission=admitted)  # fmt: skip
    assert running["phase"] == "Running" and not [c for c in running["conditions"] if c["type"] == "Preempted"]
    why = "preempted by Kueue (InClusterQueue): Preempted to accommodate a workload (UID: 1)"
    preempted = Admission(admitted=False, reason="Preempted", message=why)
    status = {**running, "progress": {"step": 7, "lastCheckpoint": ckpt}}
    out = derive_status(job(status=status), observed=all_children(), expected=EXPECTED, verification=OK,
                        now=NOW, admission=preempted)  # fmt: skip
    assert (out["phase"], out["reason"]) == ("Queued", "Preempted")
    assert out["message"].startswith(why) and ckpt in out["message"]
    cond = next(c for c in out["conditions"] if c["type"] == "Preempted")
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "Preempted", why)
    waiting = Admission(admitted=False, reason="Queued", message="insufficient quota for nvidia.com/gpu")
    later = NOW + timedelta(seconds=30)
    out = derive_status(job(status={**out, "progress": status["progress"]}), observed=Observed(), expected=EXPECTED,
                        verification=OK, now=later, admission=waiting)  # fmt: skip
    assert (out["phase"], out["reason"]) == ("Queued", "Preempted")
    assert "insufficient quota for nvidia.com/gpu" in out["message"] and ckpt in out["message"]
    assert next(c for c in out["conditions"] if c["type"] == "Preempted")["status"] == "True"
    out = derive_status(job(status={**out, "progress": status["progress"]}), observed=all_children(),
                        expected=EXPECTED, verification=OK, now=later, admission=admitted)  # fmt: skip
    assert out["phase"] == "Running"
    cond = next(c for c in out["conditions"] if c["type"] == "Preempted")
    assert (cond["status"], cond["reason"]) == ("False", "Readmitted") and ckpt in cond["message"]
    # a job queued for the first time is not called preempted
    fresh = derive_status(job(), observed=Observed(), expected=EXPECTED, verification=OK, now=NOW, admission=waiting)
    assert fresh["reason"] == "Queued" and not [c for c in fresh["conditions"] if c["type"] == "Preempted"]


def test_replica_failure_and_config_errors_show_in_the_message() -> None:
    """A server Deployment whose pods cannot even be created (quota, Pod Security) has no pod to say why:
    the Deployment's ReplicaFailure condition is the message; a pod that cannot start its container
    (CreateContainerConfigError: a missing Secret) says so too."""
    from posttrain.controller.status import PodObs

    dep = DeploymentObs.from_object(
        {
            "metadata": {"name": "j-rollout", "labels": {"posttrain.dev/role": "rollout"}},
            "spec": {"replicas": 1},
            "status": {
                "conditions": [
                    {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
                    {
                        "type": "ReplicaFailure",
                        "status": "True",
                        "reason": "FailedCreate",
                        "message": 'pods "j-rollout-abc" is forbidden: violates PodSecurity "restricted:latest"',
                    },
                ]
            },
        }
    )
    assert dep.problem.startswith('FailedCreate: pods "j-rollout-abc" is forbidden: violates PodSecurity')
    observed = all_children(ready=0)
    observed.deployments["j-rollout"] = dep
    observed.pods = [
        PodObs.from_object(
            {
                "metadata": {"name": "t", "labels": {"posttrain.dev/role": "trainer"}},
                "status": {
                    "phase": "Pending",
                    "containerStatuses": [
                        {"name": "trainer", "state": {"waiting": {"reason": "CreateContainerConfigError"}}}
                    ],
                },
            }
        )
    ]
    out = derive_status(job(), observed=observed, expected=EXPECTED, verification=OK, now=NOW)
    assert out["phase"] == "Provisioning" and out["reason"] == "PodsNotReady"
    assert "rollout FailedCreate: pods" in out["message"] and "violates PodSecurity" in out["message"]
    assert "trainer pod trainer: CreateContainerConfigError" in out["message"]


def test_ready_condition_and_generations() -> None:
    running = derive_status(job(), observed=all_children(), expected=EXPECTED, verification=OK, now=NOW)
    ready = get_condition(running, "Ready")
    assert ready["status"] == "True" and ready["reason"] == "Running"
    assert running["observedGeneration"] == 3
    assert all(c["observedGeneration"] == 3 for c in running["conditions"])
    # A pass that did not complete (verification still retrying) leaves observedGeneration where it was.
    partial = derive_status(
        job(status={"observedGeneration": 2}),
        observed=Observed(),
        expected=None,
        verification=PENDING,
        now=NOW,
        complete_pass=False,
    )
    assert partial["observedGeneration"] == 2 and partial["phase"] == "Verifying"
    assert get_condition(partial, "Ready")["status"] == "False"


def test_an_invalid_spec_fails_the_job_with_the_field() -> None:
    msg = "spec.model.source: 'ft:Qwen/Qwen3-4B:job_abc123' is not a posttrain fine-tuned model id (fix: ...)"
    out = derive_status(job(), observed=Observed(), expected=None, verification=OK, now=NOW, invalid=msg)
    assert (out["phase"], out["reason"], out["message"]) == ("Failed", "InvalidSpec", msg)
    assert get_condition(out, "Failed")["reason"] == "InvalidSpec" and out["completionTime"]
    assert get_condition(out, "Ready")["status"] == "False"


def test_taskapp_status_carries_message_reason_generation() -> None:
    ta = Owner("TaskApp", "math", "ns", UID, generation=4)
    out = taskapp_status(
        ta,
        {},
        "http://t",
        Verification("failed", "TaskApp math", "GET /health -> HTTP 503", "HTTPError", 503),
        NOW,
    )
    assert (out["observedGeneration"], out["reason"], out["message"]) == (
        4,
        "HTTPError",
        "GET /health -> HTTP 503",
    )
    assert get_condition(out, "Verified")["observedGeneration"] == 4
    assert get_condition(out, "Ready")["status"] == "False"


def test_a_trainer_that_finished_is_not_waited_for_before_the_job_is_complete():
    """On the real dev node, between the trainer pod's exit 0 and the Job's Complete condition, a Running job
    showed "Provisioning: waiting for trainer 0/1 pods ready; trainer pod trainer: exit code 137" (the pod
    killed earlier in the run). A finished trainer pod is done, not awaited."""
    pods = [
        PodObs("j-trainer-0-a", "trainer", "Failed", "trainer: exit code 137"),
        PodObs("j-trainer-0-b", "trainer", "Succeeded"),
    ]
    running = job(status={"phase": "Running"})
    for trainer_obs in (trainer(active=0, ready=0), trainer(active=0, ready=0, succeeded=1)):
        observed = all_children(trainer_obs=trainer_obs)
        observed.pods = [pods[1]] if trainer_obs.succeeded else pods
        out = derive_status(running, observed=observed, expected=EXPECTED, verification=OK, now=NOW)
        assert out["phase"] == "Running", out["message"]
    replacing = all_children(trainer_obs=trainer(active=1, ready=0))
    replacing.pods = [pods[0], PodObs("j-trainer-0-c", "trainer", "Pending")]
    out = derive_status(running, observed=replacing, expected=EXPECTED, verification=OK, now=NOW)
    assert out["phase"] == "Provisioning" and "exit code 137" in out["message"]


def test_a_trainer_that_reported_its_result_is_finishing_not_provisioning():
    """Without a pod watch the operator sees only the Job: its pod stops being ready before the Job counts it
    succeeded. A job whose trainer has reported its final result stays Running in that moment (make e2e saw
    Running -> Provisioning -> Succeeded); without a result it is a pod to wait for again."""
    result = {"fineTunedModel": "rl:base:ns.j.1234abcd"}
    exiting = all_children(trainer_obs=trainer(active=1, ready=0))
    out = derive_status(job(status={"phase": "Running", "result": result}), observed=exiting, expected=EXPECTED,
                        verification=OK, now=NOW)  # fmt: skip
    assert out["phase"] == "Running" and "finishing" in out["message"]
    out = derive_status(job(status={"phase": "Running"}), observed=exiting, expected=EXPECTED, verification=OK,
                        now=NOW)  # fmt: skip
    assert out["phase"] == "Provisioning"
    done = all_children(trainer_obs=trainer(active=0, ready=0, succeeded=1, conds=[("Complete", "True", "", "")]))
    out = derive_status(job(status={"phase": "Running", "result": result}), observed=done, expected=EXPECTED,
                        verification=OK, now=NOW)  # fmt: skip
    assert out["phase"] == "Succeeded"
