"""The namespace's network fences (controller/render/network.py) enforced on the real node: containerd, runc,
the CNI bridge, kube-proxy and kube-router's network policy controller (hack/node/kube-router) enforcing the
API server's NetworkPolicies (`make e2e-netpol`; root; docs/operations/real-node-e2e.md).

Pods run netcheck (hack/node/netcheck, a static Go program imported as a one-layer image) with the labels
the operator's templates give a job pod and a TaskApp pod. On the host two listeners answer with a line of
their own: one on 169.254.169.254:80 (the cloud metadata address, on lo) and one standing for S3 outside
the cluster on 198.51.100.7:9000. The kube-dns Service is served by a CoreDNS pod in kube-system labelled
k8s-app=kube-dns, as in a real cluster (the dev node's own CoreDNS is a host process on the API server's
address, which the fence refuses; the pod forwards to it).

First without policies: every pod reaches every listener, the API server (its address and the
`kubernetes` Service) and the other namespace's task app, so a refusal afterwards is the policy's. Then
the operator's rendered policies for both namespaces are applied, and:
- a job pod and a TaskApp pod reach neither 169.254.169.254 nor the API server (address or Service);
- both still resolve names through kube-dns, reach the S3 stand-in, and the job pod its own namespace's
  task app through its Service;
- the task app takes no connection from a job pod of another namespace nor from a pod of its own
  namespace that belongs to no job (neither does the job pod), and takes the operator's;
- in a third namespace whose fence denies only the `kubernetes` Service's ClusterIP (what an operator in
  the cluster finds by itself), a job pod still reaches the API server, through that ClusterIP too: the
  policy sees the address kube-proxy translated it to. The API server's own addresses must be denied.
The cluster is then stopped and the host checked for leftovers (kube-router's chains and ipsets too)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fixtures.jobs import job_object, sft_spec
from kubernetes import client, config
from posttrain.controller.namespace_objects import render_namespace_objects
from posttrain.controller.objects import parse_job, parse_task_app
from posttrain.controller.render import render_sftjob
from posttrain.controller.render.taskapp import render_task_app
from posttrain.controller.settings import MANAGER, OperatorSettings
from posttrain_dev import devnode
from posttrain_dev.devcluster import DevCluster, binaries_dir, kubectl_path

pytestmark = [pytest.mark.realnode]

NETCHECK_IMAGE = "localhost/posttrain/netcheck:1.0"
COREDNS_IMAGE = "localhost/posttrain/coredns:1.0"
METADATA = ("169.254.169.254", 80)
S3 = ("198.51.100.7", 9000)  # TEST-NET-2: an address outside the cluster, in the allowed networks
APP_PORT = 8080
KUBERNETES_SERVICE = ("10.0.0.1", 443)
ENFORCED_WITHIN = 90.0  # seconds from the policies' creation to the first refused probe
SETTINGS = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1")


@dataclass
class Node:
    dev: DevCluster
    api: client.ApiClient
    core: client.CoreV1Api

    def kubectl(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([kubectl_path(), f"--kubeconfig={self.dev.kubeconfig}", *args],
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip

    def probe(self, namespace: str, pod: str, *targets: str) -> dict[str, dict]:
        out = self.kubectl("exec", "-n", namespace, pod, "--", "/netcheck", "probe", *targets)
        assert out.returncode == 0, out.stderr
        results = [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
        return {r["target"]: r for r in results}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    workdir = tmp_path_factory.mktemp("netpol-cluster")
    dev = DevCluster(workdir, real_node=True, network_policy=True, start_timeout=120)
    started = time.monotonic()
    with dev:
        print(f"\ncluster with the real node and kube-router up in {time.monotonic() - started:.0f}s")
        assert dev.node is not None
        dev.node.import_binary_image(binaries_dir() / "netcheck", NETCHECK_IMAGE)
        dev.node.import_binary_image(binaries_dir() / "coredns", COREDNS_IMAGE)
        api = config.new_client_from_config(config_file=str(dev.kubeconfig))
        try:
            yield Node(dev, api, client.CoreV1Api(api))
        finally:
            api.close()
    left = devnode.leftovers(workdir / "node")
    assert left == [], f"the real node left behind: {left}"


@contextlib.contextmanager
def host_listener(address: tuple[str, int], banner: str) -> Iterator[None]:
    """A TCP listener on the host at `address` (added to lo for the test) that sends `banner` and closes."""
    added = subprocess.run(["ip", "addr", "add", f"{address[0]}/32", "dev", "lo"], capture_output=True, text=True)
    assert added.returncode == 0, added.stderr
    server = socket.create_server(address)
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.sendall(f"{banner}\n".encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        server.close()
        subprocess.run(["ip", "addr", "del", f"{address[0]}/32", "dev", "lo"], capture_output=True)


def template_labels(objects: list[dict[str, Any]], kind: str) -> dict[str, str]:
    return next(o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] == kind)


def netcheck_pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """A pod as locked down as the operator renders them, serving APP_PORT."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": devnode.NODE_NAME,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "netcheck", "image": NETCHECK_IMAGE, "imagePullPolicy": "Never",
                "args": ["serve", str(APP_PORT)],
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }  # fmt: skip


def dns_pod(upstream: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """CoreDNS as a kube-system pod labelled k8s-app=kube-dns on port 53, forwarding to `upstream`."""
    corefile = f".:53 {{\n    errors\n    forward . {upstream}\n    cache 5\n}}\n"
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "netpol-dns"},
                  "data": {"Corefile": corefile}}  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "netpol-dns", "labels": {"k8s-app": "kube-dns"}},
        "spec": {
            "nodeName": devnode.NODE_NAME,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsUser": 65532, "runAsNonRoot": True,
                                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]},
            "containers": [{"name": "coredns", "image": COREDNS_IMAGE, "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "volumeMounts": [{"name": "conf", "mountPath": "/etc/coredns"}]}],
            "volumes": [{"name": "conf", "configMap": {"name": "netpol-dns"}}],
        },
    }  # fmt: skip
    return config_map, pod


def wait_running(core: client.CoreV1Api, namespace: str, names: list[str], timeout: float = 120) -> dict[str, str]:
    """{pod: IP} once every pod runs."""
    deadline = time.monotonic() + timeout
    while True:
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(namespace).items if p.metadata.name in names}
        ready = {n: p.status.pod_ip for n, p in pods.items() if p.status.phase == "Running" and p.status.pod_ip}
        if len(ready) == len(names):
            return ready
        assert time.monotonic() < deadline, f"pods in {namespace} not running: {[(n, p.status.phase) for n, p in pods.items()]}"
        time.sleep(1)


@contextlib.contextmanager
def dns_served_by(node: Node, pod_ip: str) -> Iterator[None]:
    """Points the kube-dns Service's EndpointSlice (the dev node's, at its host CoreDNS) at the DNS pod on
    port 53 for the test, and back afterwards."""
    discovery = client.DiscoveryV1Api(node.api)
    original = discovery.read_namespaced_endpoint_slice("kube-dns-node", "kube-system")
    saved = node.api.sanitize_for_serialization(original)
    changed = json.loads(json.dumps(saved))
    changed["endpoints"] = [{"addresses": [pod_ip], "conditions": {"ready": True}}]
    for port in changed["ports"]:
        port["port"] = 53
    discovery.replace_namespaced_endpoint_slice("kube-dns-node", "kube-system", changed)
    try:
        yield
    finally:
        current = discovery.read_namespaced_endpoint_slice("kube-dns-node", "kube-system")
        saved["metadata"]["resourceVersion"] = current.metadata.resource_version
        discovery.replace_namespaced_endpoint_slice("kube-dns-node", "kube-system", saved)


def reached(result: dict, banner: str | None = None) -> bool:
    """Connected (or resolved); with `banner`, to the listener that sends it."""
    return bool(result["ok"]) and (banner is None or result.get("reply") == banner)


def test_the_fences_refuse_metadata_and_api_server_and_let_dns_s3_and_own_task_app_through(node: Node) -> None:
    dev = node.dev
    assert dev.node is not None
    api_server = (dev.host, dev.ports["apiserver"])
    assert not 30000 <= api_server[1] <= 32767, "an API server on a NodePort is open to every pod"
    run = uuid.uuid4().hex[:6]
    ns_a, ns_b, ns_op = f"fence-a-{run}", f"fence-b-{run}", SETTINGS.operator_namespace
    ns_c = f"fence-c-{run}"
    for ns in (ns_a, ns_b, ns_op, ns_c):
        node.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    for ns in (ns_a, ns_b, ns_op, ns_c, "kube-system"):  # pods wait for the namespace's default ServiceAccount
        deadline = time.monotonic() + 60
        while not any(a.metadata.name == "default" for a in node.core.list_namespaced_service_account(ns).items):
            assert time.monotonic() < deadline, f"no default ServiceAccount in {ns}"
            time.sleep(0.5)
    task_app = parse_task_app({"apiVersion": "posttrain.dev/v1alpha1", "kind": "TaskApp",
                               "metadata": {"name": "app", "namespace": ns_a, "uid": str(uuid.uuid4())},
                               "spec": {"image": "reg/app:1", "port": APP_PORT}})  # fmt: skip
    app_labels = template_labels(render_task_app(task_app, SETTINGS), "Deployment")
    sft = parse_job(job_object("SFTJob", sft_spec(), name="tune", namespace=ns_a))
    job_labels = template_labels(render_sftjob(sft, SETTINGS).children, "Job")
    assert job_labels["posttrain.dev/kind"] == "sftjob" and app_labels["posttrain.dev/kind"] == "taskapp"

    for ns, name, labels in ((ns_a, "app", app_labels), (ns_a, "job", job_labels), (ns_b, "job", job_labels),
                             (ns_a, "other", {"app": "other"}), (ns_op, "operator", {"app.kubernetes.io/name": MANAGER}),
                             (ns_c, "job", job_labels)):  # fmt: skip
        node.core.create_namespaced_pod(ns, netcheck_pod(name, labels))
    node.core.create_namespaced_service(ns_a, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "app"},
        "spec": {"selector": app_labels, "ports": [{"port": APP_PORT, "targetPort": APP_PORT}]}})  # fmt: skip
    config_map, pod = dns_pod(f"{dev.host}:{dev.node.ports['dns']}")
    node.core.create_namespaced_config_map("kube-system", config_map)
    node.core.create_namespaced_pod("kube-system", pod)
    ips = wait_running(node.core, ns_a, ["app", "job", "other"])
    wait_running(node.core, ns_b, ["job"])
    wait_running(node.core, ns_op, ["operator"])
    wait_running(node.core, ns_c, ["job"])
    dns_ip = wait_running(node.core, "kube-system", ["netpol-dns"])["netpol-dns"]

    metadata, s3 = f"tcp:{METADATA[0]}:{METADATA[1]}", f"tcp:{S3[0]}:{S3[1]}"
    apiserver, kubernetes = f"tcp:{api_server[0]}:{api_server[1]}", f"tcp:{KUBERNETES_SERVICE[0]}:{KUBERNETES_SERVICE[1]}"
    dns = "dns:kubernetes.default.svc.cluster.local"
    app_service, app_pod = f"tcp:app.{ns_a}.svc.cluster.local:{APP_PORT}", f"tcp:{ips['app']}:{APP_PORT}"
    every = [metadata, apiserver, kubernetes, dns, s3, app_service, app_pod]
    summary: dict[str, Any] = {}
    with host_listener(METADATA, "host-metadata"), host_listener(S3, "host-s3"), dns_served_by(node, dns_ip):
        # Without policies everything answers: the listeners are there and the pods' network works.
        for ns, pod in ((ns_a, "job"), (ns_a, "app"), (ns_b, "job")):
            before = node.probe(ns, pod, *every)
            assert reached(before[metadata], "host-metadata"), before[metadata]
            assert reached(before[s3], "host-s3"), before[s3]
            assert reached(before[dns]) and reached(before[apiserver]) and reached(before[kubernetes]), before
            assert reached(before[app_service], "netcheck app") and reached(before[app_pod], "netcheck app"), before

        settings = SETTINGS.model_copy(update={
            # what the operator finds: its own connection's address and the in-cluster Service's
            "api_server_addresses": f"{api_server[0]}:{api_server[1]},{KUBERNETES_SERVICE[0]}:{KUBERNETES_SERVICE[1]}"})  # fmt: skip
        net = client.NetworkingV1Api(node.api)
        applied = time.monotonic()
        for ns in (ns_a, ns_b):
            for obj in render_namespace_objects(ns, settings):
                if obj["kind"] == "NetworkPolicy":
                    net.create_namespaced_network_policy(ns, obj)
        only_service = SETTINGS.model_copy(update={"api_server_addresses": f"{KUBERNETES_SERVICE[0]}:{KUBERNETES_SERVICE[1]}"})
        for obj in render_namespace_objects(ns_c, only_service):
            if obj["kind"] == "NetworkPolicy":
                net.create_namespaced_network_policy(ns_c, obj)
        while reached(node.probe(ns_a, "job", metadata)[metadata]):
            assert time.monotonic() - applied < ENFORCED_WITHIN, "kube-router never enforced the policies"
            time.sleep(1)
        summary["enforced_after_s"] = round(time.monotonic() - applied, 1)

        started = time.monotonic()
        job = node.probe(ns_a, "job", *every)
        app = node.probe(ns_a, "app", metadata, apiserver, kubernetes, dns, s3)
        other = node.probe(ns_b, "job", app_service, app_pod, dns, s3)
        operator = node.probe(ns_op, "operator", app_pod)
        neighbour = node.probe(ns_a, "other", app_pod, f"tcp:{ips['job']}:{APP_PORT}")
        service_only = node.probe(ns_c, "job", apiserver, kubernetes, metadata)
        summary["probes_s"] = round(time.monotonic() - started, 1)
        for who, results in (("job", job), ("task app", app)):
            for target in (metadata, apiserver, kubernetes):
                assert not reached(results[target]), f"the {who} pod reached {target}: {results[target]}"
            assert reached(results[dns]), f"the {who} pod cannot resolve names: {results[dns]}"
            assert reached(results[s3], "host-s3"), f"the {who} pod cannot reach S3: {results[s3]}"
        assert reached(job[app_service], "netcheck app") and reached(job[app_pod], "netcheck app"), job
        for target in (app_service, app_pod):
            assert not reached(other[target]), f"a job pod of {ns_b} reached {ns_a}'s task app: {other[target]}"
        assert reached(other[dns]) and reached(other[s3], "host-s3"), other
        assert reached(operator[app_pod], "netcheck app"), operator
        assert not any(reached(r) for r in neighbour.values()), f"a pod of {ns_a} that is no job's got in: {neighbour}"
        # Denying only the `kubernetes` Service's ClusterIP (all an operator in the cluster finds by itself)
        # fences nothing: the policy sees the API server's own address after kube-proxy's DNAT. So
        # POSTTRAIN_API_SERVER_ADDRESSES must name the API server's endpoints (docs/security.md).
        assert reached(service_only[kubernetes]) and reached(service_only[apiserver]), service_only
        assert not reached(service_only[metadata]), service_only

    def verdict(results: dict[str, dict]) -> dict[str, str]:
        return {t: ("reached" if r["ok"] else f"refused ({r.get('error', '')[-60:]})") for t, r in results.items()}

    summary.update({"job": verdict(job), "task app": verdict(app), f"job of {ns_b}": verdict(other),
                    "operator": verdict(operator), f"{ns_a}'s pod of no job": verdict(neighbour),
                    "job, only the ClusterIP denied": verdict(service_only)})  # fmt: skip
    print("\nnetpol: " + json.dumps(summary))
    Path(dev.workdir / "netpol-summary.json").write_text(json.dumps(summary, indent=1))
