"""The RL job's trace store (posttrain.api.traces), the captures' trace text (posttrain_rollout.captures)
and `posttrain filter` reading a store."""

from __future__ import annotations

import json
import sqlite3

from posttrain.api import traces
from posttrain.cli import main
from posttrain_rollout.captures import MAX_TRACE_CHARS, entries_from_response, trace_messages
from posttrain_trainer.rollouts import EpisodeSequence, RolloutResult, RolloutSpec

SYSTEM = {"role": "system", "content": "You play craftworld."}


def _capture(messages, reply, version=0):
    return {"messages": messages, "reply": reply, "weight_version": version,
            "prompt_token_ids": [1] * 10, "completion_token_ids": [2] * 3}  # fmt: skip


def _episode_captures():
    user1 = {"role": "user", "content": "You see a tree."}
    call1 = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"name": "act", "arguments": '{"action":"chop"}'}],
    }
    tool1 = {"role": "tool", "content": "wood +1"}
    user2 = {"role": "user", "content": "You have wood."}
    return [
        _capture([SYSTEM, user1], call1, version=3),
        _capture(
            [SYSTEM, user1, call1, tool1, user2], {"role": "assistant", "content": "place table"}, version=3
        ),
    ]


def _result(cid, reward, *, ok=True, captures=None, seed=7, index=0, decisions=(0.0, 1.0)):
    spec = RolloutSpec(seed=seed, group=0, index=index, cid=cid, endpoint="http://x")
    result = RolloutResult(spec=spec, ok=ok, reward=reward, env_return=reward, outcome_score=0.5,
                           error=None if ok else "RuntimeError: boom", turns=2,
                           decision_rewards=list(decisions))  # fmt: skip
    result.sequences = [EpisodeSequence(prompt_ids=[1], completion_ids=[2, 3, 4], completion_mask=[1, 0, 1])]
    captures = _episode_captures() if captures is None else captures
    response = {"trajectories": [{"steps": [
        {"reward": 0.0, "done": False, "tool_calls": [{"tool": "act", "args": {"action": "chop"}}],
         "info": {"meta": {"decision_rewards": {"unique": []}}}},
        {"reward": 1.0, "done": True, "info": {"achievements": ["collect_wood"]}},
    ]}], "metrics": {"details": {"achievements": ["collect_wood"]}}}  # fmt: skip
    result.trace = {
        "steps": traces.trajectory_steps(response, result.decision_rewards),
        "achievements_count": traces.achievements_count(response),
        "messages": traces.conversation(captures),
        "weight_versions": [c["weight_version"] for c in captures],
        "episode_tokens": 13,
    }
    return result


def test_conversation_keeps_each_message_once_with_its_turn():
    messages = traces.conversation(_episode_captures())
    assert [(m["role"], m["turn"]) for m in messages] == [
        ("system", 0), ("user", 0), ("assistant", 0), ("tool", 1), ("user", 1), ("assistant", 1),
    ]  # fmt: skip
    assert messages[2]["tool_calls"] == [{"name": "act", "arguments": '{"action":"chop"}'}]
    # a rewritten history (shorter request) is stored whole
    rewritten = [_capture([SYSTEM, {"role": "user", "content": "a"}], {"content": "b"}),
                 _capture([{"role": "user", "content": "c"}], {"content": "d"})]  # fmt: skip
    assert [m["content"] for m in traces.conversation(rewritten)] == [
        "You play craftworld.",
        "a",
        "b",
        "c",
        "d",
    ]


def test_hostile_sizes_are_capped():
    huge = "x" * (10 * traces.MAX_FIELD_CHARS)
    kept = traces.conversation([_capture([{"role": "user", "content": huge}], {"content": huge})])
    assert all(len(m["content"]) == traces.MAX_FIELD_CHARS + len(traces.TRUNCATION_MARK) for m in kept)
    response = {"trajectories": [{"steps": [{"reward": 1, "info": huge}] * (traces.MAX_STEPS + 50)}]}
    steps = traces.trajectory_steps(response, [])
    assert len(steps) == traces.MAX_STEPS and steps[0]["info"].endswith(traces.TRUNCATION_MARK)
    assert traces.trajectory_steps({"trajectories": "nope"}, []) == []
    assert (
        traces.trajectory_steps({"trajectories": [{"steps": [{"reward": float("nan")}]}]}, [])[0]["reward"]
        is None
    )
    # the rollout server keeps bounded text only: no image bytes, cut content, at most MAX_TRACE_MESSAGES
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    many = [SYSTEM] + [{"role": "user", "content": [{"type": "text", "text": huge}, image]}] * 500
    bounded = trace_messages(many)
    assert bounded[0] == SYSTEM and len(bounded) == 64
    assert len(bounded[1]["content"]) < MAX_TRACE_CHARS + 20 and "base64" not in json.dumps(bounded)
    body = {
        "choices": [{"index": 0, "message": {"content": "hi"}, "token_ids": [5], "prompt_token_ids": [1]}]
    }
    (entry,) = entries_from_response(body, chat=True, weight_version=2, request_messages=[SYSTEM])
    assert entry["messages"] == [SYSTEM] and entry["reply"] == {"role": "assistant", "content": "hi"}


def test_store_round_trip_synth_tables(tmp_path):
    path = tmp_path / traces.FILE_NAME
    with traces.TraceStore(path) as store:
        rows = [
            traces.episode_row(_result("run-it0-s7-r0", 1.0), job="ns/j", kind="train", iteration=0, model="m"),
            traces.episode_row(_result("run-it0-s7-r1", 0.0, index=1), job="ns/j", kind="train", iteration=0,
                               model="m"),
            traces.episode_row(_result("run-it0-s7-r2", 0.0, ok=False, index=2), job="ns/j", kind="train",
                               iteration=0, model="m"),
        ]  # fmt: skip
        assert store.add(rows) == 3
        assert store.add(rows[:1]) == 1  # a redone iteration replaces, never duplicates
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT count(*) FROM session_traces").fetchone() == (3,)
        assert db.execute(
            "SELECT policy_version, turns, sampled_tokens, episode_tokens, kind, error IS NULL FROM session_traces "
            "WHERE session_id = 'run-it0-s7-r0'"
        ).fetchone() == ("3", 2, 2, 13, "train", 1)
        assert db.execute("SELECT total_reward, achievements_count FROM outcome_rewards ORDER BY session_id").fetchall() == [
            (1.0, 1), (0.0, 1)]  # fmt: skip
        assert db.execute("SELECT count(*) FROM messages WHERE session_id = 'run-it0-s7-r0'").fetchone() == (
            6,
        )
        types = [
            t for (t,) in db.execute("SELECT message_type FROM messages WHERE session_id = 'run-it0-s7-r0'")
        ]
        assert types == ["policy_system_prompt", "policy_user_prompt", "policy_tool_call", "policy_tool_result",
                         "policy_user_prompt", "assistant"]  # fmt: skip
        steps = db.execute(
            "SELECT step, reward, decision_reward, done FROM steps WHERE session_id = 'run-it0-s7-r0'"
        )
        assert steps.fetchall() == [(0, 0.0, 0.0, 0), (1, 1.0, 1.0, 1)]
        meta = json.loads(db.execute("SELECT metadata FROM session_traces LIMIT 1").fetchone()[0])
        assert meta["judge_scores"] == {"outcome": 0.5} and meta["decision_rewards"] == [0.0, 1.0]
    sessions = list(traces.read_sessions(path))
    assert [s["metadata"]["session_id"] for _, s in sessions] == [
        "run-it0-s7-r1",
        "run-it0-s7-r0",
    ]  # no failed
    assert traces.is_trace_store(path) and not traces.is_trace_store(tmp_path / "missing")


def _store(tmp_path):
    path = tmp_path / "work" / traces.FILE_NAME
    with traces.TraceStore(path) as store:
        store.add(
            traces.episode_row(_result(f"run-it0-s{seed}-r0", float(seed % 2), seed=seed), job="ns/j",
                               kind="train", iteration=0, model="m")
            for seed in range(6)
        )  # fmt: skip
    return path


def test_filter_reads_a_store_by_score(tmp_path, capsys):
    path = _store(tmp_path)
    out = tmp_path / "sft.jsonl"
    assert main(["filter", "--input", str(path), "--min-reward", "1", "--output", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    # 3 episodes with reward 1, two user turns each: one record per user turn, the history before it kept
    assert len(records) == 6 and {r["metadata"]["total_reward"] for r in records} == {1.0}
    first, second = records[0]["messages"], records[1]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert json.loads(first[-1]["content"]) == [{"name": "act", "arguments": '{"action":"chop"}'}]
    assert [m["role"] for m in second][-3:] == ["tool", "user", "assistant"] and second[-1][
        "content"
    ] == "place table"
    assert (
        main(["filter", "--input", str(path), "--min-reward", "1", "--limit", "2", "--output", str(out)]) == 0
    )
    assert len(out.read_text().splitlines()) == 2
    # synth's TOML: db as a sqlite URL relative to the TOML, limit, min_official_score
    toml = tmp_path / "filter.toml"
    toml.write_text('[filter]\ndb = "sqlite:///work/traces.sqlite"\noutput = "toml.jsonl"\n'
                    "min_official_score = 0.5\nlimit = 3\n")  # fmt: skip
    assert main(["filter", "--config", str(toml)]) == 0
    assert len((tmp_path / "toml.jsonl").read_text().splitlines()) == 3
    assert main(["filter", "--input", str(path), "--min-reward", "5", "--output", str(out)]) == 2
    assert "no rollout matched" in capsys.readouterr().err


def test_filter_refuses_a_foreign_sqlite_file(tmp_path, capsys):
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE t (x)")
    assert main(["filter", "--input", str(other), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "not a posttrain trace store" in capsys.readouterr().err
