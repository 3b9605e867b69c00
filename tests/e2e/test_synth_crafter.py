"""synth's own task app and config, unchanged: the Crafter task app of the synth-ai 0.2.19 wheel (real
`crafter` from PyPI) on 127.0.0.1, and the wheel's examples/multi_step/configs/crafter_rl_stepwise_shaped.toml
trained through `posttrain train --local`, scaled down only with `--set` (two iterations of 2 seeds x 2, five
turns, the tiny model with a long context). The trainer's log must show multi-turn episodes and non-zero
decision rewards (synth's per-decision achievement deltas), the job must succeed, and the app must have run
the actions the policy's tool calls named.

The policy is the tiny random model after a warm-up of 80 SFT steps on one demonstration, a call of
interact_many with eight "do" actions (what a warm-up from demonstrations does before RL, in seconds): a
"do" facing grass collects a sapling one time in ten, so about half of such decisions unlock
collect_sapling. The random model alone plays about two random actions per call; simulated with
crafter 1.8.3, such a policy unlocks an achievement in 12-18 % of 5-turn episodes, too rarely to show in 8."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.synth_crafter import CONFIG, synth_crafter_app, synth_crafter_python, wheel_file  # noqa: F401

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TURNS = 5
SCALE_DOWN = [
    "training.iterations_per_epoch=2", "training.batch_size=2", "training.group_size=2",
    f"training.max_turns={TURNS}", f"rollout.max_turns={TURNS}", "rollout.episodes_per_batch=4",
    "vllm.max_model_len=16384",
    # no evaluation (two greedy episodes, ~30 s each here): this test is about training; test_synth_loop
    # evaluates on this app, test_train_local_multiturn evaluates a multi-turn job
    "evaluation.seeds=[]",
    # one rollout at a time: the app's tracer writes a local SQLite file (synth's default is a sqld server),
    # which concurrent episodes lock ("database is locked")
    "rollout.max_concurrent_rollouts=1",
    # the tiny model's replies: the app asks for a tool call (tool_choice "required"), which vLLM's
    # structured outputs keep well-formed; a cap that fits one call keeps a turn cheap
    "rollout.policy_config={ temperature = 1.0, max_tokens = 256 }",
]  # fmt: skip


def warm_up_on_do(model_dir: Path, steps: int = 80) -> Path:
    """The tiny model after `steps` SFT steps on one demonstration: the arguments of a call of interact_many
    with eight "do" actions (vLLM's tool grammar writes the call around them), after prompts of 50-1500
    filler words (Crafter's prompts are long). Built once beside `model_dir` and reused (~50 s on 2 cores;
    the Crafter test and the synth loop test both start from it)."""
    import random
    import shutil
    import tempfile

    out = model_dir.parent / f"{model_dir.name}-warm-do-{steps}"
    if (out / "posttrain-warm-up.json").exists():  # written last
        return out

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    rng = random.Random(0)
    words = ("tree", "grass", "water", "stone", "you", "see", "the", "map", "health", "food", "drink", "energy",
             "wood", "sapling", "move", "do")  # fmt: skip
    answer = tokenizer(json.dumps({"actions": ["do"] * 8}) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        filler = " ".join(rng.choice(words) for _ in range(rng.randint(50, 1500)))
        text = tokenizer.apply_chat_template(
            [{"role": "system", "content": filler}, {"role": "user", "content": "act"}],
            tokenize=False, add_generation_prompt=True,
        )  # fmt: skip
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        loss = model(input_ids=torch.tensor([prompt + answer]),
                     labels=torch.tensor([[-100] * len(prompt) + answer])).loss  # fmt: skip
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    # a whole folder or none: built aside, then renamed into place
    building = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    shutil.copytree(model_dir, building, dirs_exist_ok=True)
    model.save_pretrained(building)
    (building / "posttrain-warm-up.json").write_text(json.dumps({"from": model_dir.name, "steps": steps}))
    try:
        building.rename(out)
    except OSError:  # another run put it there first
        shutil.rmtree(building, ignore_errors=True)
    return out


def test_synth_crafter_stepwise_shaped_trains_locally(synth_crafter_app, synth_crafter_python, tmp_path):  # noqa: F811
    from posttrain.modelzoo import build_tiny_model

    url, key = synth_crafter_app
    config = wheel_file(synth_crafter_python, CONFIG)
    # a long context: Crafter's first prompt (rules, tools, the map) is over 2048 of the tiny vocabulary's tokens
    tiny = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32-16k", hidden_size=128, max_positions=16384)
    model_dir = warm_up_on_do(tiny)
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    env["ENVIRONMENT_API_KEY"] = key
    argv = [sys.executable, "-m", "posttrain.cli", "train", "--local", "--type", "rl", "--config", str(config),
            "--task-url", url, "--model-path", str(model_dir), "--runs-dir", str(tmp_path / "runs")]  # fmt: skip
    for item in SCALE_DOWN:
        argv += ["--set", item]
    started = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path, env=env, timeout=1500)
    seconds = time.monotonic() - started
    out = result.stdout
    assert result.returncode == 0, out[-5000:] + result.stderr[-3000:]
    # the trainer's per-iteration line: multi-turn episodes and their decision rewards
    lines = re.findall(r"([0-9.]+) turns/episode, decision rewards (\d+) non-zero", out)
    assert lines, out[-4000:]
    assert all(float(turns) > 1 for turns, _ in lines), lines
    assert sum(int(nonzero) for _, nonzero in lines) > 0, lines
    run_dir = Path(re.search(r"run folder (\S+)", out).group(1))
    metrics = [json.loads(x) for x in next(run_dir.rglob("metrics.jsonl")).read_text().splitlines()]
    iterations = [m for m in metrics if "mean_turns" in m]
    import sqlite3

    with sqlite3.connect(run_dir / "work" / "traces.sqlite") as db:
        tokens = [n for (n,) in db.execute("SELECT episode_tokens FROM session_traces WHERE kind = 'train'")]
        sampled = [n for (n,) in db.execute("SELECT sampled_tokens FROM session_traces WHERE kind = 'train'")]
        calls = [json.loads(c) for (c,) in db.execute("SELECT tool_calls FROM steps") if c]
    # the app ran what the policy asked for: its recorded calls carry actions, not the empty list a call
    # with free-form arguments parses to
    actions = [a for step in calls for call in step for a in json.loads(call["arguments"]).get("actions", [])]
    assert calls and len(actions) >= len(calls), calls[:3]
    print(
        f"synth Crafter (synth-ai 0.2.19): turns/episode {[m['mean_turns'] for m in iterations]}, decision rewards "
        f"non-zero {[m['decision_rewards_nonzero'] for m in iterations]} (sum "
        f"{[round(m['decision_reward_sum'], 3) for m in iterations]}), tokens/episode "
        f"{statistics.mean(t or 0 for t in tokens):.0f} (sampled {statistics.mean(sampled):.0f}), seconds/iteration "
        f"{[round(m['iteration_seconds'], 1) for m in iterations]}, job {seconds:.0f} s"
    )
