"""Learning on the multi-step craftworld app: `posttrain train --local`, the tiny random Qwen2 (full fine-tune)
through vLLM with its replies constrained to one of four actions (move and the three first gathers; vLLM
structured outputs, forwarded by the app), 3 turns per episode, step rewards on, 12 GSPO iterations of 8 seeds
x 4. The held-out mean return (16 eval seeds >= 1,000,000, greedy) is measured before training, at iteration 6
and at the end.

Claim: the held-out mean return at the end exceeds the one before training by at least MARGIN.

UNPROVEN, left out of `make test` (marker `unproven`; `make test-unproven` runs it). It passed once (0.000 ->
0.375, 14 actions) and then failed: CI 2026-11-27 0.0 -> 0.0 -> 0.0 (14 actions); on an Intel Xeon with
AVX-512/AMX, 2026-11-27, 0.375 -> 0.0625 -> 0.0625 (4 actions), training mean return by iteration 0.19, 0.41,
0.19, 0.16, 0.53, 0.41, 0.25, 0.16, 0.13, 0.81, 0.38, 0.16 (no trend). SmolLM2-135M LoRA (lr 5e-4, 4 actions)
did no better: 0.31 -> 0.06 after 5 iterations. A uniform random policy over the four actions returns 0.31 on
average, the best policy that ignores the observation no more, the best one that reads it 1.13 (computed with
craftworld.py over 2,000 seeds): learning here means reading the area from the observation. docs/known-gaps.md."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.unproven]

REPO = Path(__file__).resolve().parents[2]
MARGIN = 0.2
ACTIONS = ["move", "collect_wood", "collect_sapling", "collect_drink"]
TOML = f"""
[algorithm]
type = "online"
method = "policy_gradient"
variety = "gspo"

[compute]
gpu_type = "CPU"
gpu_count = 2

[compute.topology]
gpus_for_vllm = 1
gpus_for_training = 1
reference_placement = "none"

[vllm]
max_model_len = 2048

[model]
base = "posttrain/tiny-random-qwen2"
trainer_mode = "full"
label = "cw-learn"

[rollout]
env_name = "craftworld"
policy_name = "craftworld-react"
max_turns = 3
episodes_per_batch = 32
max_concurrent_rollouts = 32

[rollout.env_config]
max_steps_per_episode = 3

[rollout.policy_config]
temperature = 1.0
max_tokens = 32
tool_choice = "none"
structured_outputs = {{ choice = {json.dumps(ACTIONS)} }}

[training]
num_epochs = 1
iterations_per_epoch = 12
max_turns = 3
batch_size = 8
group_size = 4
learning_rate = 1e-3
step_rewards_enabled = true
step_rewards_mode = "decision_stepwise"
event_rewards_kind = "unique"

[evaluation]
instances = 16
every_n_iters = 6
seeds = {json.dumps(list(range(1_000_000, 1_000_016)))}
"""


def test_held_out_return_rises_on_craftworld(tmp_path):
    from posttrain.modelzoo import build_tiny_model

    model_dir = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)
    config = tmp_path / "learn.toml"
    config.write_text(TOML)
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(config), "--model-path", str(model_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1500,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    evals = [
        json.loads(line.split("event ", 1)[1])
        for line in result.stdout.splitlines()
        if '"event": "evaluation"' in line
    ]
    scores = [e["eval_score"] for e in evals]
    print("held-out mean return by evaluation:", scores)
    train = [
        json.loads(line.split("event ", 1)[1])
        for line in result.stdout.splitlines()
        if '"event": "iteration"' in line
    ]
    print("training mean return by iteration:", [t.get("mean_return") for t in train])
    assert len(scores) >= 2 and all(e["eval_failed"] == 0 for e in evals), evals
    assert scores[-1] - scores[0] >= MARGIN, scores
