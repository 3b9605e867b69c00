"""What every rendered pod looks like from a security point of view (pure render output): restricted Pod
Security, no ServiceAccount token where none is needed, the job's NetworkPolicy, the rollout token, and
the trainer Job's handling of lost pods."""

from __future__ import annotations

import base64
from typing import Any

from fixtures.jobs import RL_SPEC, UID, job_object, sft_spec
from posttrain.controller import render
from posttrain.controller.objects import Job, parse_job, parse_task_app
from posttrain.controller.render.taskapp import TaskAppTarget, render_task_app
from posttrain.controller.render.token import render_token_secret
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
            "judge": {"options": {"provider": "vllm", "model": "Qwen/Qwen3-0.6B"}},
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


def test_network_policy_admits_only_the_job_and_its_task_app() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    (policy,) = [c for c in out.children if c["kind"] == "NetworkPolicy"]
    assert policy["metadata"]["labels"]["posttrain.dev/job"] == "math-rl"
    own = {"matchLabels": {"posttrain.dev/job": "math-rl", "posttrain.dev/kind": "rljob"}}
    assert policy["spec"]["podSelector"] == own and policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": own}]},
        {
            "from": [{"podSelector": {"matchLabels": {"posttrain.dev/job": "math", "posttrain.dev/kind": "taskapp",
                                                      "posttrain.dev/role": "task-app"}}}],
            "ports": [{"protocol": "TCP", "port": 8000}],
        },
    ]  # fmt: skip
    # every pod the job runs is selected by it
    for _, pod_template in [(c["metadata"]["name"], c["spec"]["template"]) for c in out.children
                            if c["kind"] in ("Deployment", "Job")]:  # fmt: skip
        labels = pod_template["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in own["matchLabels"].items())
    by_url = render.render_rljob(rljob(taskApp={"url": "http://x"}), SETTINGS, TaskAppTarget("http://x", None))
    (policy,) = [c for c in by_url.children if c["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": own}]}]


def test_servers_and_trainer_share_the_rollout_token_secret() -> None:
    out = render.render_rljob(rljob(), SETTINGS, TARGET)
    assert out.token_secret == "math-rl-rollout-token"
    want = {"secretKeyRef": {"name": "math-rl-rollout-token", "key": "token"}}
    for _, pod in pods(out.children):
        env = {e["name"]: e.get("valueFrom") for e in pod["containers"][0]["env"]}
        assert env["POSTTRAIN_ROLLOUT_TOKEN"] == want
    secret = render_token_secret(rljob().owner, "s3cr3t")
    assert secret["kind"] == "Secret" and base64.b64decode(secret["data"]["token"]) == b"s3cr3t"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == UID
    # the token never appears in what is rendered for the job (ConfigMap, env values)
    assert "s3cr3t" not in str(out.children)


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
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
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
