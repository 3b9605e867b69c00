"""`posttrain filter` over a database written by synth's own tracing code: synth-ai
0.2.19's SessionTracer, run from its venv, saves no message rows for a session whose events were written
first (its Crafter app's FILTER_COMMAND_STATUS.md), so the conversation is read from the LM call records of
its cais events; outcome_rewards gives the score, as synth's filter reads it."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from posttrain.cli import main

from tests.fixtures.synth_wheel import venv_python

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "synth_tracer_db.py"


def test_filter_reads_a_database_synths_tracer_wrote(tmp_path, capsys):
    python = venv_python()
    db = tmp_path / "traces" / "v3" / "synth_ai.db"
    db.parent.mkdir(parents=True)
    done = subprocess.run([str(python), str(SCRIPT), str(db)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM session_traces").fetchone()[0] == 2
        assert conn.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0  # synth's own behaviour
    toml = tmp_path / "filter.toml"
    toml.write_text('[filter]\ndb = "traces/v3/synth_ai.db"\noutput = "ft_data/sft.jsonl"\nmin_official_score = 0.01\n')
    assert main(["filter", "--config", str(toml)]) == 0, capsys.readouterr().err
    assert "kept 1 of 2 rollouts" in capsys.readouterr().err
    (record,) = [json.loads(line) for line in (tmp_path / "ft_data" / "sft.jsonl").read_text().splitlines()]
    assert [m["role"] for m in record["messages"]] == ["system", "user", "assistant"]
    assert record["messages"][1]["content"] == "seed 0: a tree"
    assert json.loads(record["messages"][2]["content"])[0]["function"]["name"] == "interact"
    assert record["metadata"]["seed"] == 0 and record["metadata"]["total_reward"] == 1.0
