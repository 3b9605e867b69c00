"""compute.gpuType chooses nodes on the real control plane: kwok GPU nodes labelled with different
nvidia.com/gpu.product values (as GPU feature discovery labels real ones), the operator as a subprocess,
the real kube-scheduler placing the trainer pods. A job lands only on the nodes of its GPU type, and waits
(Pending, unschedulable) rather than landing on free GPUs of another type."""

from __future__ import annotations

from typing import Any

import pytest
from fixtures.operator_env import Env, wait_for
from fixtures.operator_process import add_gpu_nodes
from kubernetes import client
from posttrain.api.resources import GROUP, VERSION

pytestmark = [pytest.mark.cluster]


def sftjob(name: str, gpu_type: str, gpus: int, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SFTJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "posttrain/tiny-random-qwen2"},
            "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
            "compute": {"gpuType": gpu_type, "gpuCount": gpus, "nodes": nodes},
            "hyperparameters": {"nEpochs": 1},
            "dataset": {"configMapRef": {"name": "sft-data", "key": "train.jsonl"}},
        },
    }


def trainer_pods(env: Env, job: str) -> list[client.V1Pod]:
    return env.core.list_namespaced_pod(env.ns, label_selector=f"posttrain.dev/job={job}").items


def test_gpu_type_places_trainer_pods_only_on_nodes_of_that_gpu(env: Env, cluster: Any) -> None:
    # Beside the session's H100 nodes (8 free GPUs each): two L40S nodes and one A100 node, named apart
    # from the nodes other tests add.
    l40s = add_gpu_nodes(cluster, 2, start=330, gpu_product="NVIDIA-L40S")
    a100 = add_gpu_nodes(cluster, 1, start=332, gpu_product="NVIDIA-A100-SXM4-80GB")
    env.core.create_namespaced_config_map(
        env.ns,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="sft-data"),
            data={"train.jsonl": '{"messages": [{"role": "user", "content": "hi"}, '
                                 '{"role": "assistant", "content": "hello"}]}\n'},  # fmt: skip
        ),
    )
    env.create("sftjobs", sftjob("on-l40s", "L40S", gpus=16, nodes=2))
    env.create("sftjobs", sftjob("on-a100", "a100", gpus=8, nodes=1))
    env.wait_phase("sftjobs", "on-l40s", "Running", timeout=90)
    env.wait_phase("sftjobs", "on-a100", "Running", timeout=90)
    placed = {p.metadata.name: p.spec.node_name for p in trainer_pods(env, "on-l40s")}
    assert len(placed) == 2 and sorted(placed.values()) == sorted(l40s), placed
    (only,) = trainer_pods(env, "on-a100")
    assert only.spec.node_name == a100[0]

    # Every L40S GPU is taken now: a third L40S job waits unschedulable, though H100 nodes have free GPUs.
    env.create("sftjobs", sftjob("waits", "L40S", gpus=8, nodes=1))

    def unschedulable() -> client.V1Pod | None:
        pods = trainer_pods(env, "waits")
        for pod in pods:
            for cond in pod.status.conditions or []:
                if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                    return pod
        return None

    pod = wait_for(unschedulable, timeout=60, what="the third L40S trainer pod to be unschedulable")
    assert pod.spec.node_name is None
    assert env.phase("sftjobs", "waits") != "Running"
