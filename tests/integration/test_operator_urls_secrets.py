"""Issue 27, as a hostile tenant would try it, on the real control plane with a real `posttrain operator`:
task-app URLs and addresses (posttrain.api.urls), task-app keys only from Secrets labelled for that use,
a judge's key only from a Secret the job names. Task apps are real HTTP servers on 127.0.0.1
(tests/fixtures/hostile_taskapp.py); `requests` counts what reached them."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fixtures.operator_env import KEY, Env, operator_env, wait_for
from fixtures.operator_process import add_gpu_nodes, rljob_manifest
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION

pytestmark = [pytest.mark.cluster]


def taskapp(name: str, url: str, secret: str | None = "task-key") -> dict[str, Any]:
    spec: dict[str, Any] = {"url": url, "verification": {"periodSeconds": 5, "timeoutSeconds": 6,
                                                          "requestTimeoutSeconds": 2}}  # fmt: skip
    if secret:
        spec["apiKeySecretRef"] = {"name": secret}
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": name}, "spec": spec}


def verified_condition(env: Env, name: str, reason: str, timeout: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        conds = {c["type"]: c for c in env.status("taskapps", name).get("conditions") or []}
        cond = conds.get("Verified")
        return cond if cond and cond.get("reason") == reason else None

    try:
        return wait_for(check, timeout, f"TaskApp {name} reason {reason}")
    except AssertionError as err:
        raise AssertionError(f"{err}\n{env.status('taskapps', name)}\n{env.operator.log_tail()}") from None


def test_loopback_is_refused_unless_the_operators_settings_allow_it(
    cluster: Any, namespace: str, tmp_path: Path, hostile_taskapp: Any
) -> None:
    settings = {"POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": ""}  # the default: the tests' env allows loopback
    with operator_env(cluster, namespace, tmp_path / "operator.log", settings=settings) as env:
        env.secret("task-key", KEY)
        env.create("taskapps", taskapp("local", hostile_taskapp.at("ok")))
        cond = verified_condition(env, "local", "AddressRefused")
        assert cond["status"] == "False" and "loopback address" in cond["message"]
        env.create("rljobs", rljob_manifest("local-rl", hostile_taskapp.at("ok").replace("127.0.0.1", "localhost")))
        status = env.wait_phase("rljobs", "local-rl", "Failed", timeout=30)
        cond = {c["type"]: c for c in status["conditions"]}["TaskAppVerified"]
        assert cond["reason"] == "AddressRefused"
        assert not env.children("local-rl")["Job"]
    assert sum(hostile_taskapp.requests.values()) == 0  # nothing was ever sent there


def test_the_api_servers_address_is_refused_even_with_loopback_allowed(env: Env, cluster: Any) -> None:
    api = urlsplit(cluster.api_client().configuration.host)
    env.secret("task-key", KEY)
    env.create("taskapps", taskapp("apiserver", f"https://{api.hostname}:{api.port}/api"))
    cond = verified_condition(env, "apiserver", "AddressRefused")
    assert "the Kubernetes API server's address" in cond["message"]


def test_urls_with_query_fragment_user_info_are_refused_by_the_api_server(env: Env) -> None:
    for bad in ("http://task-app:8000/internal/admin?x=", "http://task-app:8000/internal/admin#",
                "http://user:pw@task-app:8000"):  # fmt: skip
        with pytest.raises(ApiException) as err:
            env.create("rljobs", rljob_manifest("bad-url", bad))
        assert err.value.status == 422 and "taskApp.url must be an http(s) URL" in err.value.body, err.value.body
        with pytest.raises(ApiException) as err:
            env.create("taskapps", taskapp("bad-url", bad))
        assert err.value.status == 422 and "spec.url must be an http(s) URL" in err.value.body


def test_a_task_app_key_is_read_only_from_a_secret_labelled_for_it(env: Env, hostile_taskapp: Any) -> None:
    # another Secret of the namespace (an S3 key, a token of some other app) named as a task-app key
    env.secret("not-for-task-apps", "the-s3-secret-value", labels={})
    env.create("taskapps", taskapp("steal", hostile_taskapp.at("echo"), secret="not-for-task-apps"))
    cond = verified_condition(env, "steal", "SecretNotLabelled")
    assert cond["status"] != "True"
    assert "posttrain.dev/use=task-app-key" in cond["message"] and "not-for-task-apps" in cond["message"]
    assert hostile_taskapp.requests["echo"] == 0  # the key never left the cluster
    # its owner says yes: the same TaskApp verifies on its next check
    env.core.patch_namespaced_secret("not-for-task-apps", env.ns,
                                     {"metadata": {"labels": {"posttrain.dev/use": "task-app-key"}}})  # fmt: skip
    env.secret("task-key", KEY)
    env.create("taskapps", taskapp("ok", hostile_taskapp.at("ok")))
    verified_condition(env, "ok", "Verified")
    wait_for(lambda: hostile_taskapp.requests["echo"] > 0, 30, "the labelled Secret's key is used")
    assert "the-s3-secret-value" not in json.dumps(env.status("taskapps", "steal"))


def test_a_judge_key_goes_only_where_the_job_points_it(env: Env, cluster: Any, hostile_taskapp: Any) -> None:
    add_gpu_nodes(cluster, 2)
    env.secret("task-key", KEY)
    judge = {
        "enabled": True,
        "rewardBlend": {"env": 0.5, "outcome": 0.5},
        "options": {"provider": "openai", "model": "gpt-4o-mini",
                    "extras": {"base_url": "https://collector.example/v1", "api_key_env": "S3_SECRET_ACCESS_KEY"}},
    }  # fmt: skip
    env.create("rljobs", rljob_manifest("exfil", hostile_taskapp.at("ok"), judge=judge))
    status = env.wait_phase("rljobs", "exfil", "Failed", timeout=30)
    assert status["reason"] == "InvalidSpec" and "spec.judge.apiKeySecretRef" in status["message"]
    assert not env.children("exfil")["Job"]

    named = {**judge, "apiKeySecretRef": {"name": "judge-keys", "key": "OPENAI_API_KEY"}}
    env.create("rljobs", rljob_manifest("judged", hostile_taskapp.at("ok"), judge=named))
    env.wait_phase("rljobs", "judged", "Running", timeout=60)
    batch = client.BatchV1Api(env.api)
    pod = batch.read_namespaced_job("judged-trainer", env.ns).spec.template.spec
    trainer = next(c for c in pod.containers if c.name == "trainer")
    env_vars = {e.name: e for e in trainer.env}
    ref = env_vars["POSTTRAIN_JUDGE_API_KEY"].value_from.secret_key_ref
    assert (ref.name, ref.key) == ("judge-keys", "OPENAI_API_KEY")
    assert "OPENAI_API_KEY" not in env_vars
    secret = env.core.read_namespaced_secret("judged-config", env.ns)
    jobfile = json.loads(base64.b64decode(secret.data["job.json"]))
    assert jobfile["config"]["judge"]["options"]["api_key_env"] == "POSTTRAIN_JUDGE_API_KEY"
    # the init container re-verifies with the operator's prober and its address rules
    (init,) = [c for c in pod.init_containers if c.name == "verify-task-app"]
    assert init.command[:3] == ["posttrain", "verify-task-app", "--in-cluster"]
    assert {e.name: e.value for e in init.env}["POSTTRAIN_TASK_APP_ALLOWED_NETWORKS"] == "127.0.0.0/8,::1/128"


def test_a_deployed_task_app_gets_no_secret_that_is_not_labelled_for_it(env: Env) -> None:
    """A tenant who may create TaskApps but not pods cannot have the operator run its image with another
    Secret of the namespace in its environment."""
    env.secret("task-key", KEY)
    env.secret("someone-elses", "the-value", labels={})
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TaskApp",
        "metadata": {"name": "image-app"},
        "spec": {
            "image": "reg/steal:1",
            "apiKeySecretRef": {"name": "task-key"},
            "env": [{"name": "LOOT", "valueFrom": {"secretKeyRef": {"name": "someone-elses", "key": "ENVIRONMENT_API_KEY"}}}],
        },
    }
    env.create("taskapps", body)
    cond = verified_condition(env, "image-app", "SecretNotLabelled")
    assert "someone-elses" in cond["message"]
    assert env.children("image-app")["Deployment"] == []
    # its owner marks it for task apps: the next pass deploys the app
    env.core.patch_namespaced_secret("someone-elses", env.ns,
                                     {"metadata": {"labels": {"posttrain.dev/use": "task-app-key"}}})  # fmt: skip
    wait_for(lambda: env.children("image-app")["Deployment"], 30, "the task app's Deployment")
