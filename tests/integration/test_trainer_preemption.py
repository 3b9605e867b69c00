"""A trainer preempted by SIGTERM (its pod deleted: Kueue preemption, a drain) checkpoints and resumes.

The real pod command (python -m posttrain_trainer.launch: torchrun in process, one worker) trains SFT on the
tiny model against real S3 with no periodic checkpoints. SIGTERM goes to the launcher only, as the kubelet
sends it to the container's first process: torchrun forwards it, the worker finishes its step, saves a
checkpoint of that step, reports it and stops; the launcher exits 75 (EXIT_PREEMPTED). A second run of the
same job file resumes from that checkpoint: its first step is the one after, and it finishes the job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from posttrain.api.exitcodes import EXIT_PREEMPTED
from posttrain.localhost import free_port

REPO = Path(__file__).resolve().parents[2]
STEPS = 12


def _job(tmp: Path, model_dir: Path, storage: dict) -> Path:
    rows = [
        {"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                      {"role": "assistant", "content": f"The answer is {a + b}."}]}
        for a in range(12) for b in range(8)
    ]  # fmt: skip
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    uid = str(uuid.uuid4())
    job = {
        "kind": "sft",
        "job": {"name": "preempted", "namespace": "test", "uid": uid},
        "config": {"hyperparameters": {"n_epochs": 1, "global_batch": 8, "per_device_batch": 8,
                                       "learning_rate": 1e-3, "sequence_length": 64},
                   "training": {"mode": "full_finetune"}},  # fmt: skip
        "base_model": "posttrain/tiny-random-qwen2",
        "model_path": str(model_dir),
        "dataset": {"train": str(tmp / "train.jsonl"), "validation": None},
        "report": {"mode": "file", "path": str(tmp / "report.jsonl")},
        "workdir": str(tmp / "work"),
        "checkpoint_every": 0,  # no periodic checkpoint: the only one is SIGTERM's
        "storage": {**storage, "prefix": f"jobs/test/preempted-{uid[:8]}/"},
    }
    (tmp / "job.json").write_text(json.dumps(job))
    return tmp / "job.json"


def _launch(job: Path, env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "posttrain_trainer.launch", "--nnodes=1", "--nproc-per-node=1",
           "--node-rank=0", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
           "-m", "posttrain_trainer", "sft", "--config", str(job)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _steps(lines: list[dict]) -> list[int]:
    return [line["progress"]["step"] for line in lines if "loss" in line.get("progress", {})]


def test_sigterm_checkpoints_exits_75_and_the_next_run_resumes(s3_env, tiny_model_dir, tmp_path):
    job = _job(tmp_path / "run", tiny_model_dir, s3_env.storage())
    report = tmp_path / "run" / "report.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **s3_env.env(),
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"}  # fmt: skip
    proc = _launch(job, {**env, "POSTTRAIN_DEBUG_STEP_SLEEP": "0.5"})
    try:
        deadline = time.monotonic() + 120
        while not any(step >= 2 for step in _steps(_lines(report))):
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no second step within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)  # the launcher only, as the kubelet does
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_PREEMPTED, out[-3000:]
    first = _lines(report)
    stopped = [line for line in first if line.get("event") == "preempted"]
    assert len(stopped) == 1, out[-3000:]
    at = stopped[0]["step"]
    assert 2 <= at < STEPS and max(_steps(first)) == at  # stopped after the step it was in, not later
    saved = [line for line in first if line.get("event") == "checkpoint"]
    assert [line["step"] for line in saved] == [at]
    assert stopped[0]["checkpoint"] == saved[0]["uri"] and saved[0]["uri"].endswith(f"checkpoints/step-{at}/")
    assert first[-1]["progress"]["lastCheckpoint"] == saved[0]["uri"]  # status.progress names it
    assert not any("result" in line for line in first)

    again = _launch(job, env)
    out, _ = again.communicate(timeout=180)
    assert again.returncode == 0, out[-3000:]
    lines = _lines(report)[len(first) :]
    resumed = [line for line in lines if line.get("event") == "resumed"]
    assert len(resumed) == 1 and resumed[0]["step"] == at and resumed[0]["checkpoint"] == saved[0]["uri"]
    assert sorted(set(_steps(lines))) == list(range(at + 1, STEPS + 1))  # the step continues, not from zero
    assert "result" in lines[-1]
