"""Apply and observe, shared by the job loop (controller/reconcile_job.py) and the TaskApp loop
(controller/reconcile_taskapp.py): a pass's snapshot of its object, the object's children as the watch
indexes hold them, and a server-side apply of each child that is absent or drifted. The operator never
adopts an object it did not make: a child's name held by anything else raises NotOwned."""

from __future__ import annotations

import copy
import time
from datetime import UTC, datetime
from typing import Any

from posttrain.api.resources import API_VERSION
from posttrain.controller import render
from posttrain.controller.kube import KubeError, path_of
from posttrain.controller.objects import Owner
from posttrain.controller.runtime import Key, Runtime, namespace_objects_key
from posttrain.controller.settings import LABEL_ROLE
from posttrain.controller.spec_errors import unprocessable_message
from posttrain.controller.status import DeploymentObs, Observed, PodObs, TrainerObs

KIND_LABELS = {"RLJob": "rljob", "SFTJob": "sftjob", "TaskApp": "taskapp"}
APPLY_GRACE = 15.0  # seconds to wait for our own apply to show up in the watch before re-applying
# What a loop applied lately, by (kind, name): (the desired state, monotonic time). It only saves API calls.
Applied = dict[tuple[str, str], tuple[dict[str, Any], float]]


def utcnow() -> datetime:
    return datetime.now(UTC)


class ChildRefused(Exception):
    """The API server refused a rendered child with 422: the spec holds a value it cannot take."""

    def __init__(self, kind: str, name: str, error: KubeError):
        super().__init__(f"{kind} {name}: {error}")
        self.message = unprocessable_message(f"{kind} {name}", error.details, str(error)[:200])


class NotOwned(Exception):
    """An object under a child's name that the job does not own (made before the job by someone else, or
    left by an earlier job of the same name): the operator never adopts it; the job fails naming it."""

    def __init__(self, kind: str, name: str, owners: list[str]):
        held = "owned by another object" if owners else "owned by nothing"
        self.message = (
            f"{kind} {name} exists and is not this job's ({held}); the operator does not take over objects "
            f"it did not make: delete {kind} {name} or give the job another name"
        )
        super().__init__(self.message)


async def create_owned(rt: Runtime, child: dict[str, Any]) -> bool:
    """Create `child`; when an object of that name exists (409), it must be owned by the child's job
    (ownerReferences' uid), else NotOwned. True when this call made it."""
    if await rt.kube.create(child):
        return True
    path = path_of(child)
    owners = await rt.kube.owners(path)
    uid = child["metadata"]["ownerReferences"][0]["uid"]
    if owners is not None and uid not in owners:
        raise NotOwned(child["kind"], child["metadata"]["name"], owners)
    return False


def without_original_toml(obj: dict[str, Any]) -> dict[str, Any]:
    """The object with spec.originalToml left out (the operator needs it only to make the job's Secret, and
    5,000 jobs of 256 KiB each would hold 1.25 GiB): `obj` itself when it has none."""
    spec = obj.get("spec")
    if isinstance(spec, dict) and "originalToml" in spec:
        obj = {**obj, "spec": {k: v for k, v in spec.items() if k != "originalToml"}}
    return obj


def snapshot(body: Any) -> dict[str, Any]:
    """The object as one pass reads it: the watch's body is replaced, never changed, by the next event,
    so only the parts a pass changes (its status) are copied."""
    obj = dict(body)
    obj["status"] = copy.deepcopy(obj.get("status") or {})
    obj.setdefault("apiVersion", API_VERSION)
    return obj


def key_of(owner: Owner) -> Key:
    return (owner.namespace, KIND_LABELS[owner.kind], owner.name)


IDENTITY_INDEXES = ("posttrain_serviceaccounts", "posttrain_roles", "posttrain_rolebindings")
NAMESPACE_INDEXES = ("posttrain_networkpolicies", *IDENTITY_INDEXES)


def namespace_objects_seen(owner: Owner, indexes: dict[str, Any]) -> set[str]:
    """The namespace's own objects (NetworkPolicy, trainer identity) as the operator's watches hold them
    ("Kind/name")."""
    key = namespace_objects_key(owner.namespace)
    return {name for index in NAMESPACE_INDEXES for name in indexes.get(index, {}).get(key, [])}


def observe(key: Key, indexes: dict[str, Any], uid: str = "") -> Observed:
    """The job's children as the indexes hold them; with `uid`, only those the job itself owns (an
    earlier job of the same name, or anyone else, may have left objects under the same names)."""
    observed = Observed()
    for obs in indexes.get("posttrain_deployments", {}).get(key, []):
        if isinstance(obs, DeploymentObs) and not (uid and obs.owner and obs.owner != uid):
            observed.deployments[obs.name] = obs
    for obs in indexes.get("posttrain_jobs", {}).get(key, []):
        if isinstance(obs, TrainerObs) and not (uid and obs.owner and obs.owner != uid):
            observed.trainer = obs
    for name in indexes.get("posttrain_services", {}).get(key, []):
        observed.others.add(f"Service/{name}")
    for name in indexes.get("posttrain_pdbs", {}).get(key, []):
        observed.others.add(f"PodDisruptionBudget/{name}")
    # The per-job trainer identity gates nothing, but must be seen: a child that is never observed would be
    # applied again on every pass.
    for index in IDENTITY_INDEXES:
        observed.others.update(indexes.get(index, {}).get(key, []))
    observed.pods = [p for p in indexes.get("posttrain_pods", {}).get(key, []) if isinstance(p, PodObs)]
    return observed


def _observed_state(child: dict[str, Any], observed: Observed) -> dict[str, Any] | None:
    name = child["metadata"]["name"]
    kind = child["kind"]
    if kind == "Deployment":
        dep = observed.deployments.get(name)
        return None if dep is None else {"replicas": dep.replicas}
    if kind == "Job":
        tr = observed.trainer
        if tr is None or tr.name != name:
            return None
        return {"suspend": tr.suspended} if "suspend" in child["spec"] else {}
    return {} if f"{kind}/{name}" in observed.others else None


def with_applied(observed: Observed, children: list[dict[str, Any]]) -> Observed:
    """What the watches will show once they catch up: the children this pass applied exist (none of their
    pods is ready yet). Counting them at once saves a status write that would say they are missing."""
    out = Observed(dict(observed.deployments), observed.trainer, set(observed.others), list(observed.pods))
    for child in children:
        name, kind = child["metadata"]["name"], child["kind"]
        if kind == "Deployment" and name not in out.deployments:
            role = child["metadata"]["labels"].get(LABEL_ROLE, "")
            out.deployments[name] = DeploymentObs(name, role, replicas=child["spec"]["replicas"])
        elif kind == "Job" and (out.trainer is None or out.trainer.name != name):
            spec = child["spec"]
            out.trainer = TrainerObs(name, completions=spec.get("completions") or 1, suspended=bool(spec.get("suspend")))
        elif kind not in ("Deployment", "Job"):
            out.others.add(f"{kind}/{name}")
    return out


async def ensure_children(rt: Runtime, children: list[dict[str, Any]], observed: Observed, applied: Applied) -> int:
    """Server-side apply each child that is absent (made again when someone deleted it) or whose
    replicas/suspend drifted; `applied` is the loop's memory of its own recent applies. Returns how many.
    A 422 on a child raises ChildRefused."""
    now = time.monotonic()
    count = 0
    for child in children:
        ident = (child["kind"], child["metadata"]["name"])
        want = render.desired_state(child)
        have = _observed_state(child, observed)
        recent = applied.get(ident)
        if have == want:
            continue
        if recent and recent[0] == want and now - recent[1] < APPLY_GRACE:
            continue  # we applied it a moment ago; the watch has not caught up yet
        try:
            # An absent child is created, not applied: a server-side apply would take over an object of
            # the same name that someone else made (create_owned refuses it).
            if have is not None or not await create_owned(rt, child):
                await rt.kube.apply(child)
        except KubeError as err:
            if err.status == 422:
                raise ChildRefused(*ident, err) from err
            raise
        applied[ident] = (want, now)
        count += 1
    return count
