"""A trainer may patch only its own job's status, on the real control plane: the real operator makes one
ServiceAccount, Role and RoleBinding per namespace (not per job), and the ValidatingAdmissionPolicy of
manifests/base/trainer-policy.yaml (installed with the CRDs) holds every request of that ServiceAccount to
the job its pod belongs to. The tokens are the ones a trainer pod gets: the ServiceAccount's, bound to a
trainer pod the Job controller made (kwok runs it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from fixtures.operator_env import Env, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION
from posttrain_dev.devcluster import kubectl_path

pytestmark = [pytest.mark.cluster]

SHORT = "ida"
# A job whose trainer's name starts with the first one's trainer name and pod prefix (ida-trainer-0-).
PREFIXED = "ida-trainer-0"
# 49 characters: the trainer Job is 57 long, so the Job controller cuts its pods' name prefix short.
LONG = "l" * 40 + "-long-name"[:9]


def sftjob(name: str, nodes: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "SFTJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"base": "posttrain/tiny-random-qwen2"},
            "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
            "compute": {"gpuType": "H100", "gpuCount": nodes, "nodes": nodes},
            "hyperparameters": {"nEpochs": 1},
            "dataset": {"configMapRef": {"name": "sft-data", "key": "train.jsonl"}},
        },
    }


def token_api(env: Env, token: str) -> client.CustomObjectsApi:
    """The custom-objects API as the holder of `token` (no client certificate)."""
    admin = env.api.configuration
    cfg = client.Configuration()
    cfg.host = admin.host
    cfg.ssl_ca_cert = admin.ssl_ca_cert
    cfg.verify_ssl = admin.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return client.CustomObjectsApi(client.ApiClient(cfg))


def pod_token(env: Env, kubeconfig: str, pod: Any) -> str:
    """The trainer ServiceAccount's token bound to `pod`, as the kubelet projects it into the pod."""
    import subprocess

    proc = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", "create", "token", pod.spec.service_account_name,
         "-n", env.ns, "--bound-object-kind=Pod", f"--bound-object-name={pod.metadata.name}",
         f"--bound-object-uid={pod.metadata.uid}", "--duration=10m"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return proc.stdout.strip()


def patch_progress(api: client.CustomObjectsApi, env: Env, job: str, step: int, **extra: Any) -> int:
    """HTTP status of a trainer's merge patch of `job`'s status.progress (200 or the refusal's)."""
    body = {"status": {"progress": {"step": step, "total": 10}, **extra}}
    try:
        api.patch_namespaced_custom_object_status(GROUP, VERSION, env.ns, "sftjobs", job, body)
    except ApiException as err:
        if err.status == 403:
            assert "a trainer may" in json.loads(err.body)["message"], err.body
        return err.status
    return 200


def test_a_trainer_patches_its_own_job_and_no_other(env: Env, cluster: Any, tmp_path: Path) -> None:
    kubeconfig = str(cluster.kubeconfig)
    data = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    env.core.create_namespaced_config_map(
        env.ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="sft-data"), data={"train.jsonl": data})
    )
    nodes = {SHORT: 1, PREFIXED: 1, LONG: 2}
    for name, count in nodes.items():
        env.create("sftjobs", sftjob(name, count))
    for name in nodes:
        env.wait_phase("sftjobs", name, "Running", timeout=60)

    # The mechanism: one identity for the namespace, none per job.
    sas = {s.metadata.name for s in env.core.list_namespaced_service_account(env.ns).items}
    assert "posttrain-trainer" in sas and not any(s.endswith("-trainer") and s != "posttrain-trainer" for s in sas)
    rbac = client.RbacAuthorizationV1Api(env.api)
    roles = {r.metadata.name: r for r in rbac.list_namespaced_role(env.ns).items}
    assert set(roles) == {"posttrain-trainer-status"}, set(roles)
    (rule,) = roles["posttrain-trainer-status"].rules
    assert (rule.api_groups, sorted(rule.resources), rule.verbs) == (
        [GROUP], ["rljobs/status", "sftjobs/status"], ["patch"]
    )  # fmt: skip

    pods: dict[str, list[Any]] = {}
    for name, count in nodes.items():
        pods[name] = wait_for(
            lambda name=name, count=count: (
                found
                if len(found := [p for p in env.children(name)["Pod"] if p.status.phase == "Running"]) == count
                else None
            ),
            30,
            f"{name}'s trainer pods Running",
        )
        for pod in pods[name]:
            assert pod.spec.service_account_name == "posttrain-trainer", pod.metadata.name
    long_pods = [p.metadata.name for p in pods[LONG]]
    assert all(len(n) == 63 and not n.startswith(f"{LONG}-trainer-") for n in long_pods), long_pods

    for name, mine in pods.items():
        for pod in mine:
            api = token_api(env, pod_token(env, kubeconfig, pod))
            for other in nodes:
                want = 200 if other == name else 403
                assert patch_progress(api, env, other, step=3) == want, (pod.metadata.name, other)
            # its own job, but not the record of which trainer is its own
            linked = {"linkedJobId": f"{env.ns}/someone-else-trainer"}
            assert patch_progress(api, env, name, step=4, **linked) == 403, pod.metadata.name
    assert env.status("sftjobs", SHORT)["progress"]["step"] == 3

    # The ServiceAccount's token without a pod (e.g. a long-lived Secret token) patches nothing.
    import subprocess

    unbound = subprocess.run(
        [kubectl_path(), f"--kubeconfig={kubeconfig}", "create", "token", "posttrain-trainer", "-n", env.ns],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()  # fmt: skip
    assert patch_progress(token_api(env, unbound), env, SHORT, step=5) == 403

    # The operator itself (another identity) still writes status: the policy matches the trainer only.
    assert env.status("sftjobs", SHORT)["phase"] == "Running"
    print(yaml.safe_dump({"pods": {k: [p.metadata.name for p in v] for k, v in pods.items()}}))
