"""`posttrain train --local` end to end on the tiny model, as a user runs it: a 1-step SFT job, then a 2-iteration
GSPO job whose [model].source is the SFT job's fine_tuned_model (FFT-first chaining through the embedded S3).
Asserts the phases printed, the fine_tuned_model ids, the artifacts in S3, and that nothing is left running.
The RL test needs the rollout server (`python -m posttrain_rollout serve`); a third test interrupts an SFT
run with SIGINT while it trains and checks that every process group it started is gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.tiny_rl import tiny_rl_toml

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TINY = "posttrain/tiny-random-qwen2"

SFT_TOML = """
[algorithm]
type = "offline"
method = "sft"
variety = "fft"

[job]
model = "posttrain/tiny-random-qwen2"

[compute]
gpu_type = "CPU"
gpu_count = 1

[hyperparameters]
n_epochs = 1
train_kind = "fft"
batch_size = 4
sequence_length = 128
learning_rate = 1e-4
"""


def _train(args: list[str], runs: Path, timeout: float = 420) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(runs), *args],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout,
    )  # fmt: skip


def _phases(stdout: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"^phase: (\w+)", stdout, re.M)]


def _left_running(run_dir: Path) -> list[str]:
    """Processes still alive in the process groups the run started (pids.json: {name: pid})."""
    started = json.loads((run_dir / "pids.json").read_text())
    assert started, "the run recorded no processes"
    left = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgid = fields[0], int(fields[2])
        if state != "Z" and pgid in started.values():
            left.append(f"{proc.name} (group {pgid})")
    return left


def _run_dir(stdout: str) -> Path:
    return Path(re.search(r"run folder (\S+)", stdout).group(1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def vllm_tiny_dir() -> Path:
    """The tiny random Qwen2 with head_dim 32: vLLM's CPU attention rejects the default tiny model's head_dim
    16 ("Unsupported CPU attention configuration: head_dim=16"). Same tokenizer and name."""
    from posttrain.modelzoo import build_tiny_model

    return build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)


def _s3_keys(runs: Path, prefix: str) -> list[str]:
    """Object keys in the embedded S3 (its data outlives a run: start it again on the same folder)."""
    from posttrain.s3server import s3_server

    with s3_server(runs / "s3") as s3:
        return [o.object_name for o in s3.client().list_objects("posttrain", prefix=prefix, recursive=True)]


@pytest.fixture(scope="module")
def sft_job(runs, vllm_tiny_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sft")
    data = tmp / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"messages": [{"role": "user", "content": f"What is {i} + 1?"},
                                     {"role": "assistant", "content": str(i + 1)}]}) + "\n"
            for i in range(4)
        )
    )  # fmt: skip
    sft_toml = tmp / "sft.toml"
    sft_toml.write_text(SFT_TOML)
    result = _train(["--type", "sft", "--config", str(sft_toml), "--dataset", str(data), "--name", "e2e-sft",
                     "--model-path", str(vllm_tiny_dir)], runs)  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_sft_local_end_to_end(sft_job, runs):
    out = sft_job
    assert _phases(out) == ["Verifying", "Provisioning", "Running", "Succeeded"]
    assert re.search(r"^\s+step 1/1\s+loss [0-9.]+", out, re.M), out
    ft_id = re.search(r"^fine_tuned_model: (\S+)$", out, re.M).group(1)
    assert re.fullmatch(rf"ft:{re.escape(TINY)}:local\.e2e-sft\.[0-9a-f]{{8}}", ft_id), ft_id
    uid8 = ft_id.rsplit(".", 1)[1]
    prefix = f"jobs/local/e2e-sft-{uid8}/"
    assert f"s3 uri: s3://posttrain/{prefix}final/" in out
    keys = _s3_keys(runs, prefix)
    for key in (
        "final/config.json",
        "final/model.safetensors",
        "manifest.json",
        "metrics.jsonl",
        "data/train.jsonl",
    ):
        assert prefix + key in keys, keys
    assert not _left_running(_run_dir(out)), "processes left running"


def test_rl_local_chained_from_the_sft_model(sft_job, runs, tmp_path):
    ft_id = re.search(r"^fine_tuned_model: (\S+)$", sft_job, re.M).group(1)
    rl_toml = tmp_path / "rl.toml"
    rl_toml.write_text(tiny_rl_toml(label="e2e-rl", trainer_mode="full", model_line=f'source = "{ft_id}"'))
    rl = _train(["--type", "rl", "--config", str(rl_toml), "--nproc-per-node", "2"], runs)
    assert rl.returncode == 0, rl.stdout[-4000:] + rl.stderr[-3000:]
    out = rl.stdout
    assert _phases(out) == ["Verifying", "Provisioning", "Running", "Succeeded"]
    # the trainer starts (and loads its model) while vLLM starts; it waits for the server itself
    assert out.index("phase: Running") < out.index("ready    policy rollout server"), out
    assert "PASS  health" in out and "PASS  task_info" in out and f"PASS  source     {ft_id}" in out
    assert re.search(r"^\s+step 2/2\s+mean_return [0-9.]+", out, re.M), out
    rl_id = re.search(r"^fine_tuned_model: (\S+)$", out, re.M).group(1)
    assert re.fullmatch(rf"rl:{re.escape(TINY)}:local\.e2e-rl\.[0-9a-f]{{8}}", rl_id), rl_id
    uid8 = rl_id.rsplit(".", 1)[1]
    prefix = f"jobs/local/e2e-rl-{uid8}/"
    assert f"s3 uri: s3://posttrain/{prefix}final/" in out
    keys = _s3_keys(runs, prefix)
    assert any(k.startswith(prefix + "final/") for k in keys), keys
    assert prefix + "manifest.json" in keys, keys
    # the trace store is one of the artifacts the job reports (status.artifacts.traces on a cluster)
    artifacts = json.loads((_run_dir(out) / "result.json").read_text())["artifacts"]
    assert artifacts["traces"] == f"s3://posttrain/{prefix}traces.sqlite" and prefix + "traces.sqlite" in keys
    started = json.loads((_run_dir(out) / "pids.json").read_text())
    assert {"s3", "task-app", "rollout-policy", "trainer"} <= set(started), started
    assert not _left_running(_run_dir(out)), "processes left running"


def test_ctrl_c_stops_every_process(runs, vllm_tiny_dir, tmp_path):
    data = tmp_path / "train.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    data.write_text((json.dumps(row) + "\n") * 64)
    sft_toml = tmp_path / "sft.toml"
    sft_toml.write_text(SFT_TOML.replace("batch_size = 4", "batch_size = 1"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(runs), "--type", "sft",
         "--config", str(sft_toml), "--dataset", str(data), "--name", "e2e-interrupt",
         "--model-path", str(vllm_tiny_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
    )  # fmt: skip
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("phase: Running"):
            break
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=90)
    output = "".join(lines) + rest
    assert proc.returncode == 130, output
    assert "phase: Failed" in output and "interrupted" in output, output
    run_dir = _run_dir(output)
    started = json.loads((run_dir / "pids.json").read_text())
    assert {"s3", "trainer"} <= set(started), started
    assert not _left_running(run_dir), "processes left running after Ctrl-C"
