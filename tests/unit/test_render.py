"""controller/render: a parsed job -> manifests, pure."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from fixtures.jobs import RL_SPEC, UID, job_object, sft_spec
from posttrain.api.jobfile import JobFile
from posttrain.controller import render
from posttrain.controller.objects import Job, parse_job, parse_task_app
from posttrain.controller.render.identity import POLICY_SERVICE_ACCOUNT, render_namespace_identity
from posttrain.controller.render.model import model_location
from posttrain.controller.render.taskapp import TaskAppTarget, render_task_app, task_app_target
from posttrain.controller.settings import OperatorSettings

SETTINGS = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1", s3_bucket="bkt")
TARGET = TaskAppTarget(url="http://math.tasks.svc:8000", secret_name="task-key", name=None)


def rljob(name: str = "math-rl", **spec_over: Any) -> Job:
    spec = {
        **RL_SPEC,
        "taskApp": {"url": "http://math.tasks.svc:8000", "apiKeySecretRef": {"name": "task-key"}},
        "model": {"base": "Qwen/Qwen3-0.6B", "trainerMode": "full"},
        "compute": {
            "gpuType": "H100",
            "gpuCount": 8,
            "nodes": 1,
            "topology": {"gpusForVllm": 4, "gpusForTraining": 3, "gpusForRef": 1, "tensorParallel": 2},
        },
        "reference": {"placement": "dedicated"},
        "training": {**RL_SPEC["training"], "extras": {"weird_key": 3}},
        "originalToml": "[algorithm]\ntype = 'online'\n",
    }
    spec.update(spec_over)
    return parse_job(job_object("RLJob", {k: v for k, v in spec.items() if v is not None}, name=name,
                                namespace="team-a"))  # fmt: skip


def by(children: list[dict], kind: str, role: str) -> dict:
    found = [
        c for c in children if c["kind"] == kind and c["metadata"]["labels"]["posttrain.dev/role"] == role
    ]
    assert len(found) == 1, (kind, role, [c["metadata"]["name"] for c in children])
    return found[0]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_rljob_children_topology_and_labels() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    kinds = sorted(
        (c["kind"], c["metadata"]["name"]) for c in out.children if c["kind"] not in render.IDENTITY_KINDS
    )
    assert kinds == [
        ("Deployment", "math-rl-reference"),
        ("Deployment", "math-rl-rollout"),
        ("Job", "math-rl-trainer"),
        ("PodDisruptionBudget", "math-rl-rollout"),  # render/disruption.py
        ("PodDisruptionBudget", "math-rl-trainer"),
        ("Service", "math-rl-reference"),
        ("Service", "math-rl-rollout"),
    ]  # a one-pod trainer is its own rendezvous: no headless Service
    assert (out.secret["kind"], out.secret["metadata"]["name"]) == ("Secret", "math-rl-config")
    assert out.rollout_token
    for child in [*out.children, out.secret]:
        meta = child["metadata"]
        assert meta["namespace"] == "team-a"
        assert meta["labels"]["posttrain.dev/job"] == "math-rl"
        assert meta["labels"]["posttrain.dev/role"] in {
            "config",
            "rollout",
            "reference",
            "trainer",
            "network",
        }
        # no blockOwnerDeletion: it needs `update` on rljobs/finalizers, which the operator does not hold
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "posttrain.dev/v1alpha1",
                "kind": "RLJob",
                "name": "math-rl",
                "uid": UID,
                "controller": True,
            }
        ]
    rollout = by(out.children, "Deployment", "rollout")
    assert rollout["spec"]["replicas"] == 2  # 4 GPUs / TP 2
    c = rollout["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert c["command"][:6] == ["python", "-m", "posttrain_rollout", "serve", "--role", "policy"]
    assert "--tensor-parallel-size" in c["command"] and c["image"] == "reg/rollout:1"
    ref = by(out.children, "Deployment", "reference")
    assert ref["spec"]["replicas"] == 1
    assert ref["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert out.jobfile.endpoints.policy == ["http://math-rl-rollout.team-a.svc:8000"]
    assert out.jobfile.endpoints.reference == "http://math-rl-reference.team-a.svc:8000"


def test_rollout_role_is_policy() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    cmd = by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--role") + 1] == "policy"


def test_a_lora_policy_is_served_with_lora_policy_and_a_full_one_without() -> None:
    """--lora-policy lets the rollout server serve a merged LoRA policy in float32 on a CPU node."""
    for mode, flagged in (("lora", True), ("qlora", True), ("full", False)):
        job = rljob(model={"base": "Qwen/Qwen3-0.6B", "trainerMode": mode})
        out = render.render_rljob(job, SETTINGS, TARGET)
        cmd = by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0]["command"]
        assert ("--lora-policy" in cmd) == flagged, mode
        reference = by(out.children, "Deployment", "reference")["spec"]["template"]["spec"]["containers"][0]
        assert "--lora-policy" not in reference["command"]


def test_trainer_indexed_job_torchrun_env() -> None:
    compute = {
        "gpuType": "H100",
        "gpuCount": 24,
        "nodes": 2,
        "topology": {"gpusForVllm": 8, "gpusForTraining": 16, "tensorParallel": 1},
    }
    out = render.render_rljob(rljob(compute=compute, reference=None), SETTINGS, TARGET)
    job = by(out.children, "Job", "trainer")
    js = job["spec"]
    assert js["completionMode"] == "Indexed"
    assert js["completions"] == js["parallelism"] == 2
    pod = js["template"]["spec"]
    assert pod["subdomain"] == "math-rl-trainer" and pod["restartPolicy"] == "Never"
    trainer = pod["containers"][0]
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = env_of(trainer)
    assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "8"
    assert env["PET_NODE_RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert env["MASTER_ADDR"] == "math-rl-trainer-0.math-rl-trainer.team-a.svc"
    assert env["MASTER_PORT"] == "29500"
    assert env["ENVIRONMENT_API_KEY"] == {"secretKeyRef": {"name": "task-key", "key": "ENVIRONMENT_API_KEY"}}
    assert trainer["command"][:3] == ["python", "-m", "posttrain_trainer.launch"]
    assert "posttrain_trainer" in trainer["command"] and "--nnodes=$(PET_NNODES)" in trainer["command"]
    svc = by(out.children, "Service", "trainer")
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    inits = [c["name"] for c in pod["initContainers"]]
    assert inits == ["verify-task-app", "wait-for-servers"]
    verify = pod["initContainers"][0]
    # the operator's prober, no shell, the URL one argument after "--"
    assert verify["command"][:3] == ["posttrain", "verify-task-app", "--in-cluster"]
    assert verify["command"][-2:] == ["--", TARGET.url]
    assert env_of(verify)["ENVIRONMENT_API_KEY"] == {"secretKeyRef": {"name": "task-key", "key": "ENVIRONMENT_API_KEY"}}
    assert "math-rl-rollout.team-a.svc:8000" in pod["initContainers"][1]["command"][-1]
    # no reference Deployment without a dedicated reference
    assert not [c for c in out.children if c["metadata"]["labels"]["posttrain.dev/role"] == "reference"]


def secret_files(secret: dict) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def test_the_jobs_secret_has_jobfile_and_toml_and_no_secret_values() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    files = secret_files(out.secret)
    assert sorted(files) == ["config.toml", "job.json"]  # the token is added by the controller
    assert files["config.toml"].startswith("[algorithm]")
    jobfile = json.loads(files["job.json"])
    assert jobfile["kind"] == "rl"
    assert jobfile["job"] == {
        "name": "math-rl",
        "namespace": "team-a",
        "uid": UID,
        "group": "posttrain.dev",
        "version": "v1alpha1",
        "plural": "rljobs",
    }
    assert jobfile["base_model"] == "Qwen/Qwen3-0.6B"
    assert jobfile["task_app"] == {"url": "http://math.tasks.svc:8000", "api_key_env": "ENVIRONMENT_API_KEY"}
    assert jobfile["storage"]["bucket"] == "bkt"
    assert jobfile["storage"]["prefix"] == "jobs/team-a/math-rl-1234abcd/"
    assert jobfile["report"]["mode"] == "kubernetes"
    assert jobfile["config"]["training"]["num_epochs"] == 1
    assert jobfile["config"]["training"]["weird_key"] == 3
    assert "taskApp" not in jobfile["config"] and "task_app" not in jobfile["config"]
    # Secrets appear only as references anywhere in the rendered children.
    for child in out.children:
        if child["kind"] not in ("Deployment", "Job"):
            continue
        pod = child["spec"]["template"]["spec"]
        for container in pod["containers"] + pod.get("initContainers", []):
            for env in container.get("env", []):
                if "KEY" in env["name"]:
                    assert "value" not in env and "secretKeyRef" in env["valueFrom"], env


def test_jobfile_validates_against_trainer_contract() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    parsed = JobFile.model_validate(json.loads(secret_files(out.secret)["job.json"]))
    assert parsed == out.jobfile and parsed.kind == "rl" and parsed.plural == "rljobs"


def test_image_override_and_scheduling_passthrough() -> None:
    job = rljob(
        images={"trainer": "my/trainer:2", "rollout": "my/rollout:2"},
        scheduling={
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "high",
            "queueName": "team-a-queue",
            "resources": {"requests": {"cpu": "4", "memory": "32Gi"}},
        },
    )
    out = render.render_rljob(job, SETTINGS, TARGET)
    for child in out.children:
        if child["kind"] not in ("Deployment", "Job"):
            continue
        assert "kueue.x-k8s.io/queue-name" not in child["metadata"]["labels"]  # the job's Workload queues
        pod = child["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"gpu": "h100"}
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
        assert pod["priorityClassName"] == "high"
        res = pod["containers"][0]["resources"]
        assert res["requests"]["cpu"] == "4" and res["requests"]["memory"] == "32Gi"
    assert by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["containers"][0]["image"] == (
        "my/trainer:2"
    )
    assert by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0][
        "image"
    ] == ("my/rollout:2")
    assert by(out.children, "Deployment", "reference")["spec"]["template"]["spec"]["containers"][0][
        "image"
    ] == ("reg/rollout:1")


def test_suspend_scales_to_zero_and_suspends_job() -> None:
    out = render.render_rljob(rljob(suspend=True), SETTINGS, TARGET)
    assert all(d["spec"]["replicas"] == 0 for d in out.deployments())
    assert by(out.children, "Job", "trainer")["spec"]["suspend"] is True
    assert render.desired_state(by(out.children, "Job", "trainer")) == {"suspend": True}


def test_judges_self_hosted_vs_external() -> None:
    blend = {"rewardBlend": {"env": 0.5, "outcome": 0.5}}  # a judge whose score has no weight is not deployed
    hosted = rljob(judge={"options": {"provider": "vllm", "model": "Qwen/Qwen3-0.6B", "gpus": 2}, **blend})
    out = render.render_rljob(hosted, SETTINGS, TARGET)
    judge = by(out.children, "Deployment", "judge")
    assert judge["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert out.jobfile.endpoints.judges == {"judge": "http://math-rl-judge.team-a.svc:8000"}

    external = rljob(judge={"options": {"provider": "openai", "model": "gpt-4o-mini"},
                            "apiKeySecretRef": {"name": "judge-keys"}, **blend})  # fmt: skip
    out = render.render_rljob(external, SETTINGS, TARGET)
    assert not [c for c in out.children if c["metadata"]["labels"]["posttrain.dev/role"] == "judge"]
    env = env_of(by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["containers"][0])
    assert env["POSTTRAIN_JUDGE_API_KEY"] == {"secretKeyRef": {"name": "judge-keys", "key": "OPENAI_API_KEY"}}
    assert out.jobfile.record["judge"]["options"]["api_key_env"] == "POSTTRAIN_JUDGE_API_KEY"
    # incomplete judge options = no judge (synth rule)
    out = render.render_rljob(rljob(judge={"options": {"provider": "openai"}}), SETTINGS, TARGET)
    assert "OPENAI_API_KEY" not in json.dumps(out.children)


def test_sftjob_children_dataset_configmap() -> None:
    spec = sft_spec(
        model={"base": "posttrain/tiny-random-qwen2"},
        compute={"gpuType": "H100", "gpuCount": 2},
        hyperparameters={"nEpochs": 1, "batchSize": 4},
        dataset={"configMapRef": {"name": "sft1-data", "key": "train.jsonl"}},
    )
    out = render.render_sftjob(parse_job(job_object("SFTJob", spec, name="sft1")), SETTINGS)
    # (the trainer's identity is the namespace's, a one-pod trainer needs no rendezvous Service)
    assert sorted(c["kind"] for c in out.children) == ["Job", "PodDisruptionBudget"]
    assert out.secret["metadata"]["name"] == "sft1-config" and not out.rollout_token
    pod = by(out.children, "Job", "trainer")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert {"name": "data", "configMap": {"name": "sft1-data"}} in pod["volumes"]
    files = [{"key": "job.json", "path": "job.json"}, {"key": "config.toml", "path": "config.toml"}]
    assert {"name": "config", "secret": {"secretName": "sft1-config", "items": files}} in pod["volumes"]
    assert out.jobfile.dataset.train == "/data/train.jsonl"
    assert out.jobfile.kind == "sft" and out.jobfile.task_app is None
    assert out.jobfile.record["hyperparameters"]["n_epochs"] == 1
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    spec["dataset"] = {"uri": "s3://bkt/datasets/x.jsonl"}
    job = parse_job(job_object("SFTJob", spec, name="sft1"))
    assert render.render_sftjob(job, SETTINGS).jobfile.dataset.train == "s3://bkt/datasets/x.jsonl"


def test_long_names_stay_valid_and_stable() -> None:
    out = render.render_rljob(rljob("a" * 63), SETTINGS, TARGET)
    names = [c["metadata"]["name"] for c in out.children]
    assert all(len(n) <= 63 for n in names)
    assert len(by(out.children, "Job", "trainer")["metadata"]["name"]) <= 57
    again = render.render_rljob(rljob("a" * 63), SETTINGS, TARGET)
    assert names == [c["metadata"]["name"] for c in again.children]


def test_fine_tuned_source_resolves_to_s3() -> None:
    job = rljob(model={"source": "ft:Qwen/Qwen3-0.6B:team-a.sft1.abcd1234"})
    base, path = model_location(job.spec, SETTINGS)
    assert base == "Qwen/Qwen3-0.6B"
    assert path == "s3://bkt/jobs/team-a/sft1-abcd1234/final/"


def test_task_app_by_name_uses_taskapp_url_and_secret() -> None:
    spec = rljob(taskApp={"name": "math"}).rl
    ta = {
        "kind": "TaskApp",
        "metadata": {"name": "math", "namespace": "ns"},
        "spec": {"image": "math:1", "port": 8100, "apiKeySecretRef": {"name": "math-key"}},
    }
    target = task_app_target(spec, parse_task_app(ta))
    assert target is not None
    assert target.url == "http://math-task-app.ns.svc:8100"
    assert target.secret_name == "math-key" and target.display.startswith("TaskApp math")
    ta["status"] = {"url": "http://elsewhere:1"}
    assert task_app_target(spec, parse_task_app(ta)).url == "http://elsewhere:1"


def test_task_app_image_children() -> None:
    ta = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "TaskApp",
        "metadata": {"name": "math", "namespace": "ns", "uid": UID},
        "spec": {"image": "math:1", "env": [{"name": "A", "value": "1"}], "replicas": 2,
                 "apiKeySecretRef": {"name": "k"}},
    }  # fmt: skip
    dep, svc = render_task_app(parse_task_app(ta), SETTINGS)
    assert dep["spec"]["replicas"] == 2 and svc["kind"] == "Service"
    env = env_of(dep["spec"]["template"]["spec"]["containers"][0])
    assert env["A"] == "1" and env["ENVIRONMENT_API_KEY"]["secretKeyRef"]["name"] == "k"
    assert dep["metadata"]["labels"]["posttrain.dev/role"] == "task-app"
    assert render_task_app(parse_task_app({**ta, "spec": {"url": "http://x"}}), SETTINGS) == []


def test_per_job_trainer_identity() -> None:
    out = render.render_rljob(rljob(), SETTINGS.model_copy(update={"trainer_identity": "job"}), TARGET)
    role = by(out.children, "Role", "trainer")
    assert role["rules"] == [
        {
            "apiGroups": ["posttrain.dev"],
            "resources": ["rljobs/status"],
            "resourceNames": ["math-rl"],
            "verbs": ["patch"],
        }
    ]
    binding = by(out.children, "RoleBinding", "trainer")
    assert binding["subjects"][0]["name"] == by(out.children, "ServiceAccount", "trainer")["metadata"]["name"]
    pod = by(out.children, "Job", "trainer")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "math-rl-trainer"
    for mode in ("namespace", "static"):
        shared = OperatorSettings(trainer_identity=mode)
        out = render.render_rljob(rljob(), shared, TARGET)
        assert not [c for c in out.children if c["kind"] in ("Role", "RoleBinding", "ServiceAccount")]
        assert by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["serviceAccountName"] == (
            "posttrain-trainer"
        )


def test_namespace_trainer_identity() -> None:
    """One ServiceAccount, Role and RoleBinding per namespace, owned by no job and outside the children's
    watches (no job label); the Role is what the admission policy narrows to the pod's own job."""
    sa, role, binding = render_namespace_identity("team-a", SETTINGS)
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    for obj in (sa, role, binding):
        assert obj["metadata"]["namespace"] == "team-a" and "ownerReferences" not in obj["metadata"]
        assert "posttrain.dev/job" not in obj["metadata"]["labels"]
    assert sa["metadata"]["name"] == POLICY_SERVICE_ACCOUNT == SETTINGS.trainer_service_account
    assert role["rules"] == [
        {"apiGroups": ["posttrain.dev"], "resources": ["rljobs/status", "sftjobs/status"], "verbs": ["patch"]}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "posttrain-trainer", "namespace": "team-a"}]


def test_a_multi_node_trainer_gets_its_rendezvous_service_and_a_single_pod_does_not() -> None:
    single = render.render_rljob(rljob(), SETTINGS, TARGET)
    pod = by(single.children, "Job", "trainer")["spec"]["template"]["spec"]
    assert "subdomain" not in pod and env_of(pod["containers"][0])["MASTER_ADDR"] == "127.0.0.1"
    assert not [c for c in single.children if c["kind"] == "Service" and c["metadata"]["name"] == "math-rl-trainer"]


def test_children_of_a_queued_job_carry_no_queue_label_and_the_operator_owns_suspend() -> None:
    """A job in a Kueue queue is admitted whole through its Workload (render/workload.py): a queue label on
    the trainer Job would make Kueue admit it alone, piece by piece."""
    queued = render.render_rljob(rljob(scheduling={"queueName": "q"}), SETTINGS, TARGET)
    for child in queued.children:
        assert "kueue.x-k8s.io/queue-name" not in json.dumps(child), child["metadata"]["name"]
    trainer = by(queued.children, "Job", "trainer")
    assert trainer["spec"]["suspend"] is False and render.desired_state(trainer) == {"suspend": False}


def test_cpu_job_asks_for_no_gpu_and_keeps_its_process_counts() -> None:
    """A job with compute.gpuType "CPU" (as `make demo` and the real dev node run it) once asked for
    nvidia.com/gpu in every pod, so its pods could only land on GPU nodes (kwok's, where nothing runs)."""
    compute = {"gpuType": "CPU", "gpuCount": 2, "topology": {"gpusForVllm": 1, "gpusForTraining": 1}}
    out = render.render_rljob(rljob(compute=compute, reference={}), SETTINGS, TARGET)
    pods = [by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"],
            by(out.children, "Job", "trainer")["spec"]["template"]["spec"]]  # fmt: skip
    for pod in pods:
        for container in pod["containers"]:
            assert "nvidia.com/gpu" not in json.dumps(container.get("resources", {}))
    trainer = pods[1]["containers"][0]
    assert env_of(trainer)["PET_NPROC_PER_NODE"] == "1"
    assert by(out.children, "Deployment", "rollout")["spec"]["replicas"] == 1
    gpu = render.render_rljob(rljob(compute={**compute, "gpuType": "H100"}, reference={}), SETTINGS, TARGET)
    rollout = by(gpu.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0]
    assert rollout["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_vllm_servers_and_trainers_get_a_memory_backed_dev_shm() -> None:
    """A container's /dev/shm is 64 MiB; vLLM's engine core refused to start in the rollout pod on the real
    dev node ("Insufficient space in /dev/shm ...: 160 MiB required, 64 MiB free")."""
    spec = {"judge": {"options": {"provider": "vllm", "model": "Qwen/Qwen3-0.6B"}, "rewardBlend": {"outcome": 1.0}}}
    out = render.render_rljob(rljob(**spec), SETTINGS, TARGET)
    pods = [d["spec"]["template"]["spec"] for d in out.deployments()]
    pods.append(by(out.children, "Job", "trainer")["spec"]["template"]["spec"])
    assert len(pods) == 4  # rollout, reference, judge, trainer
    for pod in pods:
        shm = [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert len(shm) == 1 and shm[0]["emptyDir"]["sizeLimit"] == "2Gi"
        (container,) = pod["containers"]
        assert {"name": shm[0]["name"], "mountPath": "/dev/shm"} in container["volumeMounts"]
    unlimited = render.render_rljob(rljob(), OperatorSettings(shm_size_limit=""), TARGET)
    rollout = by(unlimited.children, "Deployment", "rollout")["spec"]["template"]["spec"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in rollout["volumes"]


def test_a_verified_taskapp_speaks_only_for_jobs_that_use_its_own_key() -> None:
    """A job naming a Verified TaskApp skips its own check only with the TaskApp's key; with its own key Secret
    (found by make e2e: a wrong-key job got a trainer) it checks that key itself."""
    from posttrain.controller.taskapp_index import trusts_the_apps_check

    ta = {
        "kind": "TaskApp",
        "metadata": {"name": "math", "namespace": "ns", "generation": 2},
        "spec": {"image": "math:1", "port": 8100, "apiKeySecretRef": {"name": "math-key"}},
        "status": {"conditions": [{"type": "Verified", "status": "True", "observedGeneration": 2}]},
    }
    app = parse_task_app(ta)
    same = task_app_target(rljob(taskApp={"name": "math"}).rl, app)
    wrong = task_app_target(rljob(taskApp={"name": "math", "apiKeySecretRef": {"name": "wrong"}}).rl, app)
    other_key = task_app_target(
        rljob(taskApp={"name": "math", "apiKeySecretRef": {"name": "math-key", "key": "OTHER"}}).rl, app
    )
    assert trusts_the_apps_check(same, app)
    assert not trusts_the_apps_check(wrong, app) and not trusts_the_apps_check(other_key, app)
    ta["status"]["conditions"][0]["observedGeneration"] = 1  # verified an older spec: no trust
    assert not trusts_the_apps_check(same, parse_task_app(ta))


def test_a_judge_key_comes_only_from_the_secret_the_job_names() -> None:
    """The hostile case: a judge at a URL of the tenant's choice, told to read the trainer's S3
    secret as its key. Without a Secret named for the judge the job is refused; with one, the trainer's
    judge client reads only POSTTRAIN_JUDGE_API_KEY (from that Secret), whatever api_key_env says."""
    from posttrain.controller.spec_errors import SpecError

    options = {"provider": "openai", "model": "m", "extras": {"base_url": "https://collector.example/v1",
                                                              "api_key_env": "S3_SECRET_ACCESS_KEY"}}  # fmt: skip
    with pytest.raises(SpecError) as err:
        rljob(judge={"options": options})
    assert err.value.field == "judge.apiKeySecretRef" and "Secret" in str(err.value)
    with pytest.raises(SpecError, match="user info"):
        rljob(judge={"options": {**options, "extras": {"base_url": "https://u:p@collector.example/v1"}},
                     "apiKeySecretRef": {"name": "judge-keys", "key": "K"}})  # fmt: skip
    self_hosted_elsewhere = {"provider": "vllm", "model": "m", "extras": {"base_url": "http://j.example/v1"}}
    with pytest.raises(SpecError):
        rljob(judge={"options": self_hosted_elsewhere})

    out = render.render_rljob(
        rljob(judge={"options": options, "apiKeySecretRef": {"name": "judge-keys", "key": "K"},
                     "rewardBlend": {"outcome": 1.0}}), SETTINGS, TARGET  # fmt: skip
    )
    trainer = by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(trainer)
    assert env["POSTTRAIN_JUDGE_API_KEY"] == {"secretKeyRef": {"name": "judge-keys", "key": "K"}}
    assert out.jobfile.record["judge"]["options"]["api_key_env"] == "POSTTRAIN_JUDGE_API_KEY"
    assert "S3_SECRET_ACCESS_KEY" not in json.dumps(out.jobfile.record)
    assert out.jobfile.settings.judge.api_key_env == "POSTTRAIN_JUDGE_API_KEY"  # what the trainer reads

    # a self-hosted judge served next to the job needs no key and gets none
    hosted = rljob(judge={"options": {"provider": "vllm", "model": "m"}, "rewardBlend": {"outcome": 1.0}})
    out = render.render_rljob(hosted, SETTINGS, TARGET)
    trainer = by(out.children, "Job", "trainer")["spec"]["template"]["spec"]["containers"][0]
    assert "POSTTRAIN_JUDGE_API_KEY" not in env_of(trainer)


def test_the_init_container_carries_the_operators_address_rules() -> None:
    settings = SETTINGS.model_copy(update={"task_app_allowed_networks": "10.0.0.0/8",
                                           "api_server_addresses": "10.96.0.1:443"})  # fmt: skip
    pod = by(render.render_rljob(rljob(), settings, TARGET).children, "Job", "trainer")["spec"]["template"]["spec"]
    env = env_of(pod["initContainers"][0])
    assert env["POSTTRAIN_TASK_APP_ALLOWED_NETWORKS"] == "10.0.0.0/8"
    assert env["POSTTRAIN_API_SERVER_ADDRESSES"] == "10.96.0.1:443"
    assert "POSTTRAIN_TASK_APP_DENIED_NETWORKS" not in env


def test_vision_image_limits_reach_the_rollout_server() -> None:
    """policy_config's max_images_per_step wins over [rollout]'s; the server applies them to every request."""
    rollout = {
        **RL_SPEC["rollout"],
        "maxImagesPerStep": 3,
        "policyConfig": {"useVision": True, "imageOnlyMode": True, "maxImagesPerStep": 2},
    }
    job = rljob(
        model={"base": "Qwen/Qwen3-VL-4B-Instruct", "trainerMode": "full", "maxImagesPerMessage": 1},
        rollout=rollout,
        vllm={"limitMmPerPrompt": {"image": 2}},
    )
    out = render.render_rljob(job, SETTINGS, TARGET)
    cmd = by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--max-images-per-step") + 1] == "2"
    assert cmd[cmd.index("--max-images-per-message") + 1] == "1"
    assert "--image-only-mode" in cmd
    assert json.loads(cmd[cmd.index("--limit-mm-per-prompt") + 1]) == {"image": 2}
    plain = by(render.render_rljob(rljob(), SETTINGS, TARGET).children, "Deployment", "rollout")
    assert not any("image" in arg for arg in plain["spec"]["template"]["spec"]["containers"][0]["command"])


def test_tool_call_parser_reaches_the_rollout_server():
    job = rljob(vllm={"toolCallParser": "llama3_json"})
    cmd = by(render.render_rljob(job, SETTINGS, TARGET).children, "Deployment", "rollout")["spec"]["template"][
        "spec"]["containers"][0]["command"]  # fmt: skip
    assert cmd[cmd.index("--tool-call-parser") + 1] == "llama3_json"
    plain = by(render.render_rljob(rljob(), SETTINGS, TARGET).children, "Deployment", "rollout")
    assert "--tool-call-parser" not in plain["spec"]["template"]["spec"]["containers"][0]["command"]
