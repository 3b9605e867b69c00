"""Pure: the NetworkPolicy of one job. It selects every pod of the job and admits traffic only from the
job's own pods (trainer, rollout, reference, judge) and, on the servers' port, from the pods of the
TaskApp the job names (the task app calls the policy's inference URL). Anything else in the cluster is
refused, so nobody else can reach the servers' weight-sync or capture endpoints, nor the trainer's
rendezvous port. A task app outside the namespace (spec.taskApp.url) needs one more NetworkPolicy that
lets it reach the rollout port (policies add up). Takes effect where the cluster's network plugin
enforces NetworkPolicies."""

from __future__ import annotations

from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render.names import ROLE_NETWORK, ROLE_TASK_APP, network_policy_name
from posttrain.controller.render.pods import child_meta
from posttrain.controller.settings import LABEL_JOB, LABEL_KIND, LABEL_ROLE


def job_pod_selector(owner: Owner) -> dict[str, Any]:
    return {"matchLabels": {LABEL_JOB: owner.name, LABEL_KIND: owner.kind.lower()}}


def render_network_policy(owner: Owner, *, server_port: int, task_app: str | None) -> dict[str, Any]:
    """The job's NetworkPolicy; `task_app` is the name of the TaskApp the job uses, if any."""
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": job_pod_selector(owner)}]}]
    if task_app:
        task_app_pods = {
            "matchLabels": {LABEL_JOB: task_app, LABEL_KIND: "taskapp", LABEL_ROLE: ROLE_TASK_APP}
        }
        ingress.append(
            {"from": [{"podSelector": task_app_pods}], "ports": [{"protocol": "TCP", "port": server_port}]}
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": child_meta(owner, network_policy_name(owner.name), ROLE_NETWORK),
        "spec": {"podSelector": job_pod_selector(owner), "policyTypes": ["Ingress"], "ingress": ingress},
    }
