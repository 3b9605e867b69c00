"""The operator's cost cutters, pure: which watch events wake a loop, when a status is written, the plan
rendered once per (uid, generation, task app), children counted as present once applied, and the loop
registry that replaces kopf's daemons."""

from __future__ import annotations

import asyncio
from typing import Any

from fixtures.jobs import job_object, rl_spec
from posttrain.controller.apply import with_applied
from posttrain.controller.job_loops import JobLoops
from posttrain.controller.objects import parse_job
from posttrain.controller.reconcile_job import JobState, planned
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.status import DeploymentObs, Observed, PodObs, TrainerObs, status_write_needed
from posttrain.controller.wake import child_wakes, object_wakes, pod_wakes, trigger_of


def body(generation: int = 1, status: dict[str, Any] | None = None, uid: str = "u1", **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "ns", "uid": uid, "generation": generation, **meta},
            "status": status or {}}  # fmt: skip


# ----------------------------------------------------------------------------------------- wake filter
def test_status_patches_do_not_wake_a_job_but_its_spec_deletion_and_result_do() -> None:
    first = trigger_of(body())
    assert not object_wakes(None, first)  # the first sighting starts the loop instead
    own = trigger_of(body(status={"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}))
    progress = trigger_of(body(status={"phase": "Running", "progress": {"step": 3}}))
    assert not object_wakes(first, own) and not object_wakes(own, progress)
    assert object_wakes(first, trigger_of(body(generation=2)))  # suspend / resume
    assert object_wakes(first, trigger_of(body(deletionTimestamp="2026-01-01T00:00:00Z")))
    result = trigger_of(body(status={"result": {"fineTunedModel": "rl:m:ns.j.u1"}}))
    assert object_wakes(progress, result)
    assert not object_wakes(result, trigger_of(body(status={"result": {"fineTunedModel": "rl:m:ns.j.u1"},
                                                             "progress": {"step": 9}})))  # fmt: skip


def test_a_child_wakes_its_job_on_readiness_and_problems_only() -> None:
    made = DeploymentObs("j-rollout", "rollout", 1, 0)
    assert not child_wakes(None, made)  # its own create: the loop counted it already
    assert child_wakes(made, DeploymentObs("j-rollout", "rollout", 1, 1))
    assert not child_wakes(made, DeploymentObs("j-rollout", "rollout", 1, 0))  # a resourceVersion bump
    assert child_wakes(None, DeploymentObs("j-rollout", "rollout", 1, 0, problem="ReplicaFailure: quota"))
    assert child_wakes(None, DeploymentObs("j-rollout", "rollout", 1, 1))  # seen ready (after a restart)
    trainer = TrainerObs("j-trainer")
    assert not child_wakes(None, trainer)
    assert child_wakes(trainer, TrainerObs("j-trainer", active=1, ready=1))
    assert child_wakes(None, TrainerObs("j-trainer", conditions=(("Complete", "True", "", ""),)))


def test_a_pod_wakes_its_job_for_a_problem_or_a_finished_trainer_not_for_running() -> None:
    pending = PodObs("p", "trainer", "Pending")
    assert not pod_wakes(None, pending)
    assert not pod_wakes(pending, PodObs("p", "trainer", "Running"))
    assert pod_wakes(pending, PodObs("p", "trainer", "Pending", "Unschedulable: 0/1 nodes"))
    assert pod_wakes(PodObs("p", "trainer", "Pending", "x"), PodObs("p", "trainer", "Running"))  # resolved
    assert pod_wakes(PodObs("p", "trainer", "Running"), PodObs("p", "trainer", "Succeeded"))


# ----------------------------------------------------------------------------------------- status writes
def cond(ctype: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message, "observedGeneration": 1}


def test_status_is_written_at_once_for_decisions_and_rarely_for_words() -> None:
    current = {"phase": "Provisioning", "message": "waiting for rollout 0/1 ready",
               "conditions": [cond("Ready", "False", "WaitingForPods", "waiting for rollout 0/1 ready")]}  # fmt: skip
    reworded = {"message": "waiting for trainer 0/1 pods ready",
                "conditions": [cond("Ready", "False", "WaitingForPods", "waiting for trainer 0/1 pods ready")]}  # fmt: skip
    assert not status_write_needed(current, {}, since_last_write=99, interval=10)
    assert not status_write_needed(current, reworded, since_last_write=1, interval=10)
    assert status_write_needed(current, reworded, since_last_write=10, interval=10)
    running = {"phase": "Running", "message": "trainer and servers are running",
               "conditions": [cond("Ready", "True", "Running", "trainer and servers are running")]}  # fmt: skip
    assert status_write_needed(current, running, since_last_write=0, interval=10)
    # a new reason (a problem found) is a decision even with the phase unchanged
    problem = {"message": "waiting; rollout FailedCreate",
               "conditions": [cond("Ready", "False", "PodsNotReady", "waiting; rollout FailedCreate")]}  # fmt: skip
    assert status_write_needed(current, problem, since_last_write=0, interval=10)
    assert status_write_needed(current, {"fineTunedModel": "rl:m"}, since_last_write=0, interval=10)


# ------------------------------------------------------------------------------------------- plan cache
def rljob(generation: int = 1) -> Any:
    obj = job_object("RLJob", rl_spec(model={"base": "m"}))
    obj["metadata"]["generation"] = generation
    return parse_job(obj)


def test_the_plan_is_rendered_once_per_uid_generation_and_task_app() -> None:
    settings = OperatorSettings()
    rt: Any = type("Rt", (), {"settings": settings})()
    state = JobState()
    target = TaskAppTarget("http://t", "s")
    first = planned(rt, rljob(), target, state)
    assert first is not None and planned(rt, rljob(), target, state) is first
    assert planned(rt, rljob(generation=2), target, state) is not first
    moved = planned(rt, rljob(generation=2), TaskAppTarget("http://elsewhere", "s"), state)
    assert moved is not None and moved.key[2].url == "http://elsewhere"
    assert planned(rt, rljob(), None, state) is None  # an RLJob is rendered once its task app is verified


def test_children_applied_in_a_pass_count_as_present_not_ready() -> None:
    rt: Any = type("Rt", (), {"settings": OperatorSettings()})()
    plan = planned(rt, rljob(), TaskAppTarget("http://t", "s"), JobState())
    assert plan is not None
    seen = with_applied(Observed(), plan.rendered.children)
    assert {n: d.ready for n, d in seen.deployments.items()} == {n: 0 for n in plan.expected.deployments}
    assert seen.trainer is not None and seen.trainer.name == plan.expected.trainer and seen.trainer.ready == 0
    assert set(plan.expected.others) <= seen.others


# ------------------------------------------------------------------------------------------- loop registry
def test_loops_start_once_wake_on_triggers_and_stop_on_deletion() -> None:
    async def scenario() -> None:
        loops = JobLoops()
        started: list[str] = []
        release = asyncio.Event()

        def start() -> Any:
            async def loop() -> None:
                started.append("loop")
                await release.wait()

            return loop()

        key = ("ns", "rljob", "j")
        assert not loops.seen(key, None, body(), start)
        await asyncio.sleep(0)
        assert started == ["loop"] and key in loops.tasks
        assert not loops.seen(key, "MODIFIED", body(status={"phase": "Running"}), start)  # own patch
        assert loops.seen(key, "MODIFIED", body(generation=2), start)  # wake
        assert loops.body(key, "u1")["metadata"]["generation"] == 2
        assert loops.body(key, "other-uid") is None
        release.set()
        await asyncio.sleep(0.01)
        assert key not in loops.tasks and loops.finished[key] == "u1"  # finished: terminal
        assert not loops.seen(key, "MODIFIED", body(generation=2, status={"progress": 1}), start)
        assert started == ["loop"]  # a finished job's status patches start nothing
        release.clear()
        loops.seen(key, "MODIFIED", body(generation=3), start)  # a spec change looks again
        await asyncio.sleep(0)
        assert started == ["loop", "loop"]
        task = loops.tasks[key]
        loops.seen(key, "DELETED", body(generation=3), start)
        await asyncio.sleep(0)
        assert task.cancelled() and key not in loops.bodies and key not in loops.finished
        await loops.stop()

    asyncio.run(scenario())


def test_a_job_is_stuck_after_provisioning_for_a_while_and_not_before() -> None:
    from posttrain.controller.reconcile_job import stuck_for

    state = JobState()
    assert stuck_for(state, "Provisioning", 100.0, {}) == 0.0
    assert stuck_for(state, "Provisioning", 116.0, {}) == 16.0
    assert stuck_for(state, "Running", 117.0, {}) == 0.0 and state.provisioning_since is None
    assert stuck_for(state, "Provisioning", 200.0, {}) == 0.0  # a new wait starts from scratch
    # a restarted operator: the status says since when the job has been Provisioning
    since = {"phase": "Provisioning", "conditions": [
        {"type": "Ready", "status": "False", "lastTransitionTime": "1970-01-01T00:01:40Z"}]}  # fmt: skip
    assert stuck_for(JobState(), "Provisioning", 130.0, since) == 30.0


def test_a_trainer_pod_counted_in_two_steps_is_finished_at_the_first() -> None:
    job = {"metadata": {"name": "j-trainer"}, "spec": {"completions": 1},
           "status": {"ready": 0, "uncountedTerminatedPods": {"succeeded": ["pod-uid"]}}}  # fmt: skip
    assert TrainerObs.from_object(job).succeeded == 1
