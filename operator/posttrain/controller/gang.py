"""All-or-nothing admission through Kueue, the I/O half (render/workload.py is the pure half): a job with
spec.scheduling.queueName has one Workload, made here, read on each pass; its children stay held (no pods)
until Kueue admits it. The Workload goes when the job ends or is suspended (Kueue releases its quota), and
when Kueue evicts it (preemption): its pods are held again and a fresh Workload queues the job anew."""

from __future__ import annotations

import logging

from posttrain.controller.kube import KubeError, object_path
from posttrain.controller.objects import Job, Owner
from posttrain.controller.render import Rendered
from posttrain.controller.render.workload import KUEUE_API, admission, render_workload, workload_name
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
        try:
            await rt.kube.create(render_workload(job.owner, rendered.children, queue))
        except KubeError as err:
            if err.status == 404:
                return Admission(False, "KueueMissing", f"spec.scheduling.queueName is {queue!r}, but this "
                                 "cluster has no Kueue (kueue.x-k8s.io/v1beta2 Workloads): install Kueue or "
                                 "remove the queue name")  # fmt: skip
            raise
    admitted, reason, message = admission(found)
    if reason == "Evicted":
        logger.info("%s %s: Kueue evicted it; holding its pods and queueing it again", job.owner.kind,
                    job.owner.name)  # fmt: skip
        await release(rt, job.owner)
    return Admission(admitted, reason, message)
