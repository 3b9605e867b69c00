"""`posttrain train` / `status` in cluster mode against the real control plane (kube-apiserver + etcd +
controller-manager + scheduler + kwok from the `cluster` fixture): the TOML is converted and server-side
applied, the task app key travels as a Secret reference, and the command polls the job's status, printing
phases and progress, until Succeeded (exit 0, fine_tuned_model printed) or Failed (exit 1).

The job's status is written here the way the operator and the trainer write it (merge patches of the status
subresource), so these tests exercise the CLI's side of the contract on a real API server; the operator's own
lifecycle is tested in tests/integration/test_operator.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.operator_process import api_client_of, ensure_crds, kubeconfig_of
from posttrain.api.resources import GROUP, VERSION

pytestmark = [pytest.mark.cluster]

REPO = Path(__file__).resolve().parents[2]
RL_TOML = (
    (REPO / "examples" / "demo" / "rl.toml").read_text().replace('gpu_type = "CPU"', 'gpu_type = "H100"')
)
KEY = "sk_env_cluster_cli_test_0001"


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _get(co, namespace: str, name: str):
    from kubernetes.client.exceptions import ApiException

    try:
        return co.get_namespaced_custom_object(GROUP, VERSION, namespace, "rljobs", name)
    except ApiException:
        return None


def _train(cluster, namespace: str, config: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "KUBECONFIG": kubeconfig_of(cluster), "ENVIRONMENT_API_KEY": KEY}
    env.pop("TASK_APP_URL", None)
    return subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "train", "--type", "rl", "--config", str(config), "-n", namespace,
         "--name", "demo-rl", "--task-url", "http://task-app.example:8000", "--poll-interval", "0.3", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env,
    )  # fmt: skip


def _patch(co, namespace: str, status: dict) -> None:
    co.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "rljobs", "demo-rl", {"status": status}
    )
    time.sleep(1.0)  # let the poller see each state


@pytest.fixture
def co(cluster):
    from kubernetes import client

    api = api_client_of(cluster)
    ensure_crds(api)
    return client.CustomObjectsApi(api)


def test_train_applies_polls_and_reports_the_fine_tuned_model(cluster, namespace, co, tmp_path):
    from kubernetes import client

    config = tmp_path / "rl.toml"
    config.write_text(RL_TOML)
    train = _train(cluster, namespace, config, "--poll-timeout", "120")
    try:
        job = _wait(lambda: _get(co, namespace, "demo-rl"), 60, "the RLJob to be applied")
        spec = job["spec"]
        assert spec["taskApp"]["url"] == "http://task-app.example:8000"
        assert spec["taskApp"]["apiKeySecretRef"]["name"] == "posttrain-environment-api-key"
        assert spec["model"]["base"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
        assert KEY not in str(job)
        secret = client.CoreV1Api(api_client_of(cluster)).read_namespaced_secret(
            "posttrain-environment-api-key", namespace
        )
        assert "ENVIRONMENT_API_KEY" in secret.data
        uid8 = job["metadata"]["uid"].replace("-", "")[:8]
        fine_tuned = f"rl:HuggingFaceTB/SmolLM2-135M-Instruct:{namespace}.demo-rl.{uid8}"
        _patch(co, namespace, {"phase": "Verifying"})
        _patch(co, namespace, {"phase": "Running", "progress": {"step": 6, "total": 12, "meanReturn": 0.5}})
        _patch(co, namespace, {"phase": "Succeeded", "fineTunedModel": fine_tuned,
                               "artifacts": {"model": f"s3://posttrain/jobs/{namespace}/demo-rl-{uid8}/final/"}})  # fmt: skip
        out, _ = train.communicate(timeout=60)
    finally:
        if train.poll() is None:
            train.kill()
    assert train.returncode == 0, out
    phases = re.findall(r"^phase: (\w+)", out, re.M)
    assert phases[-3:] == ["Verifying", "Running", "Succeeded"], out
    assert "step 6/12  mean_return 0.5" in out
    assert f"fine_tuned_model: {fine_tuned}" in out
    assert f"s3 uri: s3://posttrain/jobs/{namespace}/demo-rl-{uid8}/final/" in out

    # status shows the same; a second apply of the same TOML is a no-op (same object).
    env = {**os.environ, "KUBECONFIG": kubeconfig_of(cluster)}
    shown = subprocess.run([sys.executable, "-m", "posttrain.cli", "status", "demo-rl", "-n", namespace],
                           capture_output=True, text=True, cwd=REPO, env=env, timeout=60)  # fmt: skip
    assert shown.returncode == 0 and "phase:            Succeeded" in shown.stdout
    assert f"fine_tuned_model: {fine_tuned}" in shown.stdout


def test_train_exits_1_when_the_job_fails(cluster, namespace, co, tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text(RL_TOML)
    train = _train(cluster, namespace, config, "--poll-timeout", "120")
    try:
        _wait(lambda: _get(co, namespace, "demo-rl"), 60, "the RLJob to be applied")
        _patch(co, namespace, {"phase": "Failed", "reason": "TaskAppUnreachable", "message": "task app down"})
        out, _ = train.communicate(timeout=60)
    finally:
        if train.poll() is None:
            train.kill()
    assert train.returncode == 1, out
    assert "phase: Failed" in out and "TaskAppUnreachable" in out


def test_no_poll_and_poll_timeout(cluster, namespace, co, tmp_path):
    config = tmp_path / "rl.toml"
    config.write_text(RL_TOML)
    applied = _train(cluster, namespace, config, "--no-poll")
    out, _ = applied.communicate(timeout=60)
    assert applied.returncode == 0 and "applied RLJob" in out
    waited = _train(cluster, namespace, config, "--poll-timeout", "2")
    out, _ = waited.communicate(timeout=60)
    assert waited.returncode == 4 and "posttrain status demo-rl" in out


def test_status_of_a_missing_job_exits_3(cluster, namespace, co):
    env = {**os.environ, "KUBECONFIG": kubeconfig_of(cluster)}
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "status", "nope", "-n", namespace],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 3 and "no RLJob or SFTJob named 'nope'" in result.stderr


def test_sft_dataset_goes_into_a_configmap_the_job_references(cluster, namespace, co, tmp_path):
    from kubernetes import client

    env = {k: v for k, v in os.environ.items() if not k.startswith("S3_")}
    env["KUBECONFIG"] = kubeconfig_of(cluster)
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--type", "sft", "--config",
         str(REPO / "examples" / "demo" / "sft.toml"), "-n", namespace, "--name", "demo-sft", "--no-poll"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    job = co.get_namespaced_custom_object(GROUP, VERSION, namespace, "sftjobs", "demo-sft")
    ref = job["spec"]["dataset"]["configMapRef"]
    cm = client.CoreV1Api(api_client_of(cluster)).read_namespaced_config_map(ref["name"], namespace)
    rows = cm.data[ref["key"]].splitlines()
    assert len(rows) == 16 and '"messages"' in rows[0]
