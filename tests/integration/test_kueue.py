"""All-or-nothing admission through the real Kueue (v0.17 manager built by hack/build-kueue.sh) on its own
dev control plane (2 kwok nodes x 8 GPUs), with the operator as a subprocess. A ClusterQueue of 8 GPUs:
the first job's whole topology is admitted at once; the second waits, Queued with Kueue's reason and with
no pod at all (not half of its pods holding GPUs), and runs when the first finishes and gives its quota
back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.cluster import ClusterHandle
from fixtures.operator_env import Env, operator_env, wait_for
from fixtures.operator_process import api_client_of, complete_trainer
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION
from posttrain_dev.devcluster import DevCluster

pytestmark = [pytest.mark.cluster]
REPO = Path(__file__).resolve().parents[2]
KUEUE = ("kueue.x-k8s.io", "v1beta2")


@pytest.fixture(scope="module")
def kueue_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterHandle]:
    workdir = tmp_path_factory.mktemp("kueue-cluster")
    with DevCluster(workdir, nodes=2, kueue=True, start_timeout=120) as dev:
        yield ClusterHandle(dev.kubeconfig, dev)


def queues(namespace: str, gpus: int) -> list[tuple[str, dict[str, Any]]]:
    """(plural, object): manifests/overlays/kueue's shape, one team, `gpus` GPUs of quota."""
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"},
              "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}}  # fmt: skip
    cq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": namespace},
        "spec": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
            "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu", "memory"], "flavors": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus},
                                               {"name": "cpu", "nominalQuota": 64},
                                               {"name": "memory", "nominalQuota": "512Gi"}]}]}],  # fmt: skip
        },
    }
    lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
          "metadata": {"name": "gpus", "namespace": namespace}, "spec": {"clusterQueue": namespace}}  # fmt: skip
    return [("resourceflavors", flavor), ("clusterqueues", cq), ("localqueues", lq)]


def sftjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SFTJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "posttrain/tiny-random-qwen2"},
            "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
            # Two trainer pods of 4 GPUs: admitted together or not at all.
            "compute": {"gpuType": "H100", "gpuCount": 8, "nodes": 2},
            "hyperparameters": {"nEpochs": 1},
            "dataset": {"configMapRef": {"name": "sft-data", "key": "train.jsonl"}},
            "scheduling": {"queueName": "gpus"},
        },
    }


@pytest.fixture
def kenv(kueue_cluster: ClusterHandle, tmp_path: Path) -> Iterator[Env]:
    ns = f"t-{uuid.uuid4().hex[:10]}"
    api = api_client_of(kueue_cluster)
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    co = client.CustomObjectsApi(api)
    for plural, obj in queues(ns, gpus=8):
        if plural == "localqueues":
            co.create_namespaced_custom_object(*KUEUE, ns, plural, obj)
            continue
        try:
            co.create_cluster_custom_object(*KUEUE, plural, obj)
        except ApiException as err:
            if err.status != 409:  # the flavor h100 exists (manifests/overlays/kueue's test made it)
                raise
    core.create_namespaced_config_map(ns, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="sft-data"),
        data={"train.jsonl": '{"messages": [{"role": "user", "content": "hi"}, '
                             '{"role": "assistant", "content": "hello"}]}\n'}))  # fmt: skip
    with operator_env(kueue_cluster, ns, tmp_path / "operator.log",
                      settings={"POSTTRAIN_QUEUE_POLL_SECONDS": "0.5", "POSTTRAIN_ADMITTED_POLL_SECONDS": "0.5",
                                "POSTTRAIN_STATUS_MESSAGE_SECONDS": "1",
                                # the classes the preemption test names (scheduling_policy.py)
                                "POSTTRAIN_ALLOWED_WORKLOAD_PRIORITY_CLASSES": "posttrain-test-low,posttrain-test-high"}) as handle:  # fmt: skip
        yield handle


def pods_of(env: Env, job: str) -> list[client.V1Pod]:
    return env.core.list_namespaced_pod(env.ns, label_selector=f"posttrain.dev/job={job}").items


def test_a_job_is_admitted_whole_or_waits_queued_with_no_pods(kenv: Env) -> None:
    env = kenv
    co = client.CustomObjectsApi(env.api)
    env.create("sftjobs", sftjob("first"))
    env.wait_phase("sftjobs", "first", "Running", timeout=90)
    assert len(pods_of(env, "first")) == 2
    wl = co.get_namespaced_custom_object(*KUEUE, env.ns, "workloads", "first-workload")
    assert [(p["name"], p["count"]) for p in wl["spec"]["podSets"]] == [("trainer", 2)]
    assert wl["status"]["admission"]["clusterQueue"] == env.ns
    admitted = next(c for c in env.status("sftjobs", "first")["conditions"] if c["type"] == "Admitted")
    assert admitted["status"] == "True"

    env.create("sftjobs", sftjob("second"))
    status = env.wait_phase("sftjobs", "second", "Queued", timeout=60)
    assert status["reason"] == "Queued"
    # Kueue's own words: the GPUs are short in the queue's quota.
    wait_for(lambda: "nvidia.com/gpu" in env.status("sftjobs", "second").get("message", ""), 30,
             "Kueue's reason in the queued job's status")  # fmt: skip
    assert pods_of(env, "second") == []
    trainer = env.batch.read_namespaced_job("second-trainer", env.ns)
    assert trainer.spec.suspend is True

    complete_trainer(env.api, env.ns, "first-trainer", succeed=True)
    env.wait_phase("sftjobs", "first", "Succeeded", timeout=60)
    # The finished job's Workload is gone (its quota back), and the queued job runs, all of it.
    wait_for(lambda: not co.list_namespaced_custom_object(*KUEUE, env.ns, "workloads",
                                                         field_selector="metadata.name=first-workload")["items"],
             30, "the first job's Workload deleted")  # fmt: skip
    env.wait_phase("sftjobs", "second", "Running", timeout=90)
    assert len([p for p in pods_of(env, "second") if p.spec.node_name]) == 2


def _condition(env: Env, job: str, ctype: str) -> dict[str, Any]:
    return next((c for c in env.status("sftjobs", job).get("conditions") or [] if c["type"] == ctype), {})


def test_a_higher_priority_job_preempts_a_lower_one_which_resumes_when_admitted_again(kenv: Env) -> None:
    """A ClusterQueue of 8 GPUs that preempts by priority (withinClusterQueue: LowerPriority, as
    manifests/overlays/kueue). The low-priority job runs; a high-priority job of 8 GPUs comes: Kueue evicts
    the low one, whose pods go (trainer Job suspended) while the job stays, Queued with reason Preempted and
    naming the checkpoint it resumes from; the high one runs. Once the high one is gone the low one is
    admitted again and new trainer pods run (they resume from that checkpoint: tests/integration/
    test_trainer_preemption.py)."""
    env = kenv
    co = client.CustomObjectsApi(env.api)
    co.patch_cluster_custom_object(*KUEUE, "clusterqueues", env.ns,
                                   {"spec": {"preemption": {"withinClusterQueue": "LowerPriority"}}})  # fmt: skip
    for name, value in (("posttrain-test-low", 10), ("posttrain-test-high", 1000)):
        try:
            co.create_cluster_custom_object(*KUEUE, "workloadpriorityclasses", {
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                "metadata": {"name": name}, "value": value})  # fmt: skip
        except ApiException as err:
            if err.status != 409:
                raise
    low, high = sftjob("low"), sftjob("high")
    low["spec"]["scheduling"]["workloadPriorityClassName"] = "posttrain-test-low"
    high["spec"]["scheduling"]["workloadPriorityClassName"] = "posttrain-test-high"
    env.create("sftjobs", low)
    env.wait_phase("sftjobs", "low", "Running", timeout=90)
    wl = co.get_namespaced_custom_object(*KUEUE, env.ns, "workloads", "low-workload")
    assert wl["spec"]["priority"] == 10 and wl["spec"]["priorityClassRef"]["name"] == "posttrain-test-low"
    first_pods = {p.metadata.uid for p in pods_of(env, "low")}
    assert len(first_pods) == 2
    # what the trainer reports after a checkpoint (here, where no trainer runs, written as it would)
    ckpt = f"s3://posttrain/jobs/{env.ns}/low/checkpoints/step-7/"
    co.patch_namespaced_custom_object_status(GROUP, VERSION, env.ns, "sftjobs", "low",
                                             {"status": {"progress": {"step": 7, "lastCheckpoint": ckpt}}})  # fmt: skip

    env.create("sftjobs", high)
    status = env.wait_phase("sftjobs", "low", "Queued", timeout=60)
    assert status["reason"] == "Preempted", status
    assert ckpt in status["message"]
    preempted = _condition(env, "low", "Preempted")
    assert preempted["status"] == "True" and "InClusterQueue" in preempted["message"]
    env.wait_phase("sftjobs", "high", "Running", timeout=60)
    assert env.batch.read_namespaced_job("low-trainer", env.ns).spec.suspend is True
    wait_for(lambda: not pods_of(env, "low"), 60, "the preempted job's pods gone")
    # the job is kept, not failed, and still says why it waits
    assert env.status("sftjobs", "low")["reason"] == "Preempted"
    events = env.core.list_namespaced_event(env.ns, field_selector="involvedObject.name=low").items
    assert any(e.reason == "Preempted" for e in events)

    env.co.delete_namespaced_custom_object(GROUP, VERSION, env.ns, "sftjobs", "high")
    env.wait_phase("sftjobs", "low", "Running", timeout=90)
    readmitted = _condition(env, "low", "Preempted")
    assert (readmitted["status"], readmitted["reason"]) == ("False", "Readmitted") and ckpt in readmitted["message"]
    again = wait_for(lambda: [p for p in pods_of(env, "low") if p.spec.node_name and p.metadata.uid not in first_pods],
                     60, "new trainer pods of the re-admitted job")  # fmt: skip
    assert len(again) == 2 and all(p.spec.termination_grace_period_seconds == 300 for p in again)


def test_the_kueue_overlay_is_accepted_and_its_queues_become_active(kueue_cluster: ClusterHandle) -> None:
    """manifests/overlays/kueue against the real Kueue: its CRDs accept every object, and its manager
    makes the ClusterQueues Active (the flavor they name exists) and the LocalQueues usable."""
    api = api_client_of(kueue_cluster)
    core = client.CoreV1Api(api)
    for ns in ("team-a", "team-b"):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    applied = kueue_cluster.kubectl("apply", "-k", str(REPO / "manifests/overlays/kueue"))
    assert applied.returncode == 0, applied.stderr
    co = client.CustomObjectsApi(api)

    def active(plural: str, name: str, ns: str | None = None) -> bool:
        obj = (co.get_namespaced_custom_object(*KUEUE, ns, plural, name) if ns
               else co.get_cluster_custom_object(*KUEUE, plural, name))  # fmt: skip
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Active" and c["status"] == "True" for c in conds)

    for team in ("team-a", "team-b"):
        wait_for(lambda t=team: active("clusterqueues", t), 60, f"ClusterQueue {team} Active")
        wait_for(lambda t=team: active("localqueues", "gpus", t), 60, f"LocalQueue gpus in {team} Active")
