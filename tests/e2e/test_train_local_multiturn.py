"""`posttrain train --local` on a multi-step job, as a user runs it: the tiny model against the bundled
craftworld task app (started for env_name = "craftworld"), synth's step-reward keys on. The trainer's
metrics.jsonl must show episodes of several turns and the decision-reward statistics; the job succeeds."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.tiny_rl import tiny_rl_toml

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TURNS = 3
EVAL_SEEDS = (100, 101)


def _craftworld_toml() -> str:
    text = tiny_rl_toml(label="e2e-multiturn", trainer_mode="lora", iterations=2, max_tokens=8)
    text = text.replace('env_name = "math"', 'env_name = "craftworld"')
    text = text.replace('policy_name = "math-single-step"', 'policy_name = "craftworld-react"')
    text = text.replace('difficulty = "easy"', f"max_steps_per_episode = {TURNS}")
    text = text.replace("max_turns = 1", f"max_turns = {TURNS}")
    text = text.replace("max_model_len = 256", "max_model_len = 2048")
    text = text.replace("max_tokens = 8", 'max_tokens = 8\ntool_choice = "none"')
    return text + (
        'step_rewards_enabled = true\nstep_rewards_mode = "decision_stepwise"\n'
        'step_rewards_strategy = "consistent"\nevent_rewards_kind = "unique"\n'
        # greedy multi-turn episodes on two held-out seeds, before training and after the last iteration
        f"\n[evaluation]\nseeds = {list(EVAL_SEEDS)}\ninstances = {len(EVAL_SEEDS)}\nevery_n_iters = 2\n"
    )


def test_multi_turn_job_runs_end_to_end(tmp_path):
    from posttrain.modelzoo import build_tiny_model

    model_dir = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)
    config = tmp_path / "craftworld.toml"
    config.write_text(_craftworld_toml())
    runs = tmp_path / "runs"
    env = {
        k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG", "POSTTRAIN_TASKAPP")
    }
    result = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(runs), "--type", "rl",
         "--config", str(config), "--model-path", str(model_dir)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=900,
    )  # fmt: skip
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-3000:]
    assert re.search(r"^\s+step 2/2\s+mean_return [0-9.]+", out, re.M), out
    run_dir = Path(re.search(r"run folder (\S+)", out).group(1))
    assert "posttrain craftworld task app" in (run_dir / "logs" / "taskapp.log").read_text()
    metrics = [json.loads(line) for line in next(run_dir.rglob("metrics.jsonl")).read_text().splitlines()]
    iterations = [m for m in metrics if "mean_turns" in m]
    assert len(iterations) == 2, metrics
    assert all(m["mean_turns"] == TURNS for m in iterations), iterations
    assert all(m["decision_rewards_nonzero"] is not None for m in iterations)
    report = [json.loads(line) for line in (run_dir / "report.jsonl").read_text().splitlines()]
    evaluations = [x for x in report if x.get("event") == "evaluation"]
    assert [x["step"] for x in evaluations] == [0, 2], evaluations
    assert all(x["eval_rollouts"] == len(EVAL_SEEDS) and x["eval_failed"] == 0 for x in evaluations), evaluations
    print("multi-turn --local:", [(m["mean_turns"], m["decision_rewards_nonzero"], round(m["iteration_seconds"], 1))
                                  for m in iterations])  # fmt: skip
    # every rollout is in the run's trace store (training and evaluation), with its turns, messages, per-step
    # rewards and policy version, and `posttrain filter` builds SFT JSONL from it
    import sqlite3

    store = run_dir / "work" / "traces.sqlite"
    with sqlite3.connect(store) as db:
        kinds = dict(db.execute("SELECT kind, count(*) FROM session_traces GROUP BY kind"))
        turns = {t for (t,) in db.execute("SELECT turns FROM session_traces WHERE error IS NULL")}
        assert kinds["train"] == sum(m["rollouts"] for m in iterations) and turns == {TURNS}, (kinds, turns)
        assert kinds["eval"] == 2 * len(EVAL_SEEDS), kinds
        assert db.execute(
            "SELECT count(DISTINCT iteration) FROM session_traces WHERE kind = 'train'"
        ).fetchone() == (2,)
        per_episode = db.execute(
            "SELECT min(n), max(n) FROM (SELECT count(*) AS n FROM messages WHERE role = 'assistant' GROUP BY session_id)"
        ).fetchone()
        assert per_episode == (TURNS, TURNS), per_episode
        assert db.execute("SELECT count(*) FROM steps").fetchone()[0] >= TURNS * kinds["train"]
        assert db.execute("SELECT count(*) FROM session_traces WHERE policy_version IS NULL").fetchone() == (
            0,
        )
    sft = tmp_path / "sft.jsonl"
    filtered = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "filter", "--input", str(store), "--min-reward", "0",
         "--output", str(sft)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert filtered.returncode == 0, filtered.stderr
    records = [json.loads(line) for line in sft.read_text().splitlines()]
    assert records and all(r["messages"][-1]["role"] == "assistant" for r in records)
