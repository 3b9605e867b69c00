"""The CLI against the real control plane (kube-apiserver, controller-manager, scheduler, kwok): `status`
lists (-n, -A, --type) and follows (--watch) jobs, `logs` finds a job's pods by its labels, `plot` reads a
finished job's metrics.jsonl from a real S3, `eval --cluster` runs as a Job and is followed to its end,
`train --model` overrides the TOML's model, local SFT files land in one ConfigMap, and the API server takes
a ReST-EM RLJob (its CEL rule) and refuses a GSPO one with group size 1."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import yaml
from fixtures.operator_process import ensure_crds
from kubernetes import client
from kubernetes.client.rest import ApiException
from posttrain.api.resources import GROUP, VERSION
from posttrain.cli import main
from posttrain_dev.devcluster import KWOK_EXIT_ANNOTATION

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def kube(cluster, monkeypatch, tmp_path):
    """The test's kube context is the control plane; no local runs, no task-app env."""
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    api = cluster.api_client()
    ensure_crds(api)
    yield api
    api.close()


def _restem_job(namespace: str, name: str) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "crs" / "restem_math.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


def _sft_job(namespace: str, name: str) -> dict:
    doc = yaml.safe_load((REPO / "examples" / "crs" / "sft_lora.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    return doc


def _create(api, doc: dict) -> None:
    plural = {"RLJob": "rljobs", "SFTJob": "sftjobs"}[doc["kind"]]
    client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, doc["metadata"]["namespace"], plural, doc
    )


def _patch_status(api, namespace: str, plural: str, name: str, status: dict) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, plural, name, {"status": status},
        _content_type="application/merge-patch+json")  # fmt: skip


def _second_namespace(api) -> str:
    import uuid

    name = f"t-{uuid.uuid4().hex[:10]}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def test_the_api_server_takes_restem_and_refuses_gspo_with_one_sample(kube, namespace):
    _create(kube, _restem_job(namespace, "restem"))
    gspo = yaml.safe_load((REPO / "examples" / "crs" / "rl_qwen3_4b.yaml").read_text())
    gspo["metadata"] = {"name": "gspo-one", "namespace": namespace}
    gspo["spec"]["training"]["groupSize"] = 1
    with pytest.raises(ApiException) as err:
        _create(kube, gspo)
    assert (
        err.value.status == 422
        and "GSPO needs training.groupSize >= 2" in json.loads(err.value.body)["message"]
    )


def test_status_lists_and_watches_jobs(kube, namespace, tmp_path, capsys):
    other = _second_namespace(kube)
    try:
        _create(kube, _restem_job(namespace, "restem-a"))
        _create(kube, _sft_job(other, "sft-b"))
        _patch_status(kube, namespace, "rljobs", "restem-a", {"phase": "Running", "startTime": "2026-11-23T10:00:00Z",
                      "progress": {"step": 1, "total": 2, "meanReturn": 0.12, "evalScore": 0.2, "loss": 0.9}})  # fmt: skip
        runs = ["--runs-dir", str(tmp_path / "runs")]
        assert main(["status", "-n", namespace, *runs]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) == 2 and lines[1].split()[:8] == [namespace, "restem-a", "RLJob", "Running", "1/2", "0.12",
                                                             "0.2", "0.9"]  # fmt: skip
        assert main(["status", "-A", *runs]) == 0
        names = {line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
        assert {"restem-a", "sft-b"} <= names
        assert main(["status", "-A", "--type", "sft", *runs]) == 0
        names = {line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]}
        assert "sft-b" in names and "restem-a" not in names

        def advance() -> None:
            time.sleep(1.5)
            _patch_status(kube, namespace, "rljobs", "restem-a", {"progress": {"step": 2, "meanReturn": 0.4}})
            time.sleep(1.5)
            _patch_status(kube, namespace, "rljobs", "restem-a",
                          {"phase": "Succeeded", "fineTunedModel": "rl:HuggingFaceTB/SmolLM2-135M-Instruct:x.y.z"})  # fmt: skip

        thread = threading.Thread(target=advance)
        thread.start()
        assert main(["status", "restem-a", "-n", namespace, "--watch", "--interval", "0.5", *runs]) == 0
        thread.join()
        watched = capsys.readouterr().out.splitlines()
        assert watched[0].startswith("Running       step 1/2  reward 0.12  eval 0.2  loss 0.9  ETA ")
        assert watched[1].startswith("Running       step 2/2  reward 0.4")
        assert watched[-1].startswith("Succeeded     step 2/2") and "fine_tuned_model rl:" in watched[-1]
        assert main(["status", "nope", "-n", namespace, *runs]) == 3
    finally:
        client.CoreV1Api(kube).delete_namespace(other)


def _labelled_job(api, namespace: str, job: str, role: str) -> None:
    labels = {"posttrain.dev/job": job, "posttrain.dev/role": role}
    body = client.V1Job(
        metadata=client.V1ObjectMeta(name=f"{job}-{role}", labels=labels),
        spec=client.V1JobSpec(backoff_limit=0, template=client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels=labels),
            spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(name=role, image="x")]))),
    )  # fmt: skip
    client.BatchV1Api(api).create_namespaced_job(namespace, body)


def test_logs_finds_the_pods_by_job_and_role_labels(kube, namespace, tmp_path, capsys):
    _labelled_job(kube, namespace, "math-rl", "trainer")
    _labelled_job(kube, namespace, "math-rl", "rollout")
    core = client.CoreV1Api(kube)
    deadline = time.monotonic() + 60
    while len(core.list_namespaced_pod(namespace, label_selector="posttrain.dev/job=math-rl").items) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    # kwok's simulated nodes run no containers, so there is no log to read: the command says so per pod
    assert main(["logs", "math-rl", "-n", namespace, "--role", "trainer", "--runs-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("no log from pod math-rl-trainer-") and "(HTTP " in err[0]
    assert main(["logs", "math-rl", "-n", namespace, "--runs-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    pods = core.list_namespaced_pod(namespace, label_selector="posttrain.dev/job=math-rl").items
    expected = sorted(f"[{p.metadata.labels['posttrain.dev/role']} {p.metadata.name}]" for p in pods)
    assert (
        sorted(line.split(" no log")[0] for line in err) == expected
    )  # every pod, prefixed by role and name
    assert main(["logs", "other", "-n", namespace, "--runs-dir", str(tmp_path)]) == 2
    assert "no job or local run named 'other'" in capsys.readouterr().err


def test_plot_reads_a_finished_jobs_metrics_from_s3(kube, namespace, s3_env, tmp_path, capsys):
    _create(kube, _restem_job(namespace, "done"))
    lines = [{"step": 0, "eval_score": 0.1}, {"step": 1, "mean_return": 0.2, "loss": 0.7},
             {"step": 1, "eval_score": 0.3}, {"step": 2, "mean_return": 0.5, "loss": 0.4}]  # fmt: skip
    key = f"jobs/{namespace}/done/metrics.jsonl"
    data = "".join(json.dumps(x) + "\n" for x in lines).encode()
    import io

    s3_env.client().put_object(s3_env.bucket, key, io.BytesIO(data), len(data))
    out = tmp_path / "done.png"
    # running: no metrics.jsonl yet
    assert main(["plot", "done", "-n", namespace, "-o", str(out)]) == 2
    assert "its metrics.jsonl is uploaded after its first step" in capsys.readouterr().err
    _patch_status(kube, namespace, "rljobs", "done",
                  {"phase": "Succeeded", "artifacts": {"metrics": f"s3://{s3_env.bucket}/{key}"}})  # fmt: skip
    assert main(["plot", "done", "-n", namespace, "-o", str(out)]) == 0
    assert (
        out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and f"wrote {out} ({namespace}/done)" in capsys.readouterr().out
    )


def test_a_running_jobs_live_curve(kube, namespace, s3_env, tmp_path, capsys, monkeypatch):
    """The trainer's live uploads (posttrain_trainer/live.py, the real code on real S3) -> the job's
    status.progress.metrics -> `posttrain plot` and `posttrain status` while the job still runs."""
    from posttrain.api.jobfile import JobFile
    from posttrain_trainer.report import Reporter

    _create(kube, _restem_job(namespace, "live"))
    monkeypatch.setenv("POSTTRAIN_LIVE_EVERY", "2")
    monkeypatch.delenv("POSTTRAIN_METRICS_PORT", raising=False)
    job = JobFile.model_validate({
        "kind": "rl", "base_model": "m", "model_path": "m", "workdir": str(tmp_path / "work"),
        "job": {"name": "live", "namespace": namespace, "uid": "0123456789abcdef"},
        "storage": s3_env.storage(f"jobs/{namespace}/live/"), "report": {"mode": "file"},
        "config": {"training": {"report_to": ["tensorboard"]}},
    })  # fmt: skip
    reporter = Reporter(job)
    history: list[dict] = []
    for step, reward in enumerate([0.1, 0.3, 0.2, 0.6, 0.7], start=1):
        history.append({"step": step, "mean_return": reward, "loss": 1.0 / step})
        reporter.record(history[-1], history)
        progress = reporter.progress(step=step, total=10, mean_return=reward)
    uri = f"s3://{s3_env.bucket}/jobs/{namespace}/live/metrics.jsonl"
    assert progress["metrics"] == uri  # uploaded after steps 1, 2 and 4: steps 1..4 are in S3
    stored = s3_env.client().get_object(s3_env.bucket, f"jobs/{namespace}/live/metrics.jsonl").read().decode()
    assert [json.loads(x)["step"] for x in stored.splitlines()] == [1, 2, 3, 4]
    png = s3_env.client().get_object(s3_env.bucket, f"jobs/{namespace}/live/reward_curve.png").read()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # report_to = "tensorboard": the event files travel with the live curve
    events = [o.object_name for o in s3_env.client().list_objects(
        s3_env.bucket, prefix=f"jobs/{namespace}/live/tensorboard/", recursive=True)]  # fmt: skip
    assert events and all("events.out.tfevents" in k for k in events), events
    _patch_status(kube, namespace, "rljobs", "live", {"phase": "Running", "progress": progress})
    out = tmp_path / "live.png"
    assert main(["plot", "live", "-n", namespace, "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    capsys.readouterr()
    assert main(["status", "live", "-n", namespace]) == 0
    shown = capsys.readouterr().out
    assert "curve:            reward " in shown and "0.1 -> 0.6 (4 steps)" in shown
    assert f"live metrics:     {uri}" in shown


def test_eval_cluster_runs_a_job_and_follows_it(kube, namespace, monkeypatch, capsys):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "sk_env_cluster_eval")
    for name in ("S3_ENDPOINT", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    core, batch = client.CoreV1Api(kube), client.BatchV1Api(kube)

    def finish_pod() -> None:  # kwok runs no container: end the pod as the real one would, exit 0
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            pods = core.list_namespaced_pod(namespace, label_selector="posttrain.dev/role=eval").items
            running = [p for p in pods if p.status.phase == "Running"]
            if running:
                core.patch_namespaced_pod(running[0].metadata.name, namespace,
                                          {"metadata": {"annotations": {KWOK_EXIT_ANNOTATION: "0"}}})  # fmt: skip
                return
            time.sleep(0.5)

    thread = threading.Thread(target=finish_pod)
    thread.start()
    code = main(["eval", "--cluster", "-n", namespace, "--task-url", "http://math-task-app:8000",
                 "--model", "Qwen/Qwen3-4B", "--env-name", "math", "--seeds", "1000000-1000015", "--split", "eval",
                 "--samples", "4", "--name", "eval-qwen", "--gpus", "1", "--wait-timeout", "120"])  # fmt: skip
    thread.join()
    out = capsys.readouterr().out
    assert code == 0, out
    phases = [line.split()[1] for line in out.splitlines() if line.startswith("phase:")]
    assert phases[-1] == "Succeeded" and set(phases) <= {"Pending", "Running", "Succeeded"}, out
    assert f"results: s3://posttrain/jobs/{namespace}/evals/eval-qwen/" in out
    job = batch.read_namespaced_job("eval-qwen", namespace)
    container = job.spec.template.spec.containers[0]
    command = container.command
    assert command[:2] == ["posttrain", "eval"] and "--cluster" not in command
    assert command[command.index("--seeds") + 1] == "1000000-1000015"
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    env = {e.name: e for e in container.env}
    assert env["ENVIRONMENT_API_KEY"].value_from.secret_key_ref.name == "posttrain-environment-api-key"
    assert "sk_env_cluster_eval" not in json.dumps(client.ApiClient().sanitize_for_serialization(job))
    secret = core.read_namespaced_secret("posttrain-environment-api-key", namespace)
    assert set(secret.data) == {"ENVIRONMENT_API_KEY"}
    assert secret.metadata.labels["posttrain.dev/use"] == "task-app-key"  # the operator reads no other


def test_train_model_flag_and_local_sft_files_in_one_configmap(
    kube, namespace, tmp_path, monkeypatch, capsys
):
    for name in ("S3_ENDPOINT", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY", "ENVIRONMENT_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    objects = client.CustomObjectsApi(kube)
    assert main(["train", "--config", str(REPO / "examples" / "restem_math.toml"), "--model", "Qwen/Qwen3-1.7B",
                 "--task-url", "http://math:8000", "-n", namespace, "--name", "overridden", "--no-poll"]) == 0  # fmt: skip
    job = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", "overridden")
    assert job["spec"]["model"]["base"] == "Qwen/Qwen3-1.7B" and "source" not in job["spec"]["model"]

    config = tmp_path / "sft.toml"
    text = (REPO / "examples" / "sft_full.toml").read_text()
    config.write_text(text.replace('"s3://posttrain/datasets/math_chat_val.jsonl"',
                                   f'"{REPO / "examples/datasets/math_chat_val.jsonl"}"'))  # fmt: skip
    assert main(["train", "--config", str(config), "--dataset", str(REPO / "examples/datasets/math_chat.jsonl"),
                 "-n", namespace, "--name", "sft-files", "--no-poll"]) == 0  # fmt: skip
    spec = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "sftjobs", "sft-files")["spec"]
    train_ref, val_ref = spec["dataset"]["configMapRef"], spec["validationDataset"]["configMapRef"]
    assert train_ref["name"] == val_ref["name"] and (train_ref["key"], val_ref["key"]) == (
        "train.jsonl",
        "validation.jsonl",
    )
    cm = client.CoreV1Api(kube).read_namespaced_config_map(train_ref["name"], namespace)
    assert cm.data["validation.jsonl"] == (REPO / "examples/datasets/math_chat_val.jsonl").read_text()
    assert cm.metadata.labels["posttrain.dev/job"] == "sft-files"


def test_train_loads_env_files_into_a_secret_never_the_job(kube, namespace, tmp_path, monkeypatch, capsys):
    """./.env is loaded by default and --env-file (repeatable, later wins) on top: the task app key reaches
    the cluster as the Secret the RLJob references; neither the RLJob nor the output holds a value."""
    import base64

    for name in ("ENVIRONMENT_API_KEY", "TASK_APP_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "placeholder")  # recorded, so the test restores the absence
    monkeypatch.delenv("ENVIRONMENT_API_KEY")
    monkeypatch.setenv("TASK_APP_URL", "placeholder")
    monkeypatch.delenv("TASK_APP_URL")
    monkeypatch.chdir(tmp_path)
    first, later = "sk_env_dotenv_value_0001", "sk_env_envfile_value_0002"
    (tmp_path / ".env").write_text(
        f"ENVIRONMENT_API_KEY={first}\nTASK_APP_URL=http://math-from-dotenv:8000\n"
    )
    assert main(["train", "--config", str(REPO / "examples" / "restem_math.toml"), "-n", namespace,
                 "--name", "dotenv", "--no-poll"]) == 0  # fmt: skip
    objects, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    job = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", "dotenv")
    assert job["spec"]["taskApp"]["url"] == "http://math-from-dotenv:8000"
    ref = job["spec"]["taskApp"]["apiKeySecretRef"]
    secret = core.read_namespaced_secret(ref["name"], namespace)
    assert base64.b64decode(secret.data[ref["key"]]).decode() == first
    assert first not in json.dumps(job)

    override = tmp_path / "override.env"
    override.write_text(f"ENVIRONMENT_API_KEY={later}\n")
    assert main(["train", "--config", str(REPO / "examples" / "restem_math.toml"), "-n", namespace,
                 "--name", "envfile", "--no-poll", "--env-file", str(tmp_path / ".env"),
                 "--env-file", str(override)]) == 0  # fmt: skip
    job = objects.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", "envfile")
    secret = core.read_namespaced_secret(job["spec"]["taskApp"]["apiKeySecretRef"]["name"], namespace)
    assert base64.b64decode(secret.data["ENVIRONMENT_API_KEY"]).decode() == later
    assert later not in json.dumps(job) and first not in json.dumps(job)
    out = capsys.readouterr()
    assert first not in out.out + out.err and later not in out.out + out.err
