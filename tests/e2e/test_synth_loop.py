"""A synth user's whole loop with synth's own files: synth's Crafter task app (synth-ai 0.2.19
wheel, real crafter) served with its tracing on (TASKAPP_TRACING_ENABLED=1, SYNTH_TRACES_DB: the app's own
synth_ai.db, written by synth's tracing_v3) -> `posttrain eval --config` with the wheel's
crafter_eval_synth_qwen4b.toml unchanged (flags: the local task app, weights served here, fewer seeds and
turns; its Python judge, synth's crafter_backend_judge.py, runs per rollout: with no synth backend here it
scores 0.0, as it does under synth's CLI) -> `posttrain filter --config` with the wheel's
filter_sft_dataset.toml (its db and output overridden by --input / --output) over the app's synth_ai.db and
over the database `eval --sqlite` wrote -> `posttrain train --local --type sft` with the wheel's
crafter_lora_qwen0p6b.toml (scaled down with --set) on the result, its model id Qwen/Qwen3-0.6B downloaded
from a Hugging Face Hub served on 127.0.0.1 (holding the tiny model) into a fresh HF cache.

The policy is the tiny model warmed up on "do" actions (test_synth_crafter.warm_up_on_do), so that some
episodes unlock an achievement and pass the filter's min_official_score."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures.synth_crafter import APP_ENV, KEY, synth_crafter_python, wheel_file  # noqa: F401
from posttrain.local.processes import ProcessSet, wait_http
from posttrain.localhost import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
EVAL = "examples/multi_step/configs/crafter_eval_synth_qwen4b.toml"
FILTER = "examples/task_apps/crafter/filter_sft_dataset.toml"
SFT = "examples/sft/configs/crafter_lora_qwen0p6b.toml"
SEEDS = "0-5"
TURNS = 5
SFT_SCALE_DOWN = ["algorithm.variety=\"lora\"", "training.use_qlora=false", "training.validation.enabled=false",
                  "hyperparameters.per_device_batch=1", "hyperparameters.gradient_accumulation_steps=1",
                  "hyperparameters.learning_rate=1e-4", "hyperparameters.sequence_length=8192",
                  "hyperparameters.parallelism.bf16=false",
                  "hyperparameters.parallelism.use_deepspeed=false",
                  "hyperparameters.parallelism.activation_checkpointing=false"]  # fmt: skip


def _cli(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=timeout)  # fmt: skip
    print(f"posttrain {argv[0]}: rc {done.returncode} in {time.monotonic() - started:.0f} s")
    return done


def test_synth_eval_filter_sft_loop(synth_crafter_python, tmp_path):  # noqa: F811
    from posttrain.modelzoo import build_tiny_model

    from tests.e2e.test_synth_crafter import warm_up_on_do
    from tests.fixtures.hub_server import serve_hub

    tiny = build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32-16k", hidden_size=128, max_positions=16384)
    policy = warm_up_on_do(tiny)
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    app_db = app_dir / "traces" / "v3" / "synth_ai.db"
    app_db.parent.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENVIRONMENT_API_KEY", "TASK_APP", "HF_"))}
    env |= {"ENVIRONMENT_API_KEY": KEY}
    app_env = env | APP_ENV | {"TASKAPP_TRACING_ENABLED": "1", "SYNTH_TRACES_DB": f"sqlite+aiosqlite:///{app_db}"}
    port = free_port()
    with ProcessSet() as procs:
        proc = procs.start(
            "synth-crafter",
            [str(synth_crafter_python), str(REPO / "examples" / "taskapps" / "synth_crafter" / "serve.py"),
             "--host", "127.0.0.1", "--port", str(port)],
            tmp_path / "synth-crafter.log", env=app_env, cwd=app_dir,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", timeout=600, proc=proc, headers={"X-API-Key": KEY})
        httpx.get(f"{url}/task_info", headers={"X-API-Key": KEY}, timeout=120)

        # 1. eval: the wheel's eval TOML unchanged, overridden by flags
        eval_db = tmp_path / "eval" / "synth_ai.db"
        result = _cli(["eval", "--config", str(wheel_file(synth_crafter_python, EVAL)), "--task-url", url,
                       "--model-path", str(policy), "--seeds", SEEDS, "--max-turns", str(TURNS),
                       "--max-model-len", "16384", "--sqlite", str(eval_db), "--no-progress",
                       "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env, timeout=1500)  # fmt: skip
        out = result.stdout
        assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
        seeds = list(range(6))
        for seed in seeds:  # synth's judge catches its own failure and scores 0.0
            assert re.search(rf"^seed={seed} status=200 mean_return=\S+ .*judge\[Backend\]=0.000$", out, re.M), out[-3000:]
        assert "[crafter_backend_judge] Unexpected error" in out, out[-3000:]
        assert "Eval complete: 6 ok, 0 failed; model=Qwen/Qwen3-4B" in out and "  Official mean: " in out
        assert "  [Backend] mean: 0.000" in out

    # 2. the two databases: the app's own (synth's tracing_v3) and eval's (ours, synth's schema)
    with sqlite3.connect(app_db) as db:
        app_sessions = db.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0]
        app_rewards = [r for (r,) in db.execute("SELECT total_reward FROM outcome_rewards")]
    with sqlite3.connect(eval_db) as db:
        eval_meta = [json.loads(m) for (m,) in db.execute("SELECT metadata FROM session_traces")]
        eval_messages = db.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
    assert app_sessions >= 6 and len(eval_meta) == 6, (app_sessions, len(eval_meta))
    assert sorted(m["seed"] for m in eval_meta) == seeds and all(m["env_name"] == "crafter" for m in eval_meta)
    assert eval_messages > 0
    print(f"app outcome rewards {app_rewards}; eval official scores {[m['official_score'] for m in eval_meta]}")

    # 3. filter: synth's filter TOML over each database
    filter_toml = wheel_file(synth_crafter_python, FILTER)
    datasets = {}
    for name, db_path in (("app", app_db), ("eval", eval_db)):
        out_path = tmp_path / "ft_data" / f"{name}.jsonl"
        result = _cli(["filter", "--config", str(filter_toml), "--input", str(db_path), "--output", str(out_path)],
                      cwd=tmp_path, env=env, timeout=300)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        records = [json.loads(line) for line in out_path.read_text().splitlines()]
        assert records and all(r["messages"][-1]["role"] == "assistant" for r in records), records[:1]
        assert all(r["metadata"]["total_reward"] >= 0.01 for r in records)
        answers = [str(r["messages"][-1]["content"]) for r in records]
        assert all(a != "[no response recorded]" for a in answers) and any("interact" in a for a in answers), answers[:3]
        datasets[name] = out_path
        print(f"filter over the {name} database: {result.stderr.strip().splitlines()[-1]}")

    # 4. SFT on eval's filtered rollouts, its base model from a Hub on loopback
    with serve_hub({"Qwen/Qwen3-0.6B": tiny}) as (endpoint, hub_log):
        sft_env = env | {"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf")}
        argv = ["train", "--local", "--type", "sft", "--config", str(wheel_file(synth_crafter_python, SFT)),
                "--dataset", str(datasets["eval"]), "--runs-dir", str(tmp_path / "runs"), "--name", "synth-loop-sft"]
        for item in SFT_SCALE_DOWN:
            argv += ["--set", item]
        result = _cli(argv, cwd=tmp_path, env=sft_env, timeout=1200)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-3000:]
    assert any(line.startswith("GET /api/models/Qwen/Qwen3-0.6B/") for line in hub_log), hub_log
    assert (tmp_path / "hf" / "hub" / "models--Qwen--Qwen3-0.6B").is_dir()
    assert re.search(r"^fine_tuned_model: \w+:Qwen/Qwen3-0\.6B:", result.stdout, re.M), result.stdout[-2000:]
