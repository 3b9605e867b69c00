"""kopf glue: in-memory indexes of every child the operator made (Deployments, Jobs, Services and the
trainer's identity, labelled posttrain.dev/job; Pods only with settings.watch_pods), keyed by (namespace,
parent kind, parent name), and of the objects it makes once per namespace (the NetworkPolicy and the
namespace's trainer identity, controller/namespace_objects.py), keyed by runtime.namespace_objects_key. kopf fills the indexes before any other handler runs after a (re)start, so a
restarted operator sees the children it made before and never creates them twice, and a child someone
deleted is made again (on the parent's next resync). An event wakes the parent's reconcile loop only when
the parent's decision may change (controller/wake.py): readiness or a problem, never a Service's own
events. The job's Secret (its job file and rollout token) is not watched: the operator may not list or
watch Secrets (controller/reconcile.py makes it again when a pod shows it missing).

The API server does the filtering: every watch below carries the label selector of child_selector()
(kopf's settings.watching.label_selectors, set in controller/main.py), so objects the operator did not
make are never sent to it."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from posttrain.controller.render.names import ROLE_NETWORK, ROLE_TRAINER
from posttrain.controller.runtime import Key, namespace_objects_key, runtime_of
from posttrain.controller.settings import (
    LABEL_JOB,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGER,
    load_settings,
)
from posttrain.controller.status import DeploymentObs, PodObs, TrainerObs
from posttrain.controller.wake import child_wakes, pod_wakes

SELECTOR = {LABEL_JOB: kopf.PRESENT, LABEL_MANAGED_BY: MANAGER}
# The namespace's own objects (the NetworkPolicy, the trainer identity) belong to no job: these watches
# select on the operator's label alone (it makes no others of these kinds).
NAMESPACE_SELECTOR = {LABEL_MANAGED_BY: MANAGER}
NAMESPACE_WATCHES = {
    ("networking.k8s.io/v1", "networkpolicies"),
    ("v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
}
# (group/version, plural) of every child kind the operator watches.
WATCHED_CHILDREN = (
    ("apps/v1", "deployments"),
    ("batch/v1", "jobs"),
    ("v1", "services"),
    ("v1", "pods"),
    ("networking.k8s.io/v1", "networkpolicies"),
    ("v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
)


def child_selector(group_version: str = "", plural: str = "") -> str:
    """The label selector of a child kind's watch, as the API server takes it."""
    if (group_version, plural) in NAMESPACE_WATCHES:
        return f"{LABEL_MANAGED_BY}={MANAGER}"
    return f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_JOB}"


def parent_key(meta: Any) -> Key | None:
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    kind = labels.get(LABEL_KIND)
    if not job or not kind:
        return None
    return (meta.get("namespace") or "", kind, job)


def _wake(memo: Any, key: Key) -> None:
    try:
        runtime = runtime_of(memo)
    except AttributeError:
        return
    asyncio.get_running_loop().call_soon(runtime.wake, key)


def _changed(index: Any, key: Key, obs: Any, wakes: Any) -> bool:
    """True when a child's new observation differs from the one its index holds in a way its job's loop
    must act on (controller/wake.py)."""
    previous = None
    if index is not None and key in index:
        previous = next((o for o in index[key] if getattr(o, "name", None) == obs.name), None)
    return bool(wakes(previous, obs))


@kopf.index("apps", "v1", "deployments", labels=SELECTOR)
async def posttrain_deployments(body: Any, meta: Any, memo: Any, **kwargs: Any) -> dict[Key, DeploymentObs] | None:
    key = parent_key(meta)
    if key is None:
        return None
    obs = DeploymentObs.from_object(body)
    if _changed(kwargs.get("posttrain_deployments"), key, obs, child_wakes):
        _wake(memo, key)
    return {key: obs}


@kopf.index("batch", "v1", "jobs", labels=SELECTOR)
async def posttrain_jobs(body: Any, meta: Any, memo: Any, **kwargs: Any) -> dict[Key, TrainerObs] | None:
    key = parent_key(meta)
    if key is None:
        return None
    obs = TrainerObs.from_object(body)
    if _changed(kwargs.get("posttrain_jobs"), key, obs, child_wakes):
        _wake(memo, key)
    return {key: obs}


@kopf.index("", "v1", "services", labels=SELECTOR)
async def posttrain_services(meta: Any, memo: Any, **_: Any) -> dict[Key, str] | None:
    key = parent_key(meta)
    if key is None:
        return None
    return {key: meta["name"]}


async def _supporting(kind: str, meta: Any, memo: Any) -> dict[Key, str] | None:
    key = parent_key(meta)
    if key is None:
        labels = meta.get("labels") or {}
        if LABEL_JOB in labels or labels.get(LABEL_ROLE) not in (ROLE_TRAINER, ROLE_NETWORK):
            return None
        key = namespace_objects_key(meta.get("namespace") or "")
    return {key: f"{kind}/{meta['name']}"}


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=NAMESPACE_SELECTOR)
async def posttrain_networkpolicies(meta: Any, memo: Any, **_: Any) -> dict[Key, str] | None:
    return await _supporting("NetworkPolicy", meta, memo)


@kopf.index("", "v1", "serviceaccounts", labels=NAMESPACE_SELECTOR)
async def posttrain_serviceaccounts(meta: Any, memo: Any, **_: Any) -> dict[Key, str] | None:
    return await _supporting("ServiceAccount", meta, memo)


@kopf.index("rbac.authorization.k8s.io", "v1", "roles", labels=NAMESPACE_SELECTOR)
async def posttrain_roles(meta: Any, memo: Any, **_: Any) -> dict[Key, str] | None:
    return await _supporting("Role", meta, memo)


@kopf.index("rbac.authorization.k8s.io", "v1", "rolebindings", labels=NAMESPACE_SELECTOR)
async def posttrain_rolebindings(meta: Any, memo: Any, **_: Any) -> dict[Key, str] | None:
    return await _supporting("RoleBinding", meta, memo)


async def posttrain_pods(body: Any, meta: Any, memo: Any, **kwargs: Any) -> dict[Key, PodObs] | None:
    """Pods of our Deployments and Jobs (the templates carry the same labels): why they are not running."""
    key = parent_key(meta)
    if key is None:
        return None
    obs = PodObs.from_object(body)
    if _changed(kwargs.get("posttrain_pods"), key, obs, pod_wakes):
        _wake(memo, key)
    return {key: obs}


if load_settings().watch_pods:  # otherwise the pods of a stuck job are listed (controller/reconcile.py)
    kopf.index("", "v1", "pods", labels=SELECTOR)(posttrain_pods)


INDEX_NAMES = (
    "posttrain_deployments",
    "posttrain_jobs",
    "posttrain_services",
    "posttrain_pods",
    "posttrain_networkpolicies",
    "posttrain_serviceaccounts",
    "posttrain_roles",
    "posttrain_rolebindings",
)
