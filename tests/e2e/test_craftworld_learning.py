"""Learning on the multi-step craftworld app: `posttrain train --local`, SmolLM2-135M-Instruct with LoRA (the
model of `make demo DEMO_ARGS=--task agent`) through vLLM, its replies constrained to one of four actions
(move and the three first gathers; vLLM structured outputs, forwarded by the app), 3 turns per episode, step
rewards on (each decision credited against the same turn of its group), GSPO, 10 iterations of 4 training
seeds x 8 with dynamic sampling (groups whose episodes all scored the same are replaced, up to 3 rounds). Each observation names the area and ends with the
legal actions (examples/taskapps/craftworld). The held-out mean return (greedy, 36 eval seeds, 6 per start
area) is measured before training and after the last iteration.

On these seeds every constant action returns 1/6 and the best fixed sequence of three actions (an open-loop
policy, blind to what it sees) 0.5, computed here with craftworld.py. Claim: the final held-out return is at
least MARGIN above the one before training, and above every open-loop policy's.

Measured 2026-11-28 on an Intel Xeon (family 6 model 167, AVX-512 + AMX, 2 cores), all from 0.444: after 6
iterations, alone on the machine, 0.889, 1.167, 0.889, 1.0 (4.6-5.3 min each), then 0.5 as the first test of
a `make test` run (there the sampled policy still moved 30-40 % of the time where nothing is to gather, but
greedy it drank); so 10 iterations: 0.75 in `make test` (7.5 min), then 1.028 alone (6.9 min; training mean return 0.44 ->
0.78-1.19 over the last four iterations). The best any policy can get on these
worlds is 1.194, the best policy that sees only the area 0.861; the bar is 0.594. With
groups of 4, 16 runs of three earlier configurations ended at or under the bar 4 times (0.333, 0.444, 0.5
and once in CI), which is why it changed (docs/multi-step.md). Over seeds 1-10 (POSTTRAIN_TEST_SEED; the
same job as `make demo DEMO_ARGS="--task agent --seed N"`) on a Zen 4 EPYC, 2026-11-29: 0.833-1.167, none
under the bar (docs/benchmarks.md, "The learning tests' false-failure rates")."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from fixtures.seeds import seed_from_env

# `make test-learning`: 7-10 min a run on 2 AVX-512 cores, 15+ on 2 AVX2-only cores (over the 900 s default)
pytestmark = [pytest.mark.slow, pytest.mark.learning, pytest.mark.timeout(3300)]

REPO = Path(__file__).resolve().parents[2]
MARGIN = 0.15  # a third above the return before training (0.444)
# the learning configuration is the demo's (`make demo DEMO_ARGS=--task agent`), run as is
CONFIG = REPO / "examples" / "demo" / "agent.toml"


def _world():
    sys.path.insert(0, str(REPO / "examples" / "taskapps" / "craftworld"))
    import craftworld

    return craftworld


def best_fixed_sequence_return(config: dict) -> float:
    """The best held-out mean return of an open-loop policy: one fixed sequence of the config's actions,
    played on every seed whatever the observations say (a constant action is one of them)."""
    world_mod = _world()
    turns = config["rollout"]["env_config"]["max_steps_per_episode"]
    seeds = config["evaluation"]["seeds"]
    actions = config["rollout"]["policy_config"]["structured_outputs"]["choice"]

    def play(seed: int, sequence: tuple[str, ...]) -> float:
        world = world_mod.make_world(seed, "eval", {"max_steps_per_episode": turns})
        return sum(world_mod.step(world, [action])["reward"] for action in sequence if not world.done)

    return max(
        sum(play(s, sequence) for s in seeds) / len(seeds)
        for sequence in itertools.product(actions, repeat=turns)
    )


def test_held_out_return_rises_on_craftworld(tmp_path):
    from posttrain.modelzoo import convert_smollm2

    model_dir = convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    config = tomllib.loads(CONFIG.read_text())
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(CONFIG), "--model-path", str(model_dir),
         "--set", f"training.seed={seed_from_env(0)}"],
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
    open_loop = best_fixed_sequence_return(config)
    print(f"best fixed action sequence: {open_loop:.3f}")
    assert scores[-1] - scores[0] >= MARGIN, scores
    assert scores[-1] > open_loop, (scores, open_loop)
