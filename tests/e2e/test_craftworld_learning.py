"""Learning on the multi-step craftworld app: `posttrain train --local`, SmolLM2-135M-Instruct with LoRA (the
model of `make demo DEMO_ARGS=--task agent`) through vLLM, its replies constrained to one of four actions
(move and the three first gathers; vLLM structured outputs, forwarded by the app), 3 turns per episode, step
rewards on, GSPO, ITERATIONS iterations of 4 training seeds x 4. Each observation names the area and ends
with the legal actions (examples/taskapps/craftworld). The held-out mean return (greedy, 18 eval seeds,
3 per start area) is measured before training and after the last iteration.

On these seeds every constant action returns 1/6 (computed here with craftworld.py), the best fixed
three-action sequence 0.556, a uniform random policy 0.34, the policy that plays the first new legal gather
(else move) 1.33. Claim: the final held-out return exceeds both the one before training and the best
constant action by at least MARGIN.

Measured 2026-11-27 on an Intel Xeon (family 6 model 167, AVX-512 + AMX, 2 cores): under load from other jobs,
run A 0.444 -> 0.778 (24.3 min wall), run B (data.seed_start 5000, training.seed 1) 0.444 -> 0.722 (17.7 min);
quiet, this test three times in a row: 0.833 (2 min 48 s), 1.278 under the AVX2 emulation (3 min 23 s), 0.833
(2 min 28 s); then `make demo DEMO_ARGS=--task agent` (the same config): 0.444 -> 0.667, one held-out seed
above this test's bar (0.644). Still UNPROVEN: the bar has too little room to hold in CI run after run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.unproven]

REPO = Path(__file__).resolve().parents[2]
MARGIN = 0.2
# the learning configuration is the demo's (`make demo DEMO_ARGS=--task agent`), run as is
CONFIG = REPO / "examples" / "demo" / "agent.toml"


def _world():
    sys.path.insert(0, str(REPO / "examples" / "taskapps" / "craftworld"))
    import craftworld

    return craftworld


def best_constant_return(config: dict) -> float:
    """The best held-out mean return of a policy that plays one of the config's actions everywhere (what a
    greedy policy blind to the observation scores) on the config's evaluation seeds."""
    world_mod = _world()
    turns = config["rollout"]["env_config"]["max_steps_per_episode"]
    seeds = config["evaluation"]["seeds"]

    def play(seed: int, action: str) -> float:
        world = world_mod.make_world(seed, "eval", {"max_steps_per_episode": turns})
        return sum(world_mod.step(world, [action])["reward"] for _ in range(turns) if not world.done)

    actions = config["rollout"]["policy_config"]["structured_outputs"]["choice"]
    return max(sum(play(s, a) for s in seeds) / len(seeds) for a in actions)


def test_held_out_return_rises_on_craftworld(tmp_path):
    from posttrain.modelzoo import convert_smollm2

    model_dir = convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    config = tomllib.loads(CONFIG.read_text())
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(CONFIG), "--model-path", str(model_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=3000,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    evals = [
        json.loads(line.split("event ", 1)[1])
        for line in result.stdout.splitlines()
        if '"event": "evaluation"' in line
    ]
    scores = [e["eval_score"] for e in evals]
    print("held-out mean return by evaluation:", scores)
    train = [float(m) for m in re.findall(r"step \d+/\d+\s+mean_return ([-\d.]+)", result.stdout)]
    print("training mean return by iteration:", train)
    assert len(scores) >= 2 and all(e["eval_failed"] == 0 for e in evals), evals
    assert scores[-1] - scores[0] >= MARGIN, scores
    assert scores[-1] - best_constant_return(config) >= MARGIN, scores
