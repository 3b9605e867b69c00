"""synth's eval TOML: `posttrain eval --config` reads an [eval] table (each key does
what synth's eval does, or validate names it as without effect), flags override it, per-seed and mean
scores (the task app's official, outcome and events scores and each Python judge's) are printed as synth's
CLI prints them, `--sqlite` writes synth's v3 trace database (the task app's own v3 trace where it returns
one) and `posttrain filter --config` reads it back. The task app here is a small HTTP server that records
what it was asked; the real loop with synth's Crafter app is tests/e2e/test_synth_loop.py."""

from __future__ import annotations

import json
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from posttrain.api.eval_config import load_eval_config
from posttrain.cli import main
from posttrain.errors import UserError

from tests.fixtures.synth_wheel import example

KEY = "sk_env_eval_config_test"


def _trace(seed: int) -> dict:
    """A v3 SessionTrace as a synth task app returns it (record.return_trace, trace_format full); odd seeds
    in the shapes synth's Crafter app writes (policy_* message types, the tool calls as the assistant's
    payload, created_at as Python's repr of a datetime)."""
    step = f"turn_{seed}"
    if seed % 2:
        calls = [{"tool_name": "interact", "arguments": {"actions": ["do"]}}]
        return {
            "session_id": f"sess-{seed}", "created_at": "datetime.datetime(2026, 11, 28, 23, 14, 50)",
            "metadata": {"env_name": "crafter"},
            "session_time_steps": [{"step_id": step, "step_index": 0, "turn_number": 0}],
            "event_history": [{"system_instance_id": "env", "time_record": {"event_time": 1.0}, "reward": 1.0,
                               "terminated": True, "metadata": {"step_id": step}}],
            "markov_blanket_message_history": [
                {"message_type": "policy_system_prompt", "metadata": {"step_id": step},
                 "content": {"json_payload": json.dumps({"role": "system", "text": "You play Crafter."})}},
                {"message_type": "policy_user_prompt", "metadata": {"step_id": step},
                 "content": {"json_payload": json.dumps({"role": "user", "text": f"seed {seed}: a tree"})}},
                {"message_type": "policy_tool_call", "metadata": {"step_id": step},
                 "content": {"json_payload": json.dumps(calls)}},
            ],
        }  # fmt: skip
    return {
        "session_id": f"sess-{seed}",
        "created_at": "2025-11-05T10:00:00+00:00",
        "metadata": {"env_name": "crafter", "task_split": "train"},
        "session_time_steps": [{"step_id": step, "step_index": 0, "turn_number": 0}],
        "event_history": [
            {"system_instance_id": "env", "time_record": {"event_time": 1.0}, "reward": float(seed % 2),
             "terminated": True, "truncated": False, "metadata": {"step_id": step}},
        ],  # fmt: skip
        "markov_blanket_message_history": [
            {"message_type": "system", "content": {"text": "You play Crafter."}, "metadata": {"step_id": step}},
            {"message_type": "user", "content": {"json_payload": json.dumps({"role": "user", "content": f"seed {seed}: a tree"})},
             "metadata": {"step_id": step}},
            {"message_type": "assistant", "content": {"json_payload": json.dumps(
                {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                 "function": {"name": "interact", "arguments": "{\"actions\": [\"do\"]}"}}]})},
             "metadata": {"step_id": step}},
        ],  # fmt: skip
    }


class _App(BaseHTTPRequestHandler):
    requests: list[dict] = []

    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.headers.get("X-API-Key") == KEY
        type(self).requests.append(body)
        seed = body["env"]["seed"]
        reward = float(seed % 2)
        response = {
            "run_id": body["run_id"],
            "trajectories": [{"env_id": "e", "policy_id": "p", "length": 1, "inference_url": "x",
                              "steps": [{"obs": {"prompt": f"seed {seed}"}, "tool_calls": [], "reward": reward,
                                         "done": True, "info": {}}]}],  # fmt: skip
            "metrics": {"episode_returns": [reward], "mean_return": reward, "num_steps": 1,
                        "outcome_score": reward, "events_score": 0.25 * seed},  # fmt: skip
            "trace": _trace(seed) if body["record"].get("return_trace") else None,
        }
        data = json.dumps(response).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def task_app():
    _App.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _App)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


JUDGE = '''
def judge(payload, scale=1.0, **kwargs):
    assert payload["trace"]["session_id"] == f"sess-{payload['seed']}"
    if payload["seed"] == 3:
        raise RuntimeError("judge down")
    return scale * (1.0 - payload["metrics"]["outcome_score"])
'''


def _eval_toml(tmp_path: Path, url: str) -> Path:
    (tmp_path / "judges").mkdir()
    (tmp_path / "judges" / "j.py").write_text(JUDGE)
    path = tmp_path / "eval.toml"
    path.write_text(f'''[eval]
app_id = "grpo-crafter-task-app"
task_app_url = "{url}"
model = "Qwen/Qwen3-4B"
seeds = [0, 1, 2, 3]
max_turns = 3
concurrency = 2
env_name = "crafter"
policy_name = "crafter-react"
trace_format = "full"
return_trace = true

[eval.env_config]
env_params = {{max_steps_per_episode = 3}}

[eval.policy_config]
temperature = 0.6
max_tokens = 64

[eval.judge]
path = "judges/j.py"
name = "Inverse"
scale = 2.0
''')
    return path


def test_eval_config_loop_prints_scores_writes_synth_v3_and_filter_reads_it(tmp_path, task_app, capsys, monkeypatch):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    config = _eval_toml(tmp_path, "http://127.0.0.1:9")  # the flag below wins over this dead URL
    db = tmp_path / "traces" / "v3" / "synth_ai.db"
    code = main(["eval", "--config", str(config), "--task-url", task_app, "--inference-url", "http://127.0.0.1:1/v1",
                 "--seeds", "0-3", "--sqlite", str(db), "--no-progress", "--runs-dir", str(tmp_path / "runs")])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, out + err
    # the requests: synth's keys, as synth's eval sends them
    assert sorted(r["env"]["seed"] for r in _App.requests) == [0, 1, 2, 3]
    first = _App.requests[0]
    assert first["ops"] == ["agent", "env"] * 3 and first["mode"] == "eval"
    assert first["record"]["return_trace"] is True and first["record"]["trace_format"] == "full"
    assert first["env"]["env_name"] == "crafter" and first["policy"]["policy_name"] == "crafter-react"
    assert first["env"]["config"]["env_params"] == {"max_steps_per_episode": 3}
    assert first["policy"]["config"]["temperature"] == 0.6 and first["policy"]["config"]["max_tokens"] == 64
    # per seed, then the means, as synth's CLI prints them
    assert "seed=1 status=200 mean_return=1 outcome=1 events=0.25 judge[Inverse]=0.000" in out, out
    assert "seed=3 judge[Inverse]_error=RuntimeError: judge down" in err
    assert "Eval complete: 4 ok, 0 failed; model=Qwen/Qwen3-4B" in out
    assert "Outcome summary: correct=2/4 (50.00%), mean_outcome=0.500" in out
    assert "  Official mean: 0.500" in out and "  Events mean: 0.375" in out
    assert "  [Inverse] mean: 1.333" in out and "Pearson r: -1.000" in out  # seeds 0, 1, 2 scored
    assert "eval.app_id: accepted for synth compatibility but has no effect here" in err
    # synth's v3 database, from the task app's own traces
    with sqlite3.connect(db) as conn:
        sessions = dict(conn.execute("SELECT session_id, metadata FROM session_traces").fetchall())
        assert set(sessions) == {f"sess-{s}" for s in range(4)}
        meta = json.loads(sessions["sess-2"])
        assert meta["judge_scores"] == {"Inverse": 2.0} and meta["env_name"] == "crafter" and meta["seed"] == 2
        assert conn.execute("SELECT COUNT(*) FROM events WHERE event_type = 'environment'").fetchone()[0] == 4
        created = conn.execute("SELECT created_at FROM session_traces WHERE session_id = 'sess-1'").fetchone()[0]
        assert created[:2] == "20" and "T" in created, created  # an ISO time, whatever the task app sent
        assert conn.execute("SELECT message_type FROM messages WHERE session_id = 'sess-1' ORDER BY id").fetchall() == [
            ("system",), ("user",), ("assistant",)]  # fmt: skip
    # filter --config over it: synth's filter TOML, min official score and a judge bound
    (tmp_path / "filter.toml").write_text('[filter]\ndb = "traces/v3/synth_ai.db"\noutput = "ft/sft.jsonl"\n'
                                          "min_official_score = 0.5\n")  # fmt: skip
    assert main(["filter", "--config", str(tmp_path / "filter.toml")]) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "ft" / "sft.jsonl").read_text().splitlines()]
    assert sorted(r["metadata"]["session_id"] for r in records) == ["sess-1", "sess-3"]
    assert [m["role"] for m in records[0]["messages"]] == ["system", "user", "assistant"]
    assert records[0]["messages"][1]["content"].endswith(": a tree")
    assert "interact" in records[0]["messages"][2]["content"]  # the tool call, as synth's filter writes it
    (tmp_path / "filter.toml").write_text('[filter]\ndb = "sqlite:///traces/v3/synth_ai.db"\noutput = "j.jsonl"\n'
                                          "min_official_score = 0.0\nmin_judge_scores = {Inverse = 1.5}\n")  # fmt: skip
    assert main(["filter", "--config", str(tmp_path / "filter.toml")]) == 0
    kept = [json.loads(line)["metadata"]["session_id"] for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert kept == ["sess-0", "sess-2"]


def test_eval_config_errors_name_the_line_and_validate_recognises_it(tmp_path, capsys):
    path = tmp_path / "eval.toml"
    path.write_text('[eval]\nmodel = "m"\nseeds = "9-1"\nconcurrency = 0\ntrace_format = "zip"\n'
                    '[eval.judge]\nname = "nothing"\n')  # fmt: skip
    with pytest.raises(UserError) as err:
        load_eval_config(path.read_text(), str(path))
    shown = [str(p) for p in err.value.problems]
    assert any(s.startswith(f"{path}:3: eval.seeds:") for s in shown), shown
    assert any(s.startswith(f"{path}:4: eval.concurrency:") for s in shown), shown
    assert any(s.startswith(f"{path}:5: eval.trace_format:") for s in shown), shown
    assert main(["validate", "-c", str(path)]) == 2
    assert "eval.seeds" in capsys.readouterr().err
    path.write_text('[eval]\nmodel = "m"\nseeds = [1]\nmetadata_sql = "SELECT 1"\nbogus_key = 1\n'
                    '[eval.judge]\npath = "missing.py"\n')  # fmt: skip
    assert main(["validate", "-c", str(path)]) == 2
    assert "judge file 'missing.py' not found" in capsys.readouterr().err
    path.write_text('[eval]\nmodel = "m"\nseeds = [1]\nmetadata_sql = "SELECT 1"\nbogus_key = 1\n')
    assert main(["validate", "-c", str(path)]) == 0
    err = capsys.readouterr().err
    assert f"{path}:4: eval.metadata_sql: accepted for synth compatibility but has no effect here" in err
    assert f"{path}:5: eval.bogus_key: unknown key" in err
    assert main(["validate", "--strict", "-c", str(path)]) == 2
    assert main(["convert", "-c", str(path)]) == 2
    assert "this is a synth eval config" in capsys.readouterr().err


def test_filter_config_is_checked(tmp_path, capsys):
    path = tmp_path / "filter.toml"
    path.write_text('[filter]\ndb = "libsql://x.turso.io"\noutput = "o.txt"\nshuffle_seed = 3\n')
    assert main(["validate", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: filter.db: a database server is not read here" in err
    assert f"{path}:3: filter.output: output must end in .jsonl or .json" in err
    path.write_text('[filter]\ndb = "t.db"\noutput = "o.jsonl"\noffset = 2\n')
    assert main(["validate", "-c", str(path)]) == 0
    assert f"{path}:4: filter.offset: accepted for synth compatibility but has no effect here" in capsys.readouterr().err


def test_the_wheels_eval_and_filter_examples_validate(capsys):
    eval_toml = example("multi_step/configs/crafter_eval_synth_qwen4b.toml")
    table, warnings = load_eval_config(eval_toml.read_text(), str(eval_toml))
    assert (table.model, table.seeds, table.turns(), table.concurrency) == ("Qwen/Qwen3-4B", [0, 1, 2], 10, 1)
    assert [j.name for j in table.judge_specs()] == ["Backend"] and table.judge_specs()[0].kwargs()["timeout_s"] == 45
    assert any("eval.app_id" in w for w in warnings)
    assert main(["validate", "-c", str(eval_toml)]) == 0
    assert main(["validate", "-c", str(example("task_apps/crafter/filter_sft_dataset.toml"))]) == 0
    assert "valid filter config" in capsys.readouterr().out
