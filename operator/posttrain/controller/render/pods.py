"""Pure: the parts every child shares. Its metadata (owner, labels), and what every pod of a job gets: the
job's scheduling (node selector, tolerations, priority, the GPU type's nodes), its resources, its image per role,
and the environment that reaches S3 (the keys only ever as secretKeyRefs)."""

from __future__ import annotations

import re
from typing import Any

from posttrain.api.resources import QUANTITY_PATTERN, JobSpecCommon, ResourceRequirements, Scheduling
from posttrain.controller.objects import Owner
from posttrain.controller.render import gpu
from posttrain.controller.render.names import ROLE_JUDGE, ROLE_REFERENCE, ROLE_TRAINER
from posttrain.controller.settings import (
    LABEL_JOB,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGER,
    OperatorSettings,
)
from posttrain.controller.spec_errors import SpecError

S3_KEY_ENV = ("S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY")
SHM_VOLUME = "dshm"


def owner_reference(owner: Owner) -> dict[str, Any]:
    return {
        "apiVersion": owner.api_version,
        "kind": owner.kind,
        "name": owner.name,
        "uid": owner.uid,
        # No blockOwnerDeletion: setting it needs `update` on the owner's finalizers subresource
        # (OwnerReferencesPermissionEnforcement), which the operator does not hold; without it a
        # foreground deletion of the job does not wait for the garbage collector to remove the children.
        "controller": True,
    }


def labels(owner: Owner, role: str) -> dict[str, str]:
    return {
        LABEL_JOB: owner.name,
        LABEL_ROLE: role,
        LABEL_KIND: owner.kind.lower(),
        LABEL_MANAGED_BY: MANAGER,
    }


def selector(owner: Owner, role: str) -> dict[str, str]:
    """What a Service or Deployment of `role` selects: the owner's pods of that role."""
    return {LABEL_JOB: owner.name, LABEL_ROLE: role}


def child_meta(owner: Owner, name: str, role: str, extra_labels: dict[str, str] | None = None) -> dict:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": {**labels(owner, role), **(extra_labels or {})},
        "ownerReferences": [owner_reference(owner)],
    }


def pod_scheduling(scheduling: Scheduling | None) -> dict[str, Any]:
    """nodeSelector, tolerations and priorityClassName of a pod spec, from spec.scheduling."""
    out: dict[str, Any] = {}
    if scheduling is None:
        return out
    if scheduling.node_selector:
        out["nodeSelector"] = dict(scheduling.node_selector)
    if scheduling.tolerations:
        out["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in scheduling.tolerations]
    if scheduling.priority_class_name:
        out["priorityClassName"] = scheduling.priority_class_name
    return out


def gpu_placement(spec: JobSpecCommon, gpus: int, settings: OperatorSettings) -> dict[str, Any]:
    """The `affinity` of a pod asking for `gpus` GPUs: nodes carrying compute.gpuType (render/gpu.py)."""
    compute = getattr(spec, "compute", None)
    gpu_type = compute.gpu_type if compute is not None else None
    affinity = gpu.gpu_affinity(gpu_type, gpus, settings.gpu_node_label, settings.gpu_products)
    return {"affinity": affinity} if affinity else {}


def _checked(given: ResourceRequirements | None, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(requests, limits), every value a Kubernetes quantity (the CRD's pattern, held here too in case the
    API server's CRD is older than this operator)."""
    if given is None:
        return {}, {}
    for kind, values in (("requests", given.requests), ("limits", given.limits)):
        for name, value in (values or {}).items():
            if not isinstance(value, int) and not re.fullmatch(QUANTITY_PATTERN, str(value)):
                raise SpecError(
                    f"scheduling.resources.{where}{kind}.{name}",
                    f"{value!r} is not a Kubernetes quantity",
                    "e.g. 500m, 4, 16Gi",
                )
    return dict(given.requests or {}), dict(given.limits or {})


def default_resources(
    requests: dict[str, Any], limits: dict[str, Any], default_requests: dict[str, str], default_limits: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(requests, limits) with the operator's defaults for what the spec left out: a request only where the
    spec sets neither that resource's request nor its limit (Kubernetes requests the limit then), a limit
    only where it sets neither (a limit below the spec's own request would be refused)."""
    given_requests, given_limits = dict(requests), dict(limits)
    requests, limits = dict(requests), dict(limits)
    for name, value in default_requests.items():
        if name not in given_requests and name not in given_limits:
            requests[name] = value
    for name, value in default_limits.items():
        if name not in given_limits and name not in given_requests:
            limits[name] = value
    return requests, limits


def resources(spec: JobSpecCommon, role: str, gpus: int, settings: OperatorSettings) -> dict[str, Any]:
    """spec.scheduling.resources (for every role, then the role's own on top) plus the role's GPUs."""
    given = spec.scheduling.resources if spec.scheduling else None
    every_requests, every_limits = _checked(given, "")
    per_role = getattr(given, role, None) if given is not None else None
    role_requests, role_limits = _checked(per_role, f"{role}.")
    requests = {**every_requests, **role_requests}
    limits = {**every_limits, **role_limits}
    requests, limits = default_resources(requests, limits, settings.default_requests, settings.default_limits)
    if gpus > 0:
        requests[settings.gpu_resource] = str(gpus)
        limits[settings.gpu_resource] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def image(spec: JobSpecCommon, role: str, settings: OperatorSettings) -> str:
    """spec.images.<role> when set; else the operator's image for the role."""
    override = getattr(spec.images, role, None) if spec.images else None
    if override:
        return str(override)
    if role == ROLE_TRAINER:
        return settings.trainer_image
    if role == ROLE_REFERENCE:
        return settings.reference_image or settings.rollout_image
    if role == ROLE_JUDGE:
        return settings.judge_image or settings.rollout_image
    return settings.rollout_image


def s3_env(spec: JobSpecCommon, settings: OperatorSettings) -> list[dict[str, Any]]:
    """S3_ENDPOINT, and the keys from spec.storage.secretRef (the operator's S3 Secret otherwise)."""
    secret_ref = spec.storage.secret_ref if spec.storage else None
    secret = (secret_ref.name if secret_ref else None) or settings.s3_secret_name
    env: list[dict[str, Any]] = [{"name": "S3_ENDPOINT", "value": settings.s3_endpoint}]
    for key in S3_KEY_ENV:
        env.append(
            {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        )
    return env


def shm(settings: OperatorSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """A memory-backed /dev/shm (volume, mount). A container's own /dev/shm is 64 MiB: vLLM's engine needs
    more for its shared-memory ring buffer (160 MiB on the smallest model), and NCCL and torch's
    multi-process data paths use it too."""
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if settings.shm_size_limit:
        empty_dir["sizeLimit"] = settings.shm_size_limit
    return {"name": SHM_VOLUME, "emptyDir": empty_dir}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def plain_env(settings: OperatorSettings) -> list[dict[str, Any]]:
    """The operator's extra environment for every container (never a secret)."""
    return [{"name": k, "value": v} for k, v in sorted(settings.extra_env.items())]
