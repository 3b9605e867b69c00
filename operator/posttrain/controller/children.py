"""The operator's view of what it made. Deployments, trainer Jobs, Services (and Pods with
settings.watch_pods), labelled posttrain.dev/job, are watched by controller/child_watch.py, outside kopf:
their status changes are most of the events the operator receives. Here, kopf glue: in-memory indexes of
the objects whose events are rare, the objects made once per namespace (the NetworkPolicy and the
namespace's trainer identity, controller/namespace_objects.py), keyed by runtime.namespace_objects_key,
and the per-job trainer identity (settings.trainer_identity=job), keyed by (namespace, parent kind, parent
name). Both kinds of index are filled before any other handler runs after a (re)start, so a restarted
operator sees what it made before and never creates it twice, and a child someone deleted is made again
(on the parent's next pass). The job's Secret (its job file and rollout token) is not watched: the
operator may not list or watch Secrets (controller/reconcile_job.py makes it again when a pod shows it
missing).

The API server does the filtering: every watch carries a label selector (kopf's
settings.watching.label_selectors, set in controller/main.py, and child_watch.py's own), so objects the
operator did not make are never sent to it."""

from __future__ import annotations

import asyncio
from typing import Any

import kopf

from posttrain.controller.render.names import ROLE_ACCESS, ROLE_NETWORK, ROLE_TRAINER
from posttrain.controller.runtime import Key, namespace_objects_key, runtime_of
from posttrain.controller.settings import LABEL_JOB, LABEL_KIND, LABEL_MANAGED_BY, LABEL_ROLE, MANAGER

# The namespace's own objects (the NetworkPolicy, the trainer identity) belong to no job: these watches
# select on the operator's label alone (it makes no others of these kinds).
NAMESPACE_SELECTOR = {LABEL_MANAGED_BY: MANAGER}
# (group/version, plural) of every kind kopf watches for the operator besides its own resources.
KOPF_WATCHED = (
    ("networking.k8s.io/v1", "networkpolicies"),
    ("v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io/v1", "roles"),
    ("rbac.authorization.k8s.io/v1", "rolebindings"),
)
INDEX_SETTLE_SECONDS = 0.5  # a deleted object's loops wake this long after its event
# The selector of the children's own watches (controller/child_watch.py).
CHILD_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGER},{LABEL_JOB}"


def kopf_selector() -> str:
    """The label selector of the watches kopf runs for the operator, as the API server takes it."""
    return f"{LABEL_MANAGED_BY}={MANAGER}"


def parent_key(meta: Any) -> Key | None:
    labels = meta.get("labels") or {}
    job = labels.get(LABEL_JOB)
    kind = labels.get(LABEL_KIND)
    if not job or not kind:
        return None
    return (meta.get("namespace") or "", kind, job)


async def _supporting(kind: str, meta: Any, memo: Any) -> dict[Key, str] | None:
    key = parent_key(meta)
    if key is None:
        labels = meta.get("labels") or {}
        if LABEL_JOB in labels or labels.get(LABEL_ROLE) not in (ROLE_TRAINER, ROLE_NETWORK, ROLE_ACCESS):
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


def wake_namespace_jobs(memo: Any, namespace: str) -> None:
    """Wake every RLJob/SFTJob loop of `namespace`: one of the namespace's own objects is gone, and the
    next pass of any of its jobs makes it again (namespace_objects.py)."""
    rt = runtime_of(memo)
    for key in list(rt.wakers):
        if key[0] == namespace and key[1] in ("rljob", "sftjob"):
            rt.wake(key)


async def _deleted(type: Any, meta: Any, memo: Any) -> None:
    """Someone deleted an object the operator keeps: wake the loops that make it again, a moment later
    (kopf's index of the kind drops it first)."""
    if type != "DELETED":
        return
    key = parent_key(meta)
    rt = runtime_of(memo)
    loop = asyncio.get_running_loop()
    if key is not None:  # a per-job object (the trainer identity of trainer_identity=job): its job's loop
        loop.call_later(INDEX_SETTLE_SECONDS, rt.wake, key)
    else:
        loop.call_later(INDEX_SETTLE_SECONDS, wake_namespace_jobs, memo, meta.get("namespace") or "")


@kopf.on.event("networking.k8s.io", "v1", "networkpolicies", labels=NAMESPACE_SELECTOR)
async def posttrain_networkpolicy_deleted(type: Any, meta: Any, memo: Any, **_: Any) -> None:
    await _deleted(type, meta, memo)


@kopf.on.event("", "v1", "serviceaccounts", labels=NAMESPACE_SELECTOR)
async def posttrain_serviceaccount_deleted(type: Any, meta: Any, memo: Any, **_: Any) -> None:
    await _deleted(type, meta, memo)


@kopf.on.event("rbac.authorization.k8s.io", "v1", "roles", labels=NAMESPACE_SELECTOR)
async def posttrain_role_deleted(type: Any, meta: Any, memo: Any, **_: Any) -> None:
    await _deleted(type, meta, memo)


@kopf.on.event("rbac.authorization.k8s.io", "v1", "rolebindings", labels=NAMESPACE_SELECTOR)
async def posttrain_rolebinding_deleted(type: Any, meta: Any, memo: Any, **_: Any) -> None:
    await _deleted(type, meta, memo)
