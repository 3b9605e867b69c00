"""`posttrain eval` against the real math task app and a real vLLM rollout server (the tiny model): traces
(JSONL and SQLite) with prompt, completion, reward and per-step info, the summary table with pass@k (from
several samples per seed, or as the task app reports it), the key from --env-file, failed rollouts counted,
and the model served by eval itself."""

from __future__ import annotations

import json
import sqlite3

import pytest
from posttrain.cli import main

pytestmark = [pytest.mark.vllm]

SEEDS = "1000000-1000005"


@pytest.fixture
def env_file(math_taskapp, tmp_path, monkeypatch):
    # set, then deleted: monkeypatch records them, so what `eval --env-file` puts into this process's
    # environment is taken away after the test (it would name a task app for every later test)
    for name in ("ENVIRONMENT_API_KEY", "TASK_APP_URL"):
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    path = tmp_path / "task.env"
    path.write_text(
        f"# the math app\nexport ENVIRONMENT_API_KEY='{math_taskapp.api_key}'\nTASK_APP_URL={math_taskapp.url}\n"
    )
    return path


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_eval_with_samples_writes_traces_and_pass_at_k(env_file, policy_server, tmp_path, capsys):
    out, db = tmp_path / "traces.jsonl", tmp_path / "traces.db"
    code = main(["eval", "--env-file", str(env_file), "--inference-url", policy_server.url,
                 "--model", policy_server.served_model_name, "--env-name", "math", "--seeds", SEEDS,
                 "--split", "eval", "--samples", "2", "--max-tokens", "8", "--concurrency", "4",
                 "--output", str(out), "--sqlite", str(db)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    rows = _rows(out)
    assert len(rows) == 12 and {r["seed"] for r in rows} == set(range(1000000, 1000006))
    for row in rows:
        assert row["prompt"].startswith("What is ") and isinstance(row["completion"], str)
        assert row["reward"] in (0.0, 1.0) and row["metadata"]["task_split"] == "eval"
        assert row["steps"][0]["info"]["expected"] is not None  # per-step info from the task app
        assert row["messages"][-1] == {"role": "assistant", "content": row["completion"]}
    with sqlite3.connect(db) as con:  # synth's v3 trace database: a session per rollout, its seed in metadata
        sessions = con.execute("SELECT metadata FROM session_traces").fetchall()
        rewarded = con.execute("SELECT COUNT(DISTINCT session_id) FROM outcome_rewards").fetchone()[0]
    seeds = [json.loads(meta)["seed"] for (meta,) in sessions]
    assert len(seeds) == 12 and set(seeds) == set(range(1000000, 1000006)) and rewarded == 12
    table = captured.out.splitlines()
    header = next(line for line in table if line.startswith("MODEL"))
    assert "PASS@1" in header and "PASS@2" in header
    assert "pass@k estimated from 2+ samples per seed" in captured.out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (
        summary["episodes"] == 12
        and summary["errors"] == 0
        and set(summary["pass_at"]) == {"pass@1", "pass@2"}
    )
    assert "eval posttrain/tiny-random-qwen2" in captured.err and "12/12" in captured.err  # the progress bar


def test_pass_at_k_reported_by_the_task_app(env_file, policy_server, tmp_path, capsys):
    out = tmp_path / "t.jsonl"
    code = main(["eval", "--env-file", str(env_file), "--inference-url", policy_server.url,
                 "--model", policy_server.served_model_name, "--env-name", "math", "--seeds", "1000000-1000003",
                 "--policy-config", '{"n": 3, "temperature": 1.0}', "--max-tokens", "8", "--output", str(out),
                 "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    assert len(_rows(out)) == 12  # 3 answers per rollout, one row each
    assert "pass@k reported by the task app" in captured.out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["pass_at"]) == {"pass@1", "pass@3"}


def test_a_wrong_key_fails_every_rollout_and_exits_1(
    math_taskapp, policy_server, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", "sk_env_wrong")
    out = tmp_path / "t.jsonl"
    code = main(["eval", "--task-url", math_taskapp.url, "--inference-url", policy_server.url, "--model", "m",
                 "--seeds", "0-2", "--output", str(out), "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 1
    rows = _rows(out)
    assert len(rows) == 3 and all(r["reward"] is None and "HTTP 400" in r["error"] for r in rows)
    assert "sk_env_wrong" not in out.read_text() + captured.out + captured.err  # the key is never echoed


def test_eval_refuses_without_a_key_or_a_task_app(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    assert main(["eval", "--model", "m", "--inference-url", "http://127.0.0.1:1"]) == 2
    assert "error: --task-url: no task app" in capsys.readouterr().err
    assert main(["eval", "--model", "m", "--task-url", "http://127.0.0.1:1"]) == 2
    assert "error: --api-key-env: no task app key: $ENVIRONMENT_API_KEY is not set" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # the flag's type refuses it, as argparse does
        main(["eval", "--model", "m", "--task-url", "not-a-url"])
    assert refused.value.code == 2
    assert "argument --task-url: is not an http or https URL" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_serves_a_local_model_folder_itself(env_file, vllm_model_dir, tmp_path, capsys):
    """No --inference-url: eval starts the rollout server on the folder's weights and stops it after."""
    out = tmp_path / "t.jsonl"
    code = main(["eval", "--env-file", str(env_file), "--model", str(vllm_model_dir), "--env-name", "math",
                 "--seeds", "1000000-1000003", "--max-tokens", "8", "--max-model-len", "512", "--output", str(out),
                 "--runs-dir", str(tmp_path / "runs"), "--no-progress"])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert f"serving {vllm_model_dir} from {vllm_model_dir}" in captured.err
    assert len(_rows(out)) == 4 and all(r["metadata"]["model"] == str(vllm_model_dir) for r in _rows(out))
    pids = json.loads(next((tmp_path / "runs" / "evals").glob("*/pids.json")).read_text())
    import os

    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
