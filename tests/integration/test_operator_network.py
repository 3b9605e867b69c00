"""The namespace's network fences on the real API server, made by a real `posttrain operator`: the
API server takes them as rendered, and their selectors pick the real pods (the egress fence every pod of
the namespace's jobs and TaskApps, the TaskApp fence only the TaskApp's), never a pod of someone else's.
Whether traffic is then refused depends on the cluster's network plugin: this control plane has none that
enforces NetworkPolicies; the enforcement (a pod cannot reach 169.254.169.254 or the API server, and reaches
DNS, S3 and its own task app) is tested on the real node with kube-router: tests/e2e/test_network_fences_node.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fixtures.operator_env import operator_env, wait_for
from fixtures.operator_process import api_client_of, rljob_manifest
from kubernetes import client
from posttrain.api.resources import GROUP, VERSION

pytestmark = [pytest.mark.cluster]


def label_selector(selector: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] == "In"
        parts.append(f"{expr['key']} in ({','.join(expr['values'])})")
    return ",".join(parts)


def test_the_fences_apply_and_select_the_namespaces_job_and_task_app_pods(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    with operator_env(cluster, namespace, tmp_path / "operator.log",
                      settings={"POSTTRAIN_API_SERVER_ADDRESSES": "10.0.0.1:6443"}) as env:  # fmt: skip
        env.secret("task-key", math_taskapp.api_key)
        env.create("rljobs", rljob_manifest("fenced", math_taskapp.url))
        env.create("taskapps", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": "app"},
                                "spec": {"image": "posttrain/taskapp-math:dev", "port": 8000}})  # fmt: skip
        # someone else's pod in the namespace (not the operator's): selected by neither fence
        env.core.create_namespaced_pod(env.ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name="other", labels={"app": "other"}),
            spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="busybox")])))  # fmt: skip
        env.wait_phase("rljobs", "fenced", "Running", timeout=90)
        net = client.NetworkingV1Api(env.api)

        def fences() -> dict[str, Any] | None:
            found = {p.metadata.name: p for p in net.list_namespaced_network_policy(env.ns).items}
            return found if {"posttrain-egress", "posttrain-task-apps"} <= set(found) else None

        policies = wait_for(fences, 30, "the fences")
        job_pods = {p.metadata.name for p in env.children("fenced")["Pod"]}
        app_pods = wait_for(lambda: {p.metadata.name for p in env.core.list_namespaced_pod(
            env.ns, label_selector="posttrain.dev/kind=taskapp").items}, 60, "the TaskApp's pod")  # fmt: skip
        assert job_pods and app_pods
        api = env.api

        def selected(name: str) -> set[str]:
            stored = api.sanitize_for_serialization(policies[name])["spec"]["podSelector"]
            return {p.metadata.name for p in env.core.list_namespaced_pod(env.ns, label_selector=label_selector(stored)).items}

        assert selected("posttrain-egress") == job_pods | app_pods
        assert selected("posttrain-task-apps") == app_pods
        egress = api.sanitize_for_serialization(policies["posttrain-egress"])["spec"]
        blocks = [peer["ipBlock"] for rule in egress["egress"] for peer in rule["to"] if "ipBlock" in peer]
        v4 = next(b for b in blocks if b["cidr"] == "0.0.0.0/0")
        assert {"169.254.0.0/16", "10.0.0.1/32"} <= set(v4["except"])  # stored as rendered
        assert egress["policyTypes"] == ["Egress"]


def test_the_egress_fence_names_where_the_api_server_really_listens(
    cluster: Any, namespace: str, math_taskapp: Any, tmp_path: Path
) -> None:
    """Without POSTTRAIN_API_SERVER_ADDRESSES the operator finds the API server behind the `kubernetes`
    Service (its EndpointSlice): a policy sees that address after DNAT, never the ClusterIP. This control
    plane runs no endpoint reconciler (loopback is no valid endpoint), so the test writes the slice the API
    server of a cluster keeps, with a documentation address."""
    discovery = client.DiscoveryV1Api(api_client_of(cluster))
    made = False
    try:
        discovery.read_namespaced_endpoint_slice("kubernetes", "default")
    except client.exceptions.ApiException as err:
        if err.status != 404:
            raise
        discovery.create_namespaced_endpoint_slice("default", client.V1EndpointSlice(
            metadata=client.V1ObjectMeta(name="kubernetes", labels={"kubernetes.io/service-name": "kubernetes"}),
            address_type="IPv4", endpoints=[client.V1Endpoint(addresses=["192.0.2.77"])],
            ports=[client.DiscoveryV1EndpointPort(name="https", port=6443, protocol="TCP")]))  # fmt: skip
        made = True
    try:
        endpoint_slice = discovery.read_namespaced_endpoint_slice("kubernetes", "default")
        addresses = {a for e in endpoint_slice.endpoints or [] for a in e.addresses or [] if ":" not in a}
        with operator_env(cluster, namespace, tmp_path / "operator.log") as env:
            env.secret("task-key", math_taskapp.api_key)
            env.create("rljobs", rljob_manifest("fenced", math_taskapp.url))
            net = client.NetworkingV1Api(env.api)

            def egress() -> dict[str, Any] | None:
                found = {p.metadata.name: p for p in net.list_namespaced_network_policy(env.ns).items}
                policy = found.get("posttrain-egress")
                return env.api.sanitize_for_serialization(policy)["spec"] if policy else None

            spec = wait_for(egress, 60, "the egress fence")
            excepted = {e for rule in spec["egress"] for peer in rule["to"]
                        for e in (peer.get("ipBlock") or {}).get("except") or []}  # fmt: skip
            assert addresses and {f"{a}/32" for a in addresses} <= excepted, excepted
    finally:
        if made:
            discovery.delete_namespaced_endpoint_slice("kubernetes", "default")
