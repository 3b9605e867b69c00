"""render/workload.py: one Kueue Workload per job, asking for every pod of its topology at once."""

from __future__ import annotations

from posttrain.api.resources import JobScheduling
from posttrain.controller import render
from posttrain.controller.render.workload import (
    admission,
    held,
    priority_class,
    render_workload,
    workload_name,
)
from test_render import SETTINGS, TARGET, by, rljob


def test_one_workload_holds_every_pod_of_the_topology() -> None:
    job = rljob(scheduling={"queueName": "team-a", "tolerations": [{"key": "gpu", "operator": "Exists"}]},
                compute={"gpuType": "H100", "gpuCount": 16, "nodes": 2,
                         "topology": {"gpusForVllm": 4, "gpusForTraining": 8, "gpusForRef": 4,
                                      "tensorParallel": 2}})  # fmt: skip
    out = render.render_rljob(job, SETTINGS, TARGET)
    wl = render_workload(job.owner, out.children, "team-a")
    assert wl["apiVersion"] == "kueue.x-k8s.io/v1beta2" and wl["kind"] == "Workload"
    assert wl["metadata"]["name"] == workload_name("math-rl") == "math-rl-workload"
    assert wl["metadata"]["ownerReferences"][0]["uid"] == job.owner.uid
    assert wl["spec"]["queueName"] == "team-a"
    sets = {p["name"]: p for p in wl["spec"]["podSets"]}
    assert {n: p["count"] for n, p in sets.items()} == {"rollout": 2, "reference": 1, "trainer": 2}
    gpus = {n: p["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            for n, p in sets.items()}  # fmt: skip
    assert gpus == {"rollout": "2", "reference": "4", "trainer": "4"}  # 2x2 + 4 + 2x4 = 16 GPUs together
    trainer = sets["trainer"]["template"]["spec"]
    # Kueue sees what places the pod: its GPU type's affinity and the user's tolerations; not its env.
    terms = trainer["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == "nvidia.com/gpu.product"
    assert trainer["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert "env" not in trainer["containers"][0] and "volumes" not in trainer
    assert [c["name"] for c in trainer["initContainers"]] == [
        c["name"] for c in by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["initContainers"]
    ]


def test_held_children_have_no_pods_until_admitted() -> None:
    out = render.render_rljob(rljob(scheduling={"queueName": "q"}), SETTINGS, TARGET)
    kept = held(out.children)
    assert [c["metadata"]["name"] for c in kept] == [c["metadata"]["name"] for c in out.children]
    assert all(d["spec"]["replicas"] == 0 for d in kept if d["kind"] == "Deployment")
    assert by(kept, "Job", "trainer")["spec"]["suspend"] is True
    assert by(out.children, "Job", "trainer")["spec"]["suspend"] is False  # the rendered ones untouched


def test_admission_in_kueues_words() -> None:
    assert admission(None)[0] is False
    short = "couldn't assign flavors to pod set trainer: insufficient unused quota for nvidia.com/gpu"
    pending = {"spec": {"queueName": "q"},
               "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
                                          "message": short}]}}  # fmt: skip
    assert admission(pending) == (False, "Queued", short)
    admitted = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"},
                                          {"type": "Admitted", "status": "True", "message": "ok"}]}}  # fmt: skip
    assert admission(admitted) == (True, "Admitted", "ok")
    preempted = {"status": {"conditions": [
        {"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"},  # until released
        {"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate a workload"},
        {"type": "Preempted", "status": "True", "reason": "InClusterQueue",
         "message": "Preempted to accommodate a workload (UID: 1) due to prioritization in the ClusterQueue"}]}}  # fmt: skip
    assert admission(preempted) == (False, "Preempted", "preempted by Kueue (InClusterQueue): Preempted to "
                                    "accommodate a workload (UID: 1) due to prioritization in the ClusterQueue")  # fmt: skip
    evicted = {"status": {"conditions": [{"type": "Evicted", "status": "True", "reason": "Deactivated",
                                          "message": "stopped"}]}}  # fmt: skip
    assert admission(evicted)[:2] == (False, "Evicted")


def test_the_workload_carries_the_jobs_priority_class_and_its_value() -> None:
    out = render.render_rljob(rljob(scheduling={"queueName": "q"}), SETTINGS, TARGET)
    plain = render_workload(rljob().owner, out.children, "q")
    assert "priority" not in plain["spec"] and "priorityClassRef" not in plain["spec"]
    cls = ("kueue.x-k8s.io", "WorkloadPriorityClass", "high")
    wl = render_workload(rljob().owner, out.children, "q", (cls, 1000))
    assert wl["spec"]["priorityClassRef"] == {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": "high"}
    assert wl["spec"]["priority"] == 1000  # Kueue's CEL rule: a class reference needs the value beside it
    # Kueue's own choice: the WorkloadPriorityClass, else the pods' PriorityClass, else none (priority 0)
    assert priority_class(None) is None and priority_class(JobScheduling()) is None
    both = JobScheduling(workload_priority_class_name="high", priority_class_name="gpu-pods")
    assert priority_class(both) == cls
    assert priority_class(JobScheduling(priority_class_name="gpu-pods")) == (
        "scheduling.k8s.io", "PriorityClass", "gpu-pods")  # fmt: skip
