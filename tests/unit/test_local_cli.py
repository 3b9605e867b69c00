"""`posttrain train` / `status` without a cluster: argument mistakes are one-line errors (exit 2), and the
status poller prints phases and progress and stops at a terminal phase or the timeout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from posttrain.commands import status

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )


def test_poll_prints_phase_changes_and_new_progress_until_terminal():
    states = [
        None,
        {"status": {"phase": "Verifying"}},
        {
            "status": {
                "phase": "Running",
                "progress": {"step": 1, "total": 2, "meanReturn": 0.25, "updatedAt": "a"},
            }
        },
        {
            "status": {
                "phase": "Running",
                "progress": {"step": 1, "total": 2, "meanReturn": 0.25, "updatedAt": "b"},
            }
        },
        {"status": {"phase": "Running", "progress": {"step": 2, "total": 2, "meanReturn": 0.5}}},
        {"status": {"phase": "Succeeded", "fineTunedModel": "rl:b:ns.n.12345678"}},
    ]
    feed = iter(states)
    lines: list[str] = []
    phase, job = status.poll(lambda: next(feed), timeout=60, interval=0, out=lines.append)
    assert phase == "Succeeded" and job["status"]["fineTunedModel"].startswith("rl:")
    assert [line.split()[1] for line in lines if line.startswith("phase:")] == [
        "Pending", "Verifying", "Running", "Succeeded"
    ]  # fmt: skip
    assert [line.strip() for line in lines if "step" in line] == [
        "step 1/2  mean_return 0.25",
        "step 2/2  mean_return 0.5",
    ]


def test_poll_times_out_without_a_terminal_phase():
    phase, job = status.poll(
        lambda: {"status": {"phase": "Running"}}, timeout=0.05, interval=0.01, out=lambda _: None
    )
    assert phase is None and job["status"]["phase"] == "Running"


def test_describe_shows_model_artifacts_and_conditions():
    job = {
        "kind": "RLJob",
        "metadata": {"namespace": "ns", "name": "demo"},
        "status": {
            "phase": "Failed",
            "fineTunedModel": None,
            "message": "task app unreachable",
            "artifacts": {"model": "s3://b/jobs/ns/demo-1/final/"},
            "conditions": [{"type": "TaskAppVerified", "status": "False", "reason": "Unreachable"}],
        },
    }
    text = "\n".join(status.describe(job))
    assert "RLJob ns/demo" in text and "phase:            Failed" in text
    assert "artifact model:" in text and "TaskAppVerified=False (Unreachable)" in text


def test_train_user_mistakes_are_one_line_errors(tmp_path):
    missing = _cli("train", "--local", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[algorithm\n")
    result = _cli("train", "--local", "--config", str(bad))
    assert result.returncode == 2 and "not valid TOML" in result.stderr and "Traceback" not in result.stderr
    sft = tmp_path / "sft.toml"
    sft.write_text('[algorithm]\ntype = "offline"\nmethod = "sft"\nvariety = "fft"\n[job]\nmodel = "posttrain/tiny-random-qwen2"\n'
                   '[compute]\ngpu_type = "CPU"\ngpu_count = 1\n[hyperparameters]\nn_epochs = 1\n')  # fmt: skip
    wrong_type = _cli("train", "--local", "--type", "rl", "--config", str(sft))
    assert wrong_type.returncode == 2 and "--type rl" in wrong_type.stderr
    no_data = _cli("train", "--local", "--config", str(sft), "--runs-dir", str(tmp_path / "runs"))
    assert no_data.returncode == 2 and "dataset" in no_data.stderr and "Traceback" not in no_data.stderr


def test_cluster_mode_without_a_kube_context_says_what_to_do(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    result = _cli("status", "some-job", env=env)
    assert result.returncode == 3  # not found: local runs were looked at, and no cluster could be asked
    assert "no usable kube context" in result.stderr and "--local" in result.stderr
