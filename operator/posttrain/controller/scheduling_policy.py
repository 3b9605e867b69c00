"""Pure: what a tenant's spec may ask of the scheduler. A namespace is a hostile tenant: left to itself a
job could name the cluster's highest PriorityClass (and preempt other tenants' admitted trainers), tolerate
every taint (`{operator: Exists}`), choose control-plane nodes by nodeSelector, or skip Kueue's quota by
leaving out `queueName`. The operator's settings list what is allowed (controller/settings.py); a spec that
asks for more fails with reason InvalidSpec and a message naming the field and the setting to change. By
default nothing is allowed beyond what the operator sets itself (the GPU type's node affinity,
render/gpu.py)."""

from __future__ import annotations

from typing import Any

from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError

ANY = "*"


def entries(value: str) -> list[str]:
    """A comma-separated setting as its entries (blanks dropped)."""
    return [part.strip() for part in value.split(",") if part.strip()]


def _env(setting: str) -> str:
    return f"POSTTRAIN_{setting.upper()}"


def _refuse(field: str, what: str, setting: str, value: str) -> SpecError:
    return SpecError(
        field,
        f"{what} is not allowed by this cluster's operator",
        f"remove it, or a cluster admin adds {value!r} to the operator setting {_env(setting)}",
    )


def _class_allowed(name: str, allowed: str) -> bool:
    names = entries(allowed)
    return ANY in names or name in names


def toleration_allowed(toleration: dict[str, Any], allowed: str) -> bool:
    """A toleration names a taint key listed in `allowed` (a `key` entry allows any value and effect of that
    key; `key=value` only that value). A toleration without a key tolerates every taint: only `*` allows it."""
    names = entries(allowed)
    if ANY in names:
        return True
    key = toleration.get("key") or ""
    if not key:
        return False
    value = toleration.get("value") or ""
    exists = toleration.get("operator") == "Exists"
    return key in names or (not exists and f"{key}={value}" in names)


def node_selector_allowed(key: str, value: str, allowed: str) -> bool:
    """A nodeSelector term whose key is listed (`key`: any value; `key=value`: that value only)."""
    names = entries(allowed)
    return ANY in names or key in names or f"{key}={value}" in names


def check_scheduling(scheduling: Any, settings: OperatorSettings, *, job: bool = True) -> None:
    """SpecError when spec.scheduling asks for a priority class, toleration or node selector the operator's
    settings do not allow, or (for a job) lacks the Kueue queue the settings require."""
    queue = getattr(scheduling, "queue_name", None) if scheduling is not None else None
    if job and settings.require_queue and not queue:
        raise SpecError(
            "scheduling.queueName",
            "this cluster admits jobs only through a Kueue queue, and the spec names none",
            "set spec.scheduling.queueName (posttrain convert --queue NAME) to a LocalQueue of this namespace;"
            f" or a cluster admin sets {_env('require_queue')}=false",
        )
    if scheduling is None:
        return
    if scheduling.priority_class_name and not _class_allowed(
        scheduling.priority_class_name, settings.allowed_priority_classes
    ):
        raise _refuse("scheduling.priorityClassName", f"PriorityClass {scheduling.priority_class_name!r}",
                      "allowed_priority_classes", scheduling.priority_class_name)  # fmt: skip
    workload_class = getattr(scheduling, "workload_priority_class_name", None)
    if workload_class and not _class_allowed(workload_class, settings.allowed_workload_priority_classes):
        raise _refuse("scheduling.workloadPriorityClassName", f"WorkloadPriorityClass {workload_class!r}",
                      "allowed_workload_priority_classes", workload_class)  # fmt: skip
    for index, toleration in enumerate(scheduling.tolerations or []):
        given = toleration.model_dump(by_alias=True, exclude_none=True)
        if not toleration_allowed(given, settings.allowed_tolerations):
            key = given.get("key") or ""
            what = f"toleration {given}" + ("" if key else " (no key: it tolerates every taint)")
            raise _refuse(f"scheduling.tolerations[{index}]", what, "allowed_tolerations", key or ANY)
    for key, value in (scheduling.node_selector or {}).items():
        if not node_selector_allowed(key, value, settings.allowed_node_selectors):
            raise _refuse(f"scheduling.nodeSelector.{key}", f"nodeSelector {key}={value}",
                          "allowed_node_selectors", key)  # fmt: skip


def check_task_app_replicas(replicas: int, settings: OperatorSettings) -> None:
    """SpecError when a TaskApp asks for more replicas than the operator's bound."""
    if replicas > settings.task_app_max_replicas:
        raise SpecError(
            "replicas",
            f"{replicas} replicas is more than this cluster's bound of {settings.task_app_max_replicas}",
            f"ask for at most {settings.task_app_max_replicas}; or a cluster admin raises "
            f"{_env('task_app_max_replicas')}",
        )
