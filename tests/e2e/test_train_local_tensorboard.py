"""`[training] report_to = "tensorboard"` end to end: a local SFT run on the tiny model (a real trainer process
under torchrun, the embedded S3) leaves TensorBoard event files in the job's S3 folder, which TensorBoard's
own reader loads with one loss point per step; `posttrain status` shows the run's loss curve."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

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

[training]
report_to = "tensorboard"

[hyperparameters]
n_epochs = 3
train_kind = "fft"
batch_size = 2
sequence_length = 64
learning_rate = 1e-3
"""


def test_sft_local_writes_tensorboard_events_to_s3(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from posttrain.modelzoo import build_tiny_model
    from posttrain.s3server import s3_server
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = build_tiny_model(tmp_path / "tiny")
    data = tmp_path / "train.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": str(i + 1)}]}
            for i in range(4)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    toml = tmp_path / "sft.toml"
    toml.write_text(SFT_TOML)
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
    env["POSTTRAIN_LIVE_EVERY"] = "2"
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(runs), "--type", "sft",
         "--config", str(toml), "--dataset", str(data), "--name", "tb", "--model-path", str(model)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    uid8 = re.search(r"^fine_tuned_model: \S+\.([0-9a-f]{8})$", result.stdout, re.M).group(1)
    prefix = f"jobs/local/tb-{uid8}/tensorboard/"
    events = tmp_path / "events"
    with s3_server(runs / "s3") as s3:
        client = s3.client()
        keys = [o.object_name for o in client.list_objects("posttrain", prefix=prefix, recursive=True)]
        assert keys and all("events.out.tfevents" in k for k in keys), keys
        for key in keys:
            client.fget_object("posttrain", key, str(events / Path(key).name))
    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    steps = [e.step for e in accumulator.Scalars("loss")]
    assert steps == list(range(1, len(steps) + 1)) and len(steps) == 6, steps  # 4 rows / batch 2 x 3 epochs

    status = subprocess.run([sys.executable, "-m", "posttrain.cli", "status", "tb", "--local", "--runs-dir",
                             str(runs)], capture_output=True, text=True, cwd=REPO, env=env, timeout=60)  # fmt: skip
    assert re.search(r"curve: +loss \S+ .* -> .* \(6 steps\)", status.stdout), status.stdout
