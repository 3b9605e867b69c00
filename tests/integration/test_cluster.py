"""The local control plane behaves like a cluster: GPU pods scheduled onto kwok nodes, Jobs completing,
garbage collection of owned objects, kubectl working."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

from kubernetes import client, config
from posttrain_dev.devcluster import GPU_RESOURCE, KWOK_EXIT_ANNOTATION


def wait_for(predicate: Callable[[], object], timeout: float = 60, what: str = "condition") -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def gpu_job(name: str, parallelism: int, gpus: int) -> client.V1Job:
    container = client.V1Container(
        name="trainer",
        image="posttrain/trainer:dev",
        resources=client.V1ResourceRequirements(limits={GPU_RESOURCE: str(gpus)}),
    )
    return client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(
            completions=parallelism,
            parallelism=parallelism,
            completion_mode="Indexed",
            backoff_limit=0,
            template=client.V1PodTemplateSpec(
                spec=client.V1PodSpec(restart_policy="Never", containers=[container])
            ),
        ),
    )


def test_gpu_job_is_scheduled_runs_and_completes(cluster, namespace):
    api = cluster.api_client()
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(namespace, gpu_job("train", parallelism=2, gpus=8))

    def running_pods():
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=train").items
        return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else None

    pods = wait_for(running_pods, what="2 running trainer pods")
    nodes = {p.spec.node_name for p in pods}
    # 8 GPUs each on 8-GPU nodes: the scheduler had to put them on two different kwok nodes.
    assert len(nodes) == 2 and all(n.startswith("kwok-gpu-") for n in nodes)

    for pod in pods:
        core.patch_namespaced_pod(
            pod.metadata.name, namespace, {"metadata": {"annotations": {KWOK_EXIT_ANNOTATION: "0"}}}
        )

    def job_complete():
        job = batch.read_namespaced_job("train", namespace)
        return any(c.type == "Complete" and c.status == "True" for c in (job.status.conditions or []))

    wait_for(job_complete, what="Job Complete")
    assert batch.read_namespaced_job("train", namespace).status.succeeded == 2


def test_pod_driven_to_failure_fails_the_job_with_its_exit_code(cluster, namespace):
    api = cluster.api_client()
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    batch.create_namespaced_job(namespace, gpu_job("crash", parallelism=1, gpus=1))
    pod = wait_for(
        lambda: next(
            (
                p
                for p in core.list_namespaced_pod(namespace, label_selector="job-name=crash").items
                if p.status.phase == "Running"
            ),
            None,
        ),
        what="running pod",
    )
    core.patch_namespaced_pod(
        pod.metadata.name, namespace, {"metadata": {"annotations": {KWOK_EXIT_ANNOTATION: "3"}}}
    )

    def failed():
        job = batch.read_namespaced_job("crash", namespace)
        return any(c.type == "Failed" and c.status == "True" for c in (job.status.conditions or []))

    wait_for(failed, what="Job Failed")
    terminated = (
        core.read_namespaced_pod(pod.metadata.name, namespace).status.container_statuses[0].state.terminated
    )
    assert terminated.exit_code == 3


def test_a_request_larger_than_any_node_stays_pending(cluster, namespace):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    client.BatchV1Api(api).create_namespaced_job(namespace, gpu_job("too-big", parallelism=1, gpus=9))

    def unschedulable():
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=too-big").items
        return pods and any(
            c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
            for c in (pods[0].status.conditions or [])
        )

    wait_for(unschedulable, what="Unschedulable condition")


def test_deleting_the_owner_garbage_collects_owned_objects(cluster, namespace):
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"), data={"a": "b"})
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid, block_owner_deletion=True
    )
    core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="owned", owner_references=[ref]),
            spec=client.V1ServiceSpec(
                cluster_ip="None", selector={"a": "b"}, ports=[client.V1ServicePort(port=80)]
            ),
        ),
    )
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Foreground")

    def gone():
        return not core.list_namespaced_service(namespace).items

    wait_for(gone, what="owned Service garbage-collected")


def test_kubectl_sees_the_gpu_nodes(cluster):
    out = cluster.kubectl("get", "nodes", "-o", "json").stdout
    nodes = {n["metadata"]["name"]: n for n in json.loads(out)["items"]}
    # the session's 4 nodes; operator tests that ran earlier in the session may have added more (kwok-gpu-1xx)
    started = {f"kwok-gpu-{i}" for i in range(4)}
    assert started <= set(nodes), sorted(nodes)
    assert all(nodes[name]["status"]["allocatable"][GPU_RESOURCE] == "8" for name in started)


def test_a_control_plane_whose_picked_port_is_taken_starts_on_fresh_ports(tmp_path, monkeypatch):
    """Another process binds the scheduler's picked port before the scheduler does (as an outgoing
    connection once did in CI): the harness starts over on fresh ports instead of failing the session."""
    from posttrain_dev import devcluster

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        picks = iter([None, None, None, taken])  # etcd, etcd-peer, apiserver, then the scheduler's
        real_pick = devcluster.free_port
        monkeypatch.setattr(devcluster, "free_port", lambda: next(picks, None) or real_pick())
        with devcluster.DevCluster(tmp_path / "cluster", nodes=1) as dev:
            assert dev.ports["scheduler"] != taken
            log = (tmp_path / "cluster" / "logs" / "kube-scheduler.log").read_text()
            assert "address already in use" not in log  # the log of the second, clean start
            nodes = client.CoreV1Api(config.new_client_from_config(str(dev.kubeconfig))).list_node()
            assert len(nodes.items) == 1
