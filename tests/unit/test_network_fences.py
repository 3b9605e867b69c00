"""The namespace's network fences (render/network.py): the egress of job and TaskApp pods excludes the cloud
metadata range and the API server, and reaches DNS, its own namespace, the listed namespaces and the allowed
networks; TaskApp pods admit only their namespace's job pods and the operator. Pure: what the policies
select and allow. That the API server takes them and they select the real pods:
tests/integration/test_operator_network.py. Enforced by a real network plugin (kube-router):
tests/e2e/test_network_fences_node.py (`make e2e-netpol`)."""

from __future__ import annotations

import ipaddress

from fixtures.jobs import UID
from posttrain.controller import render
from posttrain.controller.namespace_objects import render_namespace_objects
from posttrain.controller.objects import parse_task_app
from posttrain.controller.render.taskapp import render_task_app
from posttrain.controller.settings import OperatorSettings
from test_pod_security import SETTINGS, TARGET, rljob, selects, sftjob

API = "10.0.0.1:6443,[fd00::1]:443"


def fences(settings: OperatorSettings) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in render_namespace_objects("team-a", settings) if o["kind"] == "NetworkPolicy"}


def templates() -> dict[str, dict]:
    task_app = {"apiVersion": "posttrain.dev/v1alpha1", "kind": "TaskApp",
                "metadata": {"name": "math", "namespace": "team-a", "uid": UID}, "spec": {"image": "reg/math:1"}}  # fmt: skip
    children = [*render.render_rljob(rljob(), SETTINGS, TARGET).children, *render.render_sftjob(sftjob(), SETTINGS).children,
                *render_task_app(parse_task_app(task_app), SETTINGS)]  # fmt: skip
    return {c["metadata"]["name"]: c["spec"]["template"]["metadata"]["labels"]
            for c in children if c["kind"] in ("Deployment", "Job")}  # fmt: skip


def blocked(policy: dict, address: str) -> bool:
    """Whether no ipBlock of the egress policy allows `address`."""
    ip = ipaddress.ip_address(address)
    for rule in policy["spec"]["egress"]:
        for peer in rule.get("to", []):
            block = peer.get("ipBlock")
            if block and ip in ipaddress.ip_network(block["cidr"]) and not any(
                ip in ipaddress.ip_network(e) for e in block.get("except", [])
            ):
                return False
    return True


def test_the_egress_fence_selects_every_job_and_task_app_pod_and_keeps_them_from_metadata_and_api_server() -> None:
    policy = fences(OperatorSettings(api_server_addresses=API))["posttrain-egress"]
    assert policy["spec"]["policyTypes"] == ["Egress"] and "ownerReferences" not in policy["metadata"]
    pods = templates()
    assert {n for n, labels in pods.items() if selects(policy["spec"]["podSelector"], labels)} == set(pods)
    assert not selects(policy["spec"]["podSelector"], {"app": "someone-elses"})
    for address in ("169.254.169.254", "169.254.20.10", "10.0.0.1", "fd00::1", "fd00:ec2::254", "fe80::1"):
        assert blocked(policy, address), address
    for address in ("52.1.2.3", "10.0.0.2", "2600::1"):  # S3, a task app or a judge elsewhere
        assert not blocked(policy, address), address
    rules = policy["spec"]["egress"]
    dns = rules[0]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
    assert {p["port"] for p in dns["ports"]} == {53}
    assert {"to": [{"podSelector": {}}]} in rules  # its own namespace
    assert {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "posttrain-system"}}}]} in rules


def test_the_egress_allow_list_is_the_operators_setting() -> None:
    settings = OperatorSettings(api_server_addresses=API, egress_allowed_networks="52.0.0.0/8",
                                egress_denied_networks="169.254.0.0/16,52.9.0.0/16", egress_namespaces="")  # fmt: skip
    policy = fences(settings)["posttrain-egress"]
    assert not blocked(policy, "52.1.2.3") and blocked(policy, "52.9.1.1") and blocked(policy, "8.8.8.8")
    assert not any("namespaceSelector" in peer and "podSelector" not in peer
                   for rule in policy["spec"]["egress"] for peer in rule["to"])  # fmt: skip
    assert "posttrain-egress" not in fences(OperatorSettings(egress_policy=False))


def test_task_apps_admit_only_their_namespaces_job_pods_and_the_operator() -> None:
    policy = fences(OperatorSettings())["posttrain-task-apps"]
    pods = templates()
    selected = {n for n, labels in pods.items() if selects(policy["spec"]["podSelector"], labels)}
    assert selected == {"math-task-app"}
    (from_jobs, from_operator) = policy["spec"]["ingress"]
    (jobs,) = from_jobs["from"]
    assert set(jobs) == {"podSelector"}  # no namespaceSelector: the policy's own namespace only
    admitted = {n for n, labels in pods.items() if selects(jobs["podSelector"], labels)}
    assert admitted == set(pods) - {"math-task-app"}
    assert from_operator["from"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "posttrain-system"}},
                                      "podSelector": {"matchLabels": {"app.kubernetes.io/name": "posttrain-operator"}}}]  # fmt: skip
