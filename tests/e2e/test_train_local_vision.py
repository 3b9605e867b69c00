"""`posttrain train --local --type rl --config examples/rl_vision_shapes.toml`, as a user runs it: the tiny
random Qwen2-VL (posttrain/tiny-random-qwen2-vl, built on first use) against the bundled shapes task app
(started for env_name = "shapes"), 2 GSPO iterations. The images must reach the trainer (it loads the
model's processor, counts sampled media tokens and recomputes the sampled tokens' logprobs with the pixel
values: a small sampler/trainer gap), and the job must end with a final adapter saved with that processor."""

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
CONFIG = REPO / "examples" / "rl_vision_shapes.toml"


def test_vision_rl_job_runs_end_to_end(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(CONFIG)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert "PASS  task_info" in out and "phase: Succeeded" in out, out
    assert re.search(r"^\s+step 2/2\s+mean_return [0-9.]+", out, re.M), out
    assert re.search(
        r"^fine_tuned_model: rl:posttrain/tiny-random-qwen2-vl:local\.shapes-vision-rl\.[0-9a-f]{8}$",
        out,
        re.M,
    ), out
    run_dir = Path(re.search(r"run folder (\S+)", out).group(1))
    assert "posttrain shapes task app" in (run_dir / "logs" / "taskapp.log").read_text()

    metrics = [json.loads(line) for line in (run_dir / "work" / "metrics.jsonl").read_text().splitlines()]
    iterations = [m for m in metrics if "mean_return" in m and "step" in m]
    assert len(iterations) == 2, metrics
    # set only when the trainer loaded the policy's processor (a vision policy) and checked every row
    assert all(isinstance(m["media_tokens_sampled"], int) for m in iterations), iterations
    trained = [m for m in iterations if m["train_sequences"]]
    assert trained, "no group had mixed rewards in two iterations (rare with the partial reward)"
    for m in trained:
        print(f"vision --local step {m['step']}: sampler KL {m['sampler_kl']:.1e}, "
              f"max |delta logprob| {m['sampler_max_abs_delta']:.1e}")  # fmt: skip
        # the same tokens scored with another image differ by 0.06-0.08 (tests/integration/test_rl_vision.py)
        assert m["sampler_max_abs_delta"] < 0.02 and m["sampler_kl"] < 1e-3, m

    final = run_dir / "work" / "final"
    assert (final / "adapter_model.safetensors").is_file() and (final / "processor_config.json").is_file()
    assert "s3 uri: s3://posttrain/jobs/local/shapes-vision-rl-" in out
