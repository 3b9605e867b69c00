"""All-or-nothing admission through Kueue, the I/O half (render/workload.py is the pure half): a job with
spec.scheduling.queueName has one Workload, made here, read on each pass; its children stay held (no pods)
until Kueue admits it. The Workload goes when the job ends or is suspended (Kueue releases its quota), and
when Kueue evicts it (preemption): its pods are held again (the trainer checkpoints on SIGTERM) and a fresh
Workload, of the same priority, queues the job anew; once admitted, its new trainer pods resume from the last
checkpoint."""

from __future__ import annotations

import logging

from posttrain.controller.kube import KubeError, object_path
from posttrain.controller.objects import Job, Owner
from posttrain.controller.render import Rendered
from posttrain.controller.render.workload import (
    KUEUE_API,
    admission,
    priority_class,
    render_workload,
    workload_name,
)
from posttrain.controller.runtime import Runtime
from posttrain.controller.status import Admission

logger = logging.getLogger(__name__)


def queue_of(job: Job) -> str | None:
    return job.spec.scheduling.queue_name if job.spec.scheduling else None


def _path(owner: Owner) -> str:
    return object_path(KUEUE_API, "Workload", owner.namespace, workload_name(owner.name))


async def release(rt: Runtime, owner: Owner) -> None:
    """Delete the job's Workload (absent is fine): Kueue gives its quota back."""
    try:
        await rt.kube.delete(_path(owner))
    except KubeError as err:
        if err.status != 404:  # no Kueue API at all: nothing to release
            raise


async def _priority_value(rt: Runtime, cls: tuple[str, str, str]) -> int | None:
    """The value of a (Workload)PriorityClass, None when there is no such class."""
    group, kind, name = cls
    found = await rt.kube.get(object_path(f"{group}/v1" if group == "scheduling.k8s.io" else KUEUE_API, kind,
                                          None, name))  # fmt: skip
    return None if found is None else int(found.get("value") or 0)


async def admission_of(rt: Runtime, job: Job, rendered: Rendered) -> Admission | None:
    """Kueue's word on a job with a queue (None for one without, or suspended: its Workload goes)."""
    queue = queue_of(job)
    if not queue:
        return None
    if job.spec.suspend:
        await release(rt, job.owner)
        return None
    found = await rt.kube.get(_path(job.owner))
    if found is None:
        priority = None
        if (cls := priority_class(job.spec.scheduling)) is not None:
            value = await _priority_value(rt, cls)
            if value is None:
                group, kind, name = cls
                field = "workloadPriorityClassName" if kind == "WorkloadPriorityClass" else "priorityClassName"
                return Admission(False, "PriorityClassNotFound", f"spec.scheduling.{field}: no {kind} "
                                 f"{name!r} ({group}) in this cluster: create it, or name another")  # fmt: skip
            priority = (cls, value)
        try:
            await rt.kube.create(render_workload(job.owner, rendered.children, queue, priority))
        except KubeError as err:
            if err.status == 404:
                return Admission(False, "KueueMissing", f"spec.scheduling.queueName is {queue!r}, but this "
                                 "cluster has no Kueue (kueue.x-k8s.io/v1beta2 Workloads): install Kueue or "
                                 "remove the queue name")  # fmt: skip
            raise
    admitted, reason, message = admission(found)
    if reason in ("Evicted", "Preempted"):
        logger.info("%s %s: Kueue evicted it (%s); holding its pods and queueing it again", job.owner.kind,
                    job.owner.name, reason)  # fmt: skip
        await release(rt, job.owner)
    return Admission(admitted, reason, message)
