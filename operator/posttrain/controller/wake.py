"""Which watch events change what a reconcile loop would decide (pure functions).

Most events of a job are its own status patches (the operator's and the trainer's progress): a pass woken by
them finds nothing to do and costs a render, a derivation and often a write. A job's loop is woken only by a
new generation (a spec change: suspend, resume), its deletion, or a new `status.result` (the trainer's
final report); a child's event only when what the status is derived from changed (readiness, a problem).
Everything else is caught by the resync."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Trigger:
    """The parts of an RLJob, SFTJob or TaskApp whose change must wake its loop."""

    uid: str
    generation: Any
    deleting: bool
    result: str  # status.result as canonical JSON; "" without one


def trigger_of(body: Any) -> Trigger:
    meta = body.get("metadata") or {}
    result = (body.get("status") or {}).get("result")
    return Trigger(
        uid=str(meta.get("uid") or ""),
        generation=meta.get("generation"),
        deleting=bool(meta.get("deletionTimestamp")),
        result=json.dumps(result, sort_keys=True) if result else "",
    )


def object_wakes(previous: Trigger | None, current: Trigger) -> bool:
    """A watch event of the object itself: wake its loop? (The first sighting starts the loop anyway.)"""
    return previous is not None and previous != current


def child_wakes(previous: Any, current: Any) -> bool:
    """A Deployment's or trainer Job's observation (DeploymentObs, TrainerObs: frozen, readiness and
    problems only) changed. The first sighting of a child the operator has just made says nothing new: its loop counts
    what it applied as present; a child that appears not ready and without a problem needs no pass."""
    if previous is None:
        return bool(getattr(current, "problem", "")) or _ready(current)
    return previous != current


def _ready(obs: Any) -> bool:
    return bool(getattr(obs, "ready", 0) or getattr(obs, "succeeded", 0) or getattr(obs, "failed", 0)
                or getattr(obs, "conditions", ()))  # fmt: skip


def pod_wakes(previous: Any, current: Any) -> bool:
    """A pod (PodObs) matters to its job when its problem changed (status messages say why pods are not
    running) or when it just succeeded (a finished trainer pod is not waited for); a pod becoming ready
    shows in its Deployment's or Job's own readiness."""
    before = previous.problem if previous is not None else ""
    finished = current.phase == "Succeeded" and (previous is None or previous.phase != "Succeeded")
    return before != current.problem or finished
