"""Hostile tenants against the operator, on the real control plane with a real `posttrain operator`
process: what one tenant stores (a spec nested thousands of levels deep, a Secret under a child's name)
fails at most that tenant's job, and a job's servers keep their token whatever happens to its Secret (a
real vLLM rollout server takes a weight sync with the token read from the Secret the operator made again)."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.operator_env import FAST_ENV, Env, operator_env, wait_for
from fixtures.operator_process import (
    OperatorProcess,
    api_client_of,
    ensure_crds,
    kubeconfig_of,
    rljob_manifest,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.depth_policy import POLICY_NAME
from posttrain.api.resources import GROUP, VERSION

pytestmark = [pytest.mark.cluster]


def nested(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def deep_rljob(name: str, url: str, levels: int = 1500) -> str:
    """An RLJob whose spec.training.extras nests `levels` objects deep, as JSON text (json.dumps recurses)."""
    manifest = rljob_manifest(name, url)
    manifest["spec"]["training"]["extras"] = {"__deep__": None}
    return json.dumps(manifest).replace('{"__deep__": null}', nested(levels))


@contextlib.contextmanager
def namespace_of(cluster: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core = client.CoreV1Api(api_client_of(cluster))
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name, propagation_policy="Background")


def task_key_secret(core: client.CoreV1Api, namespace: str, key: str) -> None:
    # labelled as a task-app key: the operator sends no other Secret to a task app (docs/secrets-and-urls.md)
    meta = client.V1ObjectMeta(name="task-key", labels={"posttrain.dev/use": "task-app-key"})
    body = client.V1Secret(metadata=meta, string_data={"ENVIRONMENT_API_KEY": key})
    core.create_namespaced_secret(namespace, body)


def status_of(cluster: Any, namespace: str, name: str) -> dict[str, Any]:
    """The job's status through kubectl (Go): the Python client cannot decode a deep object at all."""
    out = cluster.kubectl("get", "rljobs", name, "-n", namespace, "-o", "jsonpath={.status}").stdout
    return json.loads(out) if out.strip() else {}


def wait_phase(cluster: Any, namespace: str, name: str, phase: str, timeout: float,
               operator: OperatorProcess) -> dict[str, Any]:  # fmt: skip
    try:
        return wait_for(lambda: (s := status_of(cluster, namespace, name)).get("phase") == phase and s, timeout,
                        f"{namespace}/{name} {phase}", interval=0.5)  # fmt: skip
    except AssertionError as err:
        raise AssertionError(f"{err}\n{operator.log_tail()}") from None


@contextlib.contextmanager
def without_depth_policy(cluster: Any) -> Iterator[None]:
    """The cluster as an install before the depth policy (or an older CRD) had it: the binding removed for
    the block, restored after."""
    admission = client.AdmissionregistrationV1Api(api_client_of(cluster))
    admission.delete_validating_admission_policy_binding(POLICY_NAME)
    try:
        yield
    finally:
        ensure_crds(api_client_of(cluster))  # installs the binding again


# ------------------------------------------------------------------------------------ 1: deep objects
def test_a_spec_nested_thousands_deep_fails_its_job_alone_and_the_operator_stays_up(
    cluster: Any, math_taskapp: Any, tmp_path: Path
) -> None:
    api = api_client_of(cluster)
    ensure_crds(api)
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    with namespace_of(cluster) as hostile, namespace_of(cluster) as other:
        for ns in (hostile, other):
            task_key_secret(core, ns, math_taskapp.api_key)
        # Today's install refuses it: the depth policy (crds/posttrain.dev_spec-depth-policy.yaml).
        refused = cluster.kubectl("create", "-n", hostile, "-f", "-", input=deep_rljob("deep", math_taskapp.url),
                                  check=False)  # fmt: skip
        assert refused.returncode != 0 and "spec nests deeper than" in refused.stderr, refused.stderr
        # Stored as an install without the policy would store it (extras keep unknown fields).
        with without_depth_policy(cluster):
            wait_for(lambda: cluster.kubectl("create", "-n", hostile, "-f", "-", check=False,
                                             input=deep_rljob("deep", math_taskapp.url)).returncode == 0,
                     20, "the deep RLJob stored")  # fmt: skip
        operator = OperatorProcess(kubeconfig_of(cluster), tmp_path / "operator.log",
                                   env={**FAST_ENV, "POSTTRAIN_NAMESPACE": f"{hostile},{other}"})  # fmt: skip
        try:
            operator.start()  # its first LIST holds the deep object
            co.create_namespaced_custom_object(GROUP, VERSION, other, "rljobs",
                                               rljob_manifest("fine", math_taskapp.url))  # fmt: skip
            failed = wait_phase(cluster, hostile, "deep", "Failed", 40, operator)
            assert failed["reason"] == "InvalidSpec"
            assert failed["message"].startswith("spec.training.extras.a.a.a"), failed["message"]
            assert "nested deeper than" in failed["message"]
            wait_phase(cluster, other, "fine", "Running", 60, operator)
            events = core.list_namespaced_event(hostile, field_selector="involvedObject.name=deep").items
            assert any(e.reason == "Failed" and "nested deeper" in e.message for e in events)
            # One more stored while it runs (a watch event, not a list), and a restart on both.
            with without_depth_policy(cluster):
                wait_for(lambda: cluster.kubectl("create", "-n", hostile, "-f", "-", check=False,
                                                 input=deep_rljob("deeper", math_taskapp.url, 5000)).returncode == 0,
                         20, "a second deep RLJob stored")  # fmt: skip
            wait_phase(cluster, hostile, "deeper", "Failed", 40, operator)
            operator.stop()
            operator.start()
            co.create_namespaced_custom_object(GROUP, VERSION, other, "rljobs",
                                               rljob_manifest("after", math_taskapp.url))  # fmt: skip
            wait_phase(cluster, other, "after", "Running", 60, operator)
            assert operator.proc is not None and operator.proc.poll() is None
            assert status_of(cluster, other, "fine")["phase"] == "Running"
            assert "RecursionError" not in operator.log_tail(200_000)
        finally:
            for ns in (hostile, other):
                cluster.kubectl("delete", "rljobs", "--all", "-n", ns, "--wait=false", check=False)
            operator.stop()


# ------------------------------------------------------------------------------------ 2: never adopt
def test_an_object_of_someone_elses_under_a_childs_name_fails_the_job_naming_it(
    env: Env, math_taskapp: Any
) -> None:
    env.secret("task-key", math_taskapp.api_key)
    # A tenant's Secret made before the job, under the name of the job's own Secret.
    planted = client.V1Secret(metadata=client.V1ObjectMeta(name="mine-config"),
                              string_data={"job.json": "{}", "token": "chosen-by-the-tenant"})  # fmt: skip
    env.core.create_namespaced_secret(env.ns, planted)
    env.create("rljobs", rljob_manifest("mine", math_taskapp.url))
    # Any other child kind too: a Service under the rollout's name, carrying the operator's labels.
    labels = {"app.kubernetes.io/managed-by": "posttrain-operator", "posttrain.dev/job": "svc",
              "posttrain.dev/kind": "rljob", "posttrain.dev/role": "rollout"}  # fmt: skip
    service = client.V1Service(metadata=client.V1ObjectMeta(name="svc-rollout", labels=labels),
                               spec=client.V1ServiceSpec(ports=[client.V1ServicePort(port=1)]))  # fmt: skip
    env.core.create_namespaced_service(env.ns, service)
    env.create("rljobs", rljob_manifest("svc", math_taskapp.url))
    env.create("rljobs", rljob_manifest("clean", math_taskapp.url))

    status = env.wait_phase("rljobs", "mine", "Failed", timeout=40)
    assert status["reason"] == "ChildNotOwned"
    assert status["message"].startswith("Secret mine-config exists and is not this job's"), status["message"]
    secret = env.core.read_namespaced_secret("mine-config", env.ns)
    assert not secret.metadata.owner_references  # left as it was: not adopted
    assert base64.b64decode(secret.data["token"]).decode() == "chosen-by-the-tenant"
    assert not env.children("mine")["Deployment"] and not env.children("mine")["Job"]
    status = env.wait_phase("rljobs", "svc", "Failed", timeout=40)
    assert status["reason"] == "ChildNotOwned" and "Service svc-rollout" in status["message"], status
    kept = env.core.read_namespaced_service("svc-rollout", env.ns)
    assert not kept.metadata.owner_references and kept.spec.ports[0].port == 1  # not applied over, not deleted
    env.wait_phase("rljobs", "clean", "Running", timeout=60)  # the namespace's other jobs go on
    # A TaskApp's children too: a Deployment of someone else's under its name.
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app-task-app"},
                  "spec": {"replicas": 0, "selector": {"matchLabels": {"x": "y"}},
                           "template": {"metadata": {"labels": {"x": "y"}},
                                        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}}  # fmt: skip
    env.apps.create_namespaced_deployment(env.ns, deployment)
    env.create("taskapps", {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": "app"},
                            "spec": {"image": "posttrain/taskapp-math:dev", "port": 8000}})  # fmt: skip
    cond = wait_for(lambda: next((c for c in env.status("taskapps", "app").get("conditions") or []
                                  if c["type"] == "Verified" and c["status"] == "False"), None),
                    30, "TaskApp app not verified")  # fmt: skip
    assert cond["reason"] == "ChildNotOwned" and "Deployment app-task-app" in cond["message"], cond
    assert env.apps.read_namespaced_deployment("app-task-app", env.ns).spec.replicas == 0  # untouched


# ------------------------------------------------------------------------------------ 3: one token
@pytest.mark.vllm
def test_servers_keep_the_jobs_token_when_its_secret_is_deleted_a_real_weight_sync_proves_it(
    cluster: Any, namespace: str, math_taskapp: Any, vllm_model_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from fixtures.vllm import STOP_GRACE_S, start_rollout_server
    from posttrain import reaper
    from posttrain.localhost import stop_group

    with namespace_of(cluster) as system:  # the operator's own namespace: where its token key lives
        settings = {"POSTTRAIN_TOKEN_KEY_NAMESPACE": system}
        with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
            env.secret("task-key", math_taskapp.api_key)
            env.create("rljobs", rljob_manifest("sync", math_taskapp.url))
            env.wait_phase("rljobs", "sync", "Running", timeout=60)

            def token() -> str | None:
                try:
                    secret = env.core.read_namespaced_secret("sync-config", env.ns)
                except ApiException as err:
                    if err.status == 404:
                        return None
                    raise
                return base64.b64decode(secret.data["token"]).decode()

            started_with = token()
            assert started_with and len(started_with) >= 32
            # The job's rollout server, as its pod runs it: the token from the Secret in its environment.
            monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", started_with)
            proc, server = start_rollout_server(vllm_model_dir, tmp_path / "rollout")
            monkeypatch.delenv("POSTTRAIN_ROLLOUT_TOKEN")
            try:
                env.core.delete_namespaced_secret("sync-config", env.ns)
                # A restarted operator finds the job running without its Secret and makes it again.
                env.operator.stop()
                env.operator.start()
                again = wait_for(token, 30, "the job's Secret made again")
                assert again == started_with
                weights = {"path": str(vllm_model_dir), "format": "full", "version": 7}
                refused = httpx.post(f"{server.url}/v1/weights", json=weights, timeout=300,
                                     headers={"Authorization": "Bearer not-the-token"})  # fmt: skip
                assert refused.status_code == 401
                synced = httpx.post(f"{server.url}/v1/weights", json=weights, timeout=300,
                                    headers={"Authorization": f"Bearer {again}"})  # fmt: skip
                assert synced.status_code == 200, synced.text
                assert synced.headers["X-Weight-Version"] == "7"
                assert env.status("rljobs", "sync")["phase"] == "Running"
            finally:
                stop_group(proc, STOP_GRACE_S)
                reaper.unwatch(proc.pid)
            # Another operator process (a replica, an upgrade) derives the same tokens from the same key.
            assert client.CoreV1Api(env.api).read_namespaced_secret("posttrain-token-key", system).data["key"]
