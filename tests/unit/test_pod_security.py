"""What every rendered pod looks like from a security point of view (pure render output): restricted Pod
Security, no ServiceAccount token where none is needed, the namespace's NetworkPolicy, the rollout token, and
the trainer Job's handling of lost pods."""

from __future__ import annotations

import base64
from typing import Any

from fixtures.jobs import RL_SPEC, UID, job_object, sft_spec
from posttrain.controller import render
from posttrain.controller.namespace_objects import render_namespace_objects
from posttrain.controller.objects import Job, parse_job, parse_task_app
from posttrain.controller.render.taskapp import TaskAppTarget, render_task_app
from posttrain.controller.render.token import with_token
from posttrain.controller.settings import OperatorSettings

SETTINGS = OperatorSettings(trainer_image="reg/trainer:1", rollout_image="reg/rollout:1")


def rljob(**spec: Any) -> Job:
    return parse_job(job_object("RLJob", {
            **RL_SPEC,
            "taskApp": {"name": "math"},
            "model": {"base": "Qwen/Qwen3-0.6B"},
            "algorithm": {"type": "online", "method": "policy_gradient", "variety": "gspo"},
            "compute": {"gpuType": "H100", "gpuCount": 4, "nodes": 1,
                        "topology": {"gpusForVllm": 1, "gpusForTraining": 2, "gpusForRef": 1}},
            "reference": {"placement": "dedicated"},
            "judge": {"options": {"provider": "vllm", "model": "Qwen/Qwen3-0.6B"},
                      "rewardBlend": {"env": 0.5, "outcome": 0.5}},  # a judge only a blend reads is deployed
            **spec,
        }, name="math-rl", namespace="team-a"))  # fmt: skip


def sftjob() -> Job:
    spec = sft_spec(model={"base": "Qwen/Qwen3-0.6B"}, compute={"gpuType": "H100", "gpuCount": 1})
    return parse_job(job_object("SFTJob", spec, name="math-sft", namespace="team-a"))


TARGET = TaskAppTarget(url="http://math-task-app.team-a.svc:8000", secret_name="k", name="math")


def pods(children: list[dict]) -> list[tuple[str, dict]]:
    return [
        (c["metadata"]["name"], c["spec"]["template"]["spec"])
        for c in children
        if c["kind"] in ("Deployment", "Job")
    ]


def assert_restricted(pod: dict, *, read_only: bool) -> None:
    """The restricted Pod Security Standard, field by field."""
    ctx = pod["securityContext"]
    assert ctx["runAsNonRoot"] is True and ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert ctx["runAsUser"] == 65532
    for c in pod.get("initContainers", []) + pod["containers"]:
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["runAsNonRoot"] is True and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert sc["readOnlyRootFilesystem"] is read_only, c["name"]
        if read_only:
            mounts = {m["mountPath"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts, c["name"]
            assert {"name": "HOME", "value": "/tmp"} in c["env"]
    for volume in pod.get("volumes", []):
        assert set(volume) & {"configMap", "emptyDir", "secret", "projected"}, volume  # no hostPath


def test_every_pod_is_restricted_and_only_the_trainer_has_a_token() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    seen = {}
    for name, pod in pods(out.children):
        assert_restricted(pod, read_only=True)
        seen[name] = pod["automountServiceAccountToken"]
    assert seen == {
        "math-rl-rollout": False,
        "math-rl-reference": False,
        "math-rl-judge": False,
        "math-rl-trainer": True,
    }
    trainer = next(p for n, p in pods(out.children) if n == "math-rl-trainer")
    assert [c["name"] for c in trainer["initContainers"]] == ["verify-task-app", "wait-for-servers"]
    sft = render.render_sftjob(sftjob(), SETTINGS)
    for _, pod in pods(sft.children):
        assert_restricted(pod, read_only=True)


def test_task_app_pods_are_restricted_but_keep_a_writable_root() -> None:
    ta = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "TaskApp",
        "metadata": {"name": "math", "namespace": "team-a", "uid": UID},
        "spec": {"image": "reg/math:1", "scheduling": {"nodeSelector": {"pool": "cpu"}}},
    }
    (dep, _svc) = render_task_app(parse_task_app(ta), SETTINGS)
    pod = dep["spec"]["template"]["spec"]
    assert_restricted(pod, read_only=False)
    assert pod["automountServiceAccountToken"] is False and pod["nodeSelector"] == {"pool": "cpu"}


def test_run_as_user_zero_keeps_the_images_user() -> None:
    out = render.render_rljob(rljob(), OperatorSettings(run_as_user=0), TARGET)
    for _, pod in pods(out.children):
        assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions with In) applied to a pod's labels."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(e["operator"] == "In" and labels.get(e["key"]) in e["values"]
               for e in selector.get("matchExpressions", []))  # fmt: skip


def test_the_namespace_network_policy_admits_only_job_pods_and_task_apps_on_the_server_port() -> None:
    (policy,) = [o for o in render_namespace_objects("team-a", SETTINGS)
                 if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "posttrain-jobs"]  # fmt: skip
    meta = policy["metadata"]
    assert meta["name"] == "posttrain-jobs" and meta["namespace"] == "team-a"
    assert "ownerReferences" not in meta and "posttrain.dev/job" not in meta["labels"]  # serves every job
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "posttrain-operator"
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    (from_jobs, from_task_apps, from_prometheus) = spec["ingress"]
    assert "ports" not in from_jobs and from_task_apps["ports"] == [{"protocol": "TCP", "port": 8000}]
    # Prometheus, from a namespace labelled for it, reaches the trainers' /metrics port and nothing else
    assert from_prometheus == {
        "from": [{"namespaceSelector": {"matchLabels": {"posttrain.dev/monitoring": "true"}}}],
        "ports": [{"protocol": "TCP", "port": 9090}],
    }
    sft = parse_job(job_object("SFTJob", sft_spec(model={"base": "Qwen/Qwen3-0.6B"},
                                                  dataset={"uri": "s3://b/x.jsonl"}), name="s"))  # fmt: skip
    templates = [c["spec"]["template"]["metadata"]["labels"]
                 for rendered in (render.render_rljob(rljob(), SETTINGS, TARGET), render.render_sftjob(sft, SETTINGS))
                 for c in rendered.children if c["kind"] in ("Deployment", "Job")]  # fmt: skip
    assert {t["posttrain.dev/role"] for t in templates} == {"rollout", "reference", "judge", "trainer"}
    for labels in templates:
        # every pod of every job is guarded, and may reach every other job pod of the namespace
        assert selects(spec["podSelector"], labels), labels
        assert selects(from_jobs["from"][0]["podSelector"], labels), labels
    ta = {"apiVersion": "posttrain.dev/v1alpha1", "kind": "TaskApp",
          "metadata": {"name": "math", "namespace": "team-a", "uid": "u"},
          "spec": {"image": "reg/math:1", "port": 8001, "apiKeySecretRef": {"name": "k"}}}  # fmt: skip
    (dep, _svc) = render_task_app(parse_task_app(ta), SETTINGS)
    task_app_labels = dep["spec"]["template"]["metadata"]["labels"]
    # a TaskApp's pods get in on the servers' port only; they are not themselves selected (nor job pods)
    assert selects(from_task_apps["from"][0]["podSelector"], task_app_labels)
    assert not selects(from_jobs["from"][0]["podSelector"], task_app_labels)
    assert not selects(spec["podSelector"], task_app_labels)
    # a pod someone else runs in the namespace is neither guarded nor let in
    assert not selects(from_jobs["from"][0]["podSelector"], {"app": "other"})
    assert not selects(from_task_apps["from"][0]["podSelector"], {"app": "other"})


def test_servers_and_trainer_share_the_rollout_token_in_the_jobs_secret() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    assert out.secret["metadata"]["name"] == "math-rl-config" and out.rollout_token
    want = {"secretKeyRef": {"name": "math-rl-config", "key": "token"}}
    for _, pod in pods(out.children):
        env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
        assert env["POSTTRAIN_ROLLOUT_TOKEN"] == want
    secret = with_token(out.secret, "s3cr3t")
    assert secret["kind"] == "Secret" and base64.b64decode(secret["data"]["token"]) == b"s3cr3t"
    assert set(secret["data"]) == {"token", "job.json", "config.toml"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    assert "token" not in out.secret["data"]  # with_token copies: the rendered plan stays token-free
    # the token never appears in what is rendered for the job (children, env values), nor as a file the
    # trainer mounts (it reads the job file and the TOML from the Secret, the token from its environment)
    assert "s3cr3t" not in str(out.children)
    (trainer,) = [c for c in out.children if c["kind"] == "Job"]
    (config,) = [v for v in trainer["spec"]["template"]["spec"]["volumes"] if v["name"] == "config"]
    assert [item["key"] for item in config["secret"]["items"]] == ["job.json", "config.toml"]


def test_trainer_job_survives_disruptions_and_fails_fast_on_config_errors() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    (job,) = [c for c in out.children if c["kind"] == "Job"]
    spec = job["spec"]
    assert spec["backoffLimit"] == 3 and spec["podReplacementPolicy"] == "Failed"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert rules[1] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [2, 65, 78]},
    }
    # stopped by SIGTERM after a checkpoint (preempted, drained): not a failure, the next pod resumes
    assert rules[2] == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]},
    }
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    # the grace period a SIGTERM leaves for the step and its checkpoint; torchrun waits a little less
    pod = spec["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.trainer_termination_grace_seconds == 300
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "270"
    short = SETTINGS.model_copy(update={"trainer_termination_grace_seconds": 30})
    (job,) = [c for c in render.render_rljob(rljob(), short, TARGET).children if c["kind"] == "Job"]
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "25"
    two_nodes = rljob(compute={"gpuType": "H100", "gpuCount": 5, "nodes": 2,
                               "topology": {"gpusForVllm": 1, "gpusForTraining": 4}})  # fmt: skip
    (job,) = [c for c in render.render_rljob(two_nodes, SETTINGS, TARGET).children if c["kind"] == "Job"]
    assert job["spec"]["backoffLimit"] == 6


def test_checkpoints_by_default() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    assert out.jobfile.checkpoint_every == 10
    training = {**RL_SPEC["training"], "extras": {"checkpoint_every": 3}}
    mine = render.render_rljob(rljob(training=training), SETTINGS, TARGET)
    assert mine.jobfile.checkpoint_every == 3
    sft = render.render_sftjob(sftjob(), SETTINGS)
    assert sft.jobfile.checkpoint_every == 200


def test_the_launcher_exits_with_a_workers_config_error_code() -> None:
    from posttrain.api import exitcodes

    assert exitcodes.launcher_exit_code([1, 78, 1]) == 78
    assert exitcodes.launcher_exit_code([143, 65]) == 65
    assert exitcodes.launcher_exit_code([1, -9]) == 1
    assert exitcodes.launcher_exit_code([75, 75]) == exitcodes.EXIT_PREEMPTED == 75  # every worker checkpointed
    assert exitcodes.launcher_exit_code([75, 0]) == 75
    assert exitcodes.launcher_exit_code([75, 1]) == 1  # one crashed: an ordinary retry
    assert exitcodes.launcher_exit_code([75, 78]) == 78


def test_unrenderable_specs_name_the_field() -> None:
    import pytest
    from posttrain.controller.spec_errors import SpecError, render_failure_message

    for source in ("ft:Qwen/Qwen3-4B:job_abc123", "Qwen/Qwen3-4B"):
        with pytest.raises(SpecError) as err:
            render.render_rljob(rljob(model={"source": source}), SETTINGS, TARGET)
        message = render_failure_message(err.value)
        assert message.startswith("spec.model.source: ") and "fix:" in message
    # a model id is never a format string
    out = render.render_rljob(
        rljob(model={"base": "org/{x}"}), OperatorSettings(base_model_uri="s3://m/{base}/"), TARGET
    )
    assert out.jobfile.model_path == "s3://m/org/{x}/"


def test_a_resource_quantity_that_is_not_one_names_its_field() -> None:
    import pytest
    from posttrain.controller.spec_errors import SpecError

    with pytest.raises(SpecError) as err:
        render.render_rljob(
            rljob(scheduling={"resources": {"trainer": {"limits": {"memory": "lots"}}}}), SETTINGS, TARGET
        )
    assert str(err.value).startswith("spec.scheduling.resources.trainer.limits.memory: 'lots' is not a")
    ok = render.render_rljob(
        rljob(scheduling={"resources": {"requests": {"cpu": "500m", "memory": 4}}}), SETTINGS, TARGET
    )
    assert ok.children
