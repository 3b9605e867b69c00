"""Pure: all-or-nothing admission of a job through Kueue. A job with spec.scheduling.queueName gets one
Kueue Workload (kueue.x-k8s.io/v1beta2) that asks for every pod of its topology at once: one pod set per
role (trainer x nodes, rollout x replicas, reference, judge), each with the pod's own resources and node
constraints (the GPU type's affinity, the user's nodeSelector and tolerations), so Kueue's flavor
assignment and quota see the whole job. Until Kueue admits it (condition Admitted), the job's children
exist but are held: Deployments at zero replicas, the trainer Job suspended. So a job's GPUs are taken all
together or not at all, and two half-admitted jobs can never wait for each other.

The children themselves carry no queue label (Kueue would make a second, partial Workload of the trainer
Job). posttrain writes the Workload whole (Kueue's admission webhooks, which would default it, are not
required: see posttrain_dev.kueue), and deletes it when the job ends or is suspended, which releases the
quota.

Priority: the job's spec.scheduling.workloadPriorityClassName (a Kueue WorkloadPriorityClass), else its
priorityClassName (a pod PriorityClass), as Kueue's own job integrations choose; the Workload carries the
class and its value (Kueue's webhook, which would fill the value in, does not run: controller/gang.py reads
the class). A ClusterQueue with preemption.withinClusterQueue LowerPriority then preempts a lower-priority
job for a higher one: Kueue marks its Workload Evicted (reason Preempted), the job's pods are held again
(the trainer checkpoints on SIGTERM) and it waits, Queued with reason Preempted, to be admitted anew.
docs/how-to/gpu-scheduling.md."""

from __future__ import annotations

import copy
from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render import pods
from posttrain.controller.render.names import child_name
from posttrain.controller.settings import LABEL_ROLE

KUEUE_API = "kueue.x-k8s.io/v1beta2"
ROLE_WORKLOAD = "workload"
# What Kueue reads of a pod to place and count it; the rest of the pod (env, volumes, probes) stays out.
_POD_FIELDS = ("nodeSelector", "affinity", "tolerations", "priorityClassName", "runtimeClassName", "overhead")


def workload_name(job_name: str) -> str:
    return child_name(job_name, ROLE_WORKLOAD)


def _container(c: dict[str, Any]) -> dict[str, Any]:
    return {"name": c["name"], "image": c.get("image", ""), "resources": c.get("resources") or {}}


def _pod_set(role: str, count: int, template: dict[str, Any]) -> dict[str, Any]:
    spec = template["spec"]
    pod: dict[str, Any] = {"containers": [_container(c) for c in spec["containers"]]}
    if spec.get("initContainers"):
        pod["initContainers"] = [_container(c) for c in spec["initContainers"]]
    pod.update({k: copy.deepcopy(spec[k]) for k in _POD_FIELDS if spec.get(k)})
    return {"name": role, "count": count, "template": {"spec": pod}}


def pod_sets(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One pod set per Deployment (its replicas) and for the trainer Job (its parallelism), in the
    children's order; a set of zero pods is left out."""
    out = []
    for child in children:
        spec = child.get("spec") or {}
        if child["kind"] == "Deployment":
            count = int(spec.get("replicas") or 0)
        elif child["kind"] == "Job":
            count = int(spec.get("parallelism") or 1)
        else:
            continue
        if count > 0:
            out.append(_pod_set(child["metadata"]["labels"][LABEL_ROLE], count, spec["template"]))
    return out


def priority_class(scheduling: Any) -> tuple[str, str, str] | None:
    """(group, kind, name) of the class that sets the job's priority in Kueue, or None (priority 0)."""
    if scheduling is None:
        return None
    if getattr(scheduling, "workload_priority_class_name", None):
        return "kueue.x-k8s.io", "WorkloadPriorityClass", scheduling.workload_priority_class_name
    if scheduling.priority_class_name:
        return "scheduling.k8s.io", "PriorityClass", scheduling.priority_class_name
    return None


def render_workload(
    owner: Owner,
    children: list[dict[str, Any]],
    queue: str,
    priority: tuple[tuple[str, str, str], int] | None = None,
) -> dict[str, Any]:
    """The job's Workload in LocalQueue `queue`, owned by the job; `priority` is (its class, the value)."""
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets(children)}
    if priority is not None:
        (group, kind, name), value = priority
        spec["priorityClassRef"] = {"group": group, "kind": kind, "name": name}
        spec["priority"] = int(value)
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": pods.child_meta(owner, workload_name(owner.name), ROLE_WORKLOAD),
        "spec": spec,
    }


def held(children: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The children of a job Kueue has not admitted (or has evicted): the same objects, with no pod."""
    out = []
    for child in children:
        if child["kind"] == "Deployment":
            child = {**child, "spec": {**child["spec"], "replicas": 0}}
        elif child["kind"] == "Job":
            child = {**child, "spec": {**child["spec"], "suspend": True}}
        out.append(child)
    return out


def admission(workload: dict[str, Any] | None) -> tuple[bool, str, str]:
    """(admitted, reason, message) from a Workload's status: admitted once Kueue's Admitted condition is
    True; else why not, in Kueue's words (its QuotaReserved/Evicted condition: which quota is short)."""
    if workload is None:
        return False, "Queued", "waiting for the job's Kueue Workload to be created"
    conds = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    evicted = conds.get("Evicted") or {}
    # An evicted Workload stays Admitted until its quota is released (posttrain deletes it): eviction first.
    if evicted.get("status") == "True":
        if evicted.get("reason") == "Preempted":  # Kueue's Preempted condition says by whom and why
            preempted = conds.get("Preempted") or {}
            why = preempted.get("message") or evicted.get("message") or "for a higher-priority workload"
            return False, "Preempted", f"preempted by Kueue ({preempted.get('reason') or 'Preempted'}): {why}"
        return False, "Evicted", f"evicted by Kueue ({evicted.get('reason')}): {evicted.get('message', '')}"
    if (conds.get("Admitted") or {}).get("status") == "True":
        return True, "Admitted", (conds["Admitted"].get("message") or "admitted by Kueue")
    reserved = conds.get("QuotaReserved") or {}
    queue = (workload.get("spec") or {}).get("queueName", "")
    message = reserved.get("message") or f"waiting in Kueue LocalQueue {queue}"
    return False, "Queued", message
