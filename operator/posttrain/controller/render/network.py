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
Two more fences per namespace (render_fences), for tenant code (a task app, a custom trainer image):
- `posttrain-egress` selects every job and TaskApp pod of the namespace and lets it reach only DNS
  (kube-dns), the pods of its own namespace, the pods of the namespaces in settings.egress_namespaces
  (MinIO's), and settings.egress_allowed_networks except settings.egress_denied_networks (link-local: the
  cloud metadata address) and the API server's addresses: no metadata credentials, no API server, no other
  tenant's task apps (where the cluster's pod and Service CIDRs are denied too).
- `posttrain-task-apps` selects the namespace's TaskApp pods and admits only its job pods and the
  operator's pods (verification).
Takes effect where the cluster's network plugin enforces NetworkPolicies (kube-router's on the real dev node:
tests/e2e/test_network_fences_node.py). A policy sees a Service's traffic after kube-proxy's DNAT, at the
endpoint: the API server is fenced only when settings.api_server_addresses names its endpoints, not only
the `kubernetes` Service's ClusterIP."""

from __future__ import annotations

from typing import Any

from posttrain.api.urls import endpoints, networks
from posttrain.controller.render.names import ROLE_NETWORK, ROLE_TASK_APP
from posttrain.controller.settings import LABEL_KIND, LABEL_MANAGED_BY, LABEL_ROLE, MANAGER, OperatorSettings

NETWORK_POLICY = "posttrain-jobs"
EGRESS_POLICY = "posttrain-egress"
TASK_APP_POLICY = "posttrain-task-apps"
FENCES = (NETWORK_POLICY, EGRESS_POLICY, TASK_APP_POLICY)
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


def tenant_pods() -> dict[str, Any]:
    """Every pod of the namespace's RLJobs, SFTJobs and TaskApps: the code a tenant chose."""
    return {
        "matchLabels": {LABEL_MANAGED_BY: MANAGER},
        "matchExpressions": [{"key": LABEL_KIND, "operator": "In", "values": [*JOB_KINDS, "taskapp"]}],
    }


def _policy(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_ROLE: ROLE_NETWORK}},  # fmt: skip
        "spec": spec,
    }


def _ip_blocks(allowed: str, denied: list[str]) -> list[dict[str, Any]]:
    """One ipBlock per allowed network, each with the denied networks inside it as `except`."""
    out = []
    deny = networks(",".join(denied))
    for net in networks(allowed):
        inside = sorted({str(d) for d in deny if d.version == net.version and d.subnet_of(net) and d != net})  # type: ignore[arg-type]
        block: dict[str, Any] = {"cidr": str(net)}
        if inside:
            block["except"] = inside
        out.append({"ipBlock": block})
    return out


def denied_networks(settings: OperatorSettings) -> list[str]:
    """egress_denied_networks plus each API server address as a single-host network."""
    hosts = [f"{ip}/{32 if ip.version == 4 else 128}" for ip, _ in endpoints(settings.api_server_addresses)]
    return [str(n) for n in networks(settings.egress_denied_networks)] + hosts


def render_egress_policy(namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    dns = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
           "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}  # fmt: skip
    egress: list[dict[str, Any]] = [
        {"to": [dns], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
        {"to": [{"podSelector": {}}]},  # the namespace's own pods: servers, task apps, trainer ranks
    ]
    peers = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns.strip()}}}
             for ns in settings.egress_namespaces.split(",") if ns.strip()]  # fmt: skip
    if peers:
        egress.append({"to": peers})
    blocks = _ip_blocks(settings.egress_allowed_networks, denied_networks(settings))
    if blocks:
        egress.append({"to": blocks})
    return _policy(namespace, EGRESS_POLICY, {"podSelector": tenant_pods(), "policyTypes": ["Egress"],
                                              "egress": egress})  # fmt: skip


def render_task_app_policy(namespace: str, settings: OperatorSettings) -> dict[str, Any]:
    task_app_pods = {"matchLabels": {LABEL_MANAGED_BY: MANAGER, LABEL_KIND: "taskapp", LABEL_ROLE: ROLE_TASK_APP}}
    operator = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.operator_namespace}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": MANAGER}}}  # fmt: skip
    ingress = [{"from": [{"podSelector": job_pods()}]}, {"from": [operator]}]
    return _policy(namespace, TASK_APP_POLICY, {"podSelector": task_app_pods, "policyTypes": ["Ingress"],
                                                "ingress": ingress})  # fmt: skip


def render_fences(namespace: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The namespace's egress fence (settings.egress_policy) and its TaskApps' ingress fence."""
    out = [render_egress_policy(namespace, settings)] if settings.egress_policy else []
    return [*out, render_task_app_policy(namespace, settings)]
