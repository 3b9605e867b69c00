"""The operator on the real control plane (kube-apiserver + etcd + controller-manager + scheduler + kwok GPU
nodes from the `cluster` fixture), run as a real `posttrain operator` subprocess per test, limited to the
test's namespace. The task app is the real math task app (examples/taskapps/math/app.py) on 127.0.0.1,
from the `math_taskapp` fixture; the outage test starts its own instance so it can stop it.

kwok makes pods Running/Ready; the trainer's success is driven through the control plane's kwok stages
(posttrain_dev.devcluster: an annotation ends a running pod with an exit code), and status.result is written the way the trainer writes it (a merge patch of the
job's status subresource)."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

import pytest
from fixtures.operator_env import KEY, Env, wait_for
from fixtures.operator_process import add_gpu_nodes, complete_trainer, rljob_manifest
from kubernetes import client
from posttrain.api.resources import GROUP, VERSION
from posttrain.localhost import free_port

pytestmark = [pytest.mark.cluster]

rljob = rljob_manifest


def test_rljob_full_lifecycle(env: Env, math_taskapp: Any) -> None:
    env.secret("task-key", math_taskapp.api_key)
    env.create("rljobs", rljob("math-rl", math_taskapp.url))
    status = env.wait_phase("rljobs", "math-rl", "Running", timeout=60)
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["TaskAppVerified"]["status"] == "True"
    assert "/task_info 200" in conds["TaskAppVerified"]["message"]
    assert status["linkedJobId"] == f"{env.ns}/math-rl-trainer"
    assert status["observedGeneration"] == 1 and status["model"] == "posttrain/tiny-random-qwen2"

    kids = env.children("math-rl")
    uid = env.get("rljobs", "math-rl")["metadata"]["uid"]
    for kind in ("Deployment", "Job", "Service", "Secret"):
        for obj in kids[kind]:
            assert obj.metadata.owner_references[0].uid == uid, (kind, obj.metadata.name)
            assert obj.metadata.labels["posttrain.dev/role"] in {"rollout", "trainer", "config"}
    assert [d.metadata.name for d in kids["Deployment"]] == ["math-rl-rollout"]
    assert kids["Deployment"][0].spec.template.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    trainer = kids["Job"][0]
    assert trainer.spec.completion_mode == "Indexed" and trainer.spec.completions == 1
    # One Secret per job: the job file and the TOML the trainer mounts, and the rollout token
    (secret,) = kids["Secret"]
    assert secret.metadata.name == "math-rl-config" and set(secret.data) == {"job.json", "config.toml", "token"}
    files = {k: base64.b64decode(secret.data[k]).decode() for k in ("job.json", "config.toml")}
    assert json.loads(files["job.json"])["job"]["name"] == "math-rl" and files["config.toml"].startswith("[algorithm]")
    assert KEY not in str(files) and math_taskapp.api_key not in str(files)
    pods = {p.metadata.labels["posttrain.dev/role"]: p for p in kids["Pod"]}
    assert set(pods) == {"rollout", "trainer"}

    # The trainer writes its result into the job's status, then exits 0.
    result = {
        "fineTunedModel": f"rl:posttrain/tiny-random-qwen2:{env.ns}.math-rl.{uid.replace('-', '')[:8]}",
        "artifacts": {
            "model": "s3://posttrain/jobs/x/final/",
            "manifest": "s3://posttrain/jobs/x/manifest.json",
        },
    }
    env.co.patch_namespaced_custom_object_status(
        GROUP, VERSION, env.ns, "rljobs", "math-rl", {"status": {"result": result}}
    )
    complete_trainer(env.api, env.ns, "math-rl-trainer", succeed=True)
    status = env.wait_phase("rljobs", "math-rl", "Succeeded", timeout=60)
    assert status["fineTunedModel"] == result["fineTunedModel"]
    assert status["artifacts"] == result["artifacts"]
    assert status["completionTime"]
    wait_for(lambda: not env.children("math-rl")["Deployment"], 30, "rollout Deployment removed")
    # (a one-pod trainer is its own rendezvous: no headless Service)
    assert [s.metadata.name for s in env.children("math-rl")["Service"]] == []
    reasons = env.events("math-rl")
    # Events only where a person should look: the job ended (Verifying, Provisioning and Running are in
    # its status; an Event each cost a write per job and told nobody anything)
    assert "Succeeded" in reasons, reasons
    assert not {"Verifying", "Provisioning", "Running"} & set(reasons), reasons


def test_sftjob_full_lifecycle(env: Env) -> None:
    env.core.create_namespaced_config_map(
        env.ns,
        client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="sft-data"),
            data={
                "train.jsonl": '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
            },
        ),
    )
    env.create(
        "sftjobs",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SFTJob",
            "metadata": {"name": "sft1"},
            "spec": {
                "model": {"base": "posttrain/tiny-random-qwen2"},
                "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
                "compute": {"gpuType": "H100", "gpuCount": 2, "nodes": 2},
                "hyperparameters": {"nEpochs": 1},
                "dataset": {"configMapRef": {"name": "sft-data", "key": "train.jsonl"}},
            },
        },
    )
    env.wait_phase("sftjobs", "sft1", "Running", timeout=60)
    kids = env.children("sft1")
    assert not kids["Deployment"]
    job = kids["Job"][0]
    assert job.spec.completions == job.spec.parallelism == 2
    env_vars = {e.name: e for e in job.spec.template.spec.containers[0].env}
    assert env_vars["PET_NNODES"].value == "2"
    assert env_vars["PET_NODE_RANK"].value_from.field_ref.field_path.endswith("job-completion-index']")
    assert len([p for p in kids["Pod"]]) == 2
    complete_trainer(env.api, env.ns, "sft1-trainer", succeed=True)
    status = env.wait_phase("sftjobs", "sft1", "Succeeded", timeout=60)
    uid8 = env.get("sftjobs", "sft1")["metadata"]["uid"].replace("-", "")[:8]
    assert status["fineTunedModel"] == f"ft:posttrain/tiny-random-qwen2:{env.ns}.sft1.{uid8}"


def test_taskapp_verified_then_outage_flips_condition(env: Env, tmp_path: Path) -> None:
    from posttrain.local.processes import ProcessSet
    from posttrain.local.taskapp import start_taskapp

    env.secret("ta-key", "sk_env_outage_0001")
    with ProcessSet() as procs:
        url, proc = start_taskapp(procs, api_key="sk_env_outage_0001", log_dir=tmp_path)
        env.create(
            "taskapps",
            {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "TaskApp",
                "metadata": {"name": "math"},
                "spec": {
                    "url": url,
                    "apiKeySecretRef": {"name": "ta-key"},
                    "verification": {"periodSeconds": 5, "timeoutSeconds": 10, "requestTimeoutSeconds": 2},
                },
            },
        )
        status = wait_for(
            lambda: env.status("taskapps", "math").get("verified") and env.status("taskapps", "math"),
            30,
            "verified",
        )
        assert status["url"] == url
        assert status["taskInfo"]["id"] == "math" and status["taskInfo"]["rubric"] in (True, False)
        cond = {c["type"]: c for c in status["conditions"]}["Verified"]
        assert cond["status"] == "True"
        procs.stop_all() if hasattr(procs, "stop_all") else proc.stop()
        status = wait_for(
            lambda: (s := env.status("taskapps", "math")).get("verified") is False and s, 30, "outage noticed"
        )
        cond = {c["type"]: c for c in status["conditions"]}["Verified"]
        assert cond["status"] == "False" and cond["reason"] == "Unreachable"
    # An RLJob naming the TaskApp goes through the same verification (and fails: the app is gone).
    env.create(
        "rljobs",
        {
            **rljob("by-name", url, "ta-key"),
            "spec": {**rljob("by-name", url, "ta-key")["spec"], "taskApp": {"name": "math"}},
        },
    )
    status = env.wait_phase("rljobs", "by-name", "Failed", timeout=40)
    assert "TaskApp math" in status["message"]


def test_taskapp_image_gets_deployment_and_service(env: Env) -> None:
    env.create(
        "taskapps",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "TaskApp",
            "metadata": {"name": "imgapp"},
            "spec": {"image": "posttrain/taskapp-math:dev", "port": 8000, "replicas": 1},
        },
    )
    kids = wait_for(
        lambda: (k := env.children("imgapp"))["Deployment"] and k["Service"] and k, 30, "task app children"
    )
    assert kids["Deployment"][0].metadata.labels["posttrain.dev/role"] == "task-app"
    status = wait_for(
        lambda: env.status("taskapps", "imgapp").get("url") and env.status("taskapps", "imgapp"), 30, "url"
    )
    assert status["url"] == f"http://imgapp-task-app.{env.ns}.svc:8000"


def test_wrong_api_key_fails_without_gpu_pods(env: Env, math_taskapp: Any) -> None:
    env.secret("bad-key", "sk_env_definitely_wrong")
    env.create("rljobs", rljob("badkey", math_taskapp.url, "bad-key"))
    status = env.wait_phase("rljobs", "badkey", "Failed", timeout=30)
    assert status["reason"] == "TaskAppVerificationFailed"
    assert math_taskapp.url in status["message"] and "HTTP 400" in status["message"]
    cond = {c["type"]: c for c in status["conditions"]}["TaskAppVerified"]
    assert cond["status"] == "False" and cond["reason"] == "Unauthorized" and "HTTP 400" in cond["message"]
    assert "sk_env_definitely_wrong" not in str(status)
    kids = env.children("badkey")
    assert not kids["Pod"] and not kids["Job"] and not kids["Deployment"]
    assert "Failed" in env.events("badkey")


def test_unreachable_task_app_bounded_retries_then_failed(env: Env) -> None:
    env.secret("task-key", KEY)
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    env.create("rljobs", rljob("nowhere", url))
    env.wait_phase("rljobs", "nowhere", "Verifying", timeout=15)
    status = env.wait_phase("rljobs", "nowhere", "Failed", timeout=30)
    took = time.monotonic() - started
    assert 3 <= took <= 25, took  # POSTTRAIN_VERIFY_TIMEOUT_SECONDS=6 (+ scheduling slack)
    assert "gave up after" in status["message"] and url in status["message"]
    assert {c["type"]: c for c in status["conditions"]}["TaskAppVerified"]["reason"] == "Unreachable"
    assert not env.children("nowhere")["Pod"]


def test_operator_killed_mid_provisioning_restarts_without_duplicates(env: Env, math_taskapp: Any) -> None:
    env.secret("task-key", math_taskapp.api_key)
    env.create(
        "rljobs",
        rljob(
            "restart",
            math_taskapp.url,
            compute={
                "gpuType": "H100",
                "gpuCount": 4,
                "topology": {"gpusForVllm": 2, "gpusForTraining": 1, "gpusForRef": 1},
            },
            reference={"placement": "dedicated"},
        ),
    )
    # Kill as soon as provisioning has begun (some children exist, the job is not Running yet).
    wait_for(lambda: env.children("restart")["Secret"], 30, "first child")
    env.operator.kill()
    before = {
        k: sorted((o.metadata.name, o.metadata.uid) for o in v)
        for k, v in env.children("restart").items()
        if k != "Pod"
    }
    env.operator.start()
    env.wait_phase("rljobs", "restart", "Running", timeout=60)
    after = {
        k: sorted((o.metadata.name, o.metadata.uid) for o in v)
        for k, v in env.children("restart").items()
        if k != "Pod"
    }
    for kind, objs in before.items():
        assert set(objs) <= set(after[kind]), (kind, objs, after[kind])  # same objects, not re-created
    names = {k: [n for n, _ in v] for k, v in after.items()}
    assert names["Deployment"] == ["restart-reference", "restart-rollout"]
    assert names["Job"] == ["restart-trainer"]
    assert names["Secret"] == ["restart-config"]
    assert sorted(names["Service"]) == ["restart-reference", "restart-rollout"]  # one trainer pod: no Service
    # A second restart when everything is Running changes nothing either.
    env.operator.kill()
    env.operator.start()
    time.sleep(2)
    again = {
        k: sorted((o.metadata.name, o.metadata.uid) for o in v)
        for k, v in env.children("restart").items()
        if k != "Pod"
    }
    assert again == after
    assert env.phase("rljobs", "restart") == "Running"


def test_suspend_removes_pods_and_resume_brings_them_back(env: Env, math_taskapp: Any) -> None:
    env.secret("task-key", math_taskapp.api_key)
    env.create("rljobs", rljob("pausable", math_taskapp.url))
    env.wait_phase("rljobs", "pausable", "Running", timeout=60)
    env.co.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, "rljobs", "pausable", {"spec": {"suspend": True}}
    )
    env.wait_phase("rljobs", "pausable", "Suspended", timeout=30)
    wait_for(lambda: not env.children("pausable")["Pod"], 30, "pods removed")
    assert env.children("pausable")["Job"][0].spec.suspend is True
    env.co.patch_namespaced_custom_object(
        GROUP, VERSION, env.ns, "rljobs", "pausable", {"spec": {"suspend": False}}
    )
    env.wait_phase("rljobs", "pausable", "Running", timeout=60)


def test_fifty_rljobs_all_reach_running(env: Env, math_taskapp: Any, cluster: Any) -> None:
    add_gpu_nodes(cluster, 13)  # 50 jobs x 2 GPUs = 100 GPUs; the session cluster has 4 x 8
    env.secret("task-key", math_taskapp.api_key)
    names = [f"many-{i:02d}" for i in range(50)]
    started = time.monotonic()
    for name in names:
        env.create("rljobs", rljob(name, math_taskapp.url))

    def running() -> bool:
        items = env.co.list_namespaced_custom_object(GROUP, VERSION, env.ns, "rljobs")["items"]
        phases = [
            (i.get("status") or {}).get("phase") for i in items if i["metadata"]["name"].startswith("many-")
        ]
        return len(phases) == 50 and all(p == "Running" for p in phases)

    wait_for(running, 150, "50 RLJobs Running", interval=1.0)
    took = time.monotonic() - started
    print(f"50 RLJobs applied -> all Running in {took:.1f}s")
    jobs = env.batch.list_namespaced_job(env.ns, label_selector="posttrain.dev/role=trainer").items
    assert len(jobs) == 50
