"""Pure: the PodDisruptionBudgets of a job's trainer and rollout pods. A running trainer is a gang (losing
one pod stops every rank until a checkpoint resumes it) and a rollout server holds the policy's weights:
a voluntary eviction (`kubectl drain`, a cluster autoscaler's scale-down) must not take them while they
run. maxUnavailable 0 refuses every such eviction of a healthy pod; `unhealthyPodEvictionPolicy:
AlwaysAllow` lets a drain take a pod that is not ready anyway (a crash-looping one never blocks a node).
Deleting pods is not an eviction: Kueue's preemption and the job's own suspension are not held by these.
Owned by the job (the garbage collector removes them with it); off with settings.disruption_budgets."""

from __future__ import annotations

from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render import pods
from posttrain.controller.render.names import ROLE_ROLLOUT, ROLE_TRAINER, rollout_name, trainer_name
from posttrain.controller.settings import OperatorSettings

PDB_KIND = "PodDisruptionBudget"


def render_disruption_budget(owner: Owner, name: str, role: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": PDB_KIND,
        "metadata": pods.child_meta(owner, name, role),
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": pods.selector(owner, role)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def render_disruption_budgets(owner: Owner, settings: OperatorSettings, *, rollout: bool) -> list[dict[str, Any]]:
    """The trainer's budget, and the rollout servers' when the job has them (an RLJob)."""
    if not settings.disruption_budgets:
        return []
    out = [render_disruption_budget(owner, trainer_name(owner.name), ROLE_TRAINER)]
    if rollout:
        out.append(render_disruption_budget(owner, rollout_name(owner.name), ROLE_ROLLOUT))
    return out
