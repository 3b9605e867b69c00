"""Pure: the NetworkPolicy of a namespace's posttrain jobs, one per namespace (made once, like the trainer's
namespace identity, controller/trainer_identity.py, and made again when someone deletes it). It selects
every pod of every RLJob and SFTJob of the namespace and admits traffic only from the posttrain job pods of
the same namespace (trainers, rollout, reference and judge servers) and, on the servers' port, from the
pods of the namespace's TaskApps (a task app calls the policy's inference URL). Anything else in the
cluster is refused, so nobody outside the namespace can reach the servers' weight-sync or capture
endpoints, nor a trainer's rendezvous port.

Within a namespace the policy no longer tells one job's pods from another's (a policy per job cost a write
and a watched object per job). Isolation between the jobs of one namespace rests on each RLJob's rollout
token (render/token.py): a rollout server refuses weight-sync and capture requests without its own job's
token, and the namespace is the boundary between tenants. A task app outside the namespace
(spec.taskApp.url) needs one more NetworkPolicy that lets it reach the rollout port (policies add up).
Prometheus gets in from a namespace labelled posttrain.dev/monitoring=true, on the trainers' metrics port
only (rank 0's /metrics, docs/monitoring.md); the servers' port, which also serves inference, stays closed
to it (docs/monitoring.md shows the policy that opens vLLM's /metrics).
Takes effect where the cluster's network plugin enforces NetworkPolicies."""

from __future__ import annotations

from typing import Any

from posttrain.controller.render.names import ROLE_NETWORK, ROLE_TASK_APP
from posttrain.controller.settings import LABEL_KIND, LABEL_MANAGED_BY, LABEL_ROLE, MANAGER

NETWORK_POLICY = "posttrain-jobs"
MONITORING_NAMESPACE_LABEL = "posttrain.dev/monitoring"
JOB_KINDS = ["rljob", "sftjob"]


def job_pods() -> dict[str, Any]:
    """Every pod of a posttrain RLJob or SFTJob (the labels every child's pod template carries)."""
    return {
        "matchLabels": {LABEL_MANAGED_BY: MANAGER},
        "matchExpressions": [{"key": LABEL_KIND, "operator": "In", "values": list(JOB_KINDS)}],
    }


def render_network_policy(namespace: str, *, server_port: int, metrics_port: int = 0) -> dict[str, Any]:
    """The namespace's NetworkPolicy: labelled as the operator's, without the job label and without an
    owner (it serves every job of the namespace)."""
    task_app_pods = {"matchLabels": {LABEL_MANAGED_BY: MANAGER, LABEL_KIND: "taskapp", LABEL_ROLE: ROLE_TASK_APP}}
    ingress = [
        {"from": [{"podSelector": job_pods()}]},
        {"from": [{"podSelector": task_app_pods}], "ports": [{"protocol": "TCP", "port": server_port}]},
    ]
    if metrics_port:
        monitoring = {"namespaceSelector": {"matchLabels": {MONITORING_NAMESPACE_LABEL: "true"}}}
        ingress.append({"from": [monitoring], "ports": [{"protocol": "TCP", "port": metrics_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY,
            "namespace": namespace,
            "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_ROLE: ROLE_NETWORK},
        },
        "spec": {"podSelector": job_pods(), "policyTypes": ["Ingress"], "ingress": ingress},
    }
