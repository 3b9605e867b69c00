"""`posttrain eval`'s pure parts: seeds, pass@k, the summary, trace rows from a task app's response (and
their SQLite copy), the Kubernetes Job it renders and how a Job's status reads."""

from __future__ import annotations

import json
import sqlite3

import pytest
from posttrain.api.restem import FilterSpec, filter_rollouts
from posttrain.evaluation.cluster import eval_job_name, job_phase, render_eval_job
from posttrain.evaluation.summary import format_table, parse_seeds, pass_at_k, summarize
from posttrain.evaluation.traces import TraceWriter, error_row, rows_from_response


def test_parse_seeds():
    assert parse_seeds("0-3,7, 2") == [0, 1, 2, 3, 7]
    assert parse_seeds("1000000-1000001") == [1000000, 1000001]
    for bad in ("", "a", "5-2", "-1", "0-2000000"):
        with pytest.raises(ValueError):
            parse_seeds(bad)


def test_format_seeds_is_the_inverse_of_parse_seeds():
    from posttrain.evaluation.summary import format_seeds

    for text in ("0-99", "1,3,5-7,100", "1000000-1000127"):
        assert format_seeds(parse_seeds(text)) == text


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)


# A rollout response as the math task app writes it (policy.config n = 2: two trajectories).
RESPONSE = {
    "run_id": "eval-1",
    "trajectories": [
        {"steps": [{"obs": {"question": "What is 2 + 3?", "messages": [{"role": "user", "content": "What is 2 + 3?"}]},
                    "tool_calls": [{"tool": "submit_answer", "args": {"answer": "5"}}], "reward": 1.0, "done": True,
                    "info": {"correct": True, "response": "5", "expected": 5}}]},
        {"steps": [{"obs": {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}, "reward": 0.0,
                    "info": {"correct": False, "response": "six"}}]},
    ],
    "metrics": {"episode_returns": [1.0, 0.0], "mean_return": 0.5, "num_steps": 2,
                "details": {"pass_at_k": {"1": 0.5, "2": 1.0}}},
}  # fmt: skip


def test_trace_rows_carry_prompt_completion_reward_and_steps():
    rows = rows_from_response(RESPONSE, seed=1000003, split="eval", model="m")
    assert [(r["prompt"], r["completion"], r["reward"], r["sample"]) for r in rows] == [
        ("What is 2 + 3?", "5", 1.0, 0), ("What is 2 + 3?", "six", 0.0, 1)]  # fmt: skip
    assert rows[0]["steps"][0]["info"]["expected"] == 5
    assert rows[0]["messages"] == [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
    ]
    assert rows[0]["metadata"]["task_split"] == "eval" and rows[0]["metadata"]["seed"] == 1000003
    # the rows are what `posttrain filter` reads: eval -> filter -> SFT
    records, stats = filter_rollouts(list(enumerate(rows, 1)), FilterSpec(min_reward=1.0))
    assert stats.kept_rows == 1 and records[0]["messages"][-1] == {"role": "assistant", "content": "5"}


def test_summary_estimates_pass_at_k_from_samples_or_takes_the_task_apps():
    rows = []
    for seed, rewards in ((1, [1, 0, 0, 0]), (2, [0, 0, 0, 0]), (3, [1, 1, 1, 1])):
        for sample, reward in enumerate(rewards):
            rows.append(
                {"seed": seed, "sample": sample, "reward": float(reward), "metadata": {"task_split": "eval"}}
            )
    rows.append(error_row(seed=4, split="eval", model="m", sample=0, error="HTTP 502"))
    summary = summarize(rows, model="m")
    assert (summary.episodes, summary.errors, summary.seeds) == (12, 1, 3)
    assert summary.mean_reward == pytest.approx(5 / 12) and summary.success_rate == pytest.approx(5 / 12)
    assert summary.pass_at[1] == pytest.approx((0.25 + 0 + 1) / 3)
    assert summary.pass_at[4] == pytest.approx(2 / 3)
    assert "estimated from 4+ samples" in summary.pass_at_source
    reported = summarize(rows_from_response(RESPONSE, seed=1, split="eval", model="m"), model="m")
    assert reported.pass_at == {1: 0.5, 2: 1.0} and reported.pass_at_source == "reported by the task app"
    single = summarize([{"seed": 1, "reward": 1.0}, {"seed": 2, "reward": 0.0}], model="m")
    assert single.pass_at == {}  # one sample per seed and nothing reported: no pass@k claimed
    table = format_table([summary]).splitlines()
    assert table[0].split() == ["MODEL", "SEEDS", "EPISODES", "ERRORS", "MEAN", "REWARD", "SUCCESS", "PASS@1",
                                "PASS@2", "PASS@4", "TIME"]  # fmt: skip


def test_trace_writer_writes_jsonl_and_a_synth_v3_database(tmp_path):
    from posttrain.api import synth_traces

    rows = rows_from_response(RESPONSE, seed=7, split="eval", model="m")
    with TraceWriter(tmp_path / "t.jsonl", tmp_path / "t.db", env_name="math", policy_name="p") as writer:
        for row in rows:
            writer.write(row)
    assert [json.loads(line)["completion"] for line in (tmp_path / "t.jsonl").read_text().splitlines()] == [
        "5",
        "six",
    ]
    with sqlite3.connect(tmp_path / "t.db") as db:
        assert synth_traces.is_synth_store(db)
        sessions = db.execute("SELECT session_id, num_messages, metadata FROM session_traces ORDER BY rowid").fetchall()
        rewards = db.execute("SELECT session_id, total_reward FROM outcome_rewards ORDER BY id").fetchall()
        kinds = db.execute("SELECT message_type FROM messages WHERE session_id = ? ORDER BY id", (sessions[0][0],)).fetchall()
    metas = [json.loads(m) for _, _, m in sessions]
    assert [(m["seed"], m["task_split"], m["env_name"], m["policy_name"], m["completion"]) for m in metas] == [
        (7, "eval", "math", "p", "5"), (7, "eval", "math", "p", "six")]  # fmt: skip
    assert [r for _, r in rewards] == [1.0, 0.0] and [s for s, _ in rewards] == [s for s, _, _ in sessions]
    assert [k for (k,) in kinds][-2:] == ["user", "assistant"] and sessions[0][1] == len(kinds)
    read = [row for _, row in synth_traces.read_sessions(tmp_path / "t.db")]
    assert [(r["reward"], r["messages"][-1]) for r in read] == [
        (1.0, {"role": "assistant", "content": "5"}), (0.0, {"role": "assistant", "content": "six"})]  # fmt: skip


def test_the_eval_job_is_locked_down_and_labelled():
    job = render_eval_job(name="eval-x", namespace="ns", image="img", eval_args=["--model", "m"],
                          results="s3://b/evals/ns/eval-x/", api_key_secret="key", s3_endpoint="http://s3:9000",
                          s3_secret="s3", gpus=2)  # fmt: skip
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert job["metadata"]["labels"]["posttrain.dev/job"] == "eval-x"
    assert job["spec"]["template"]["metadata"]["labels"]["posttrain.dev/role"] == "eval"
    assert container["command"][:4] == ["posttrain", "eval", "--model", "m"]
    assert (
        "--results-uri" in container["command"] and container["resources"]["limits"]["nvidia.com/gpu"] == "2"
    )
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    key = next(e for e in container["env"] if e["name"] == "ENVIRONMENT_API_KEY")
    assert key["valueFrom"]["secretKeyRef"]["name"] == "key" and "value" not in key  # never inlined
    assert job["spec"]["backoffLimit"] == 0
    assert eval_job_name("rl:Qwen/Qwen3-4B:ns.x.1234abcd", "http://t", [1, 2]) == eval_job_name(
        "rl:Qwen/Qwen3-4B:ns.x.1234abcd", "http://t", [1, 2]).lower()  # fmt: skip
    assert len(eval_job_name("a" * 100, "t", [1])) <= 63


def test_job_phase():
    assert job_phase(None)[0] == "Pending"
    assert job_phase({"status": {"active": 1}})[0] == "Running"
    assert job_phase({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})[0] == "Succeeded"
    failed = job_phase(
        {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}}
    )
    assert failed == ("Failed", "BackoffLimitExceeded")


def test_sampling_settings_precedence():
    """--temperature wins over --policy-config, which wins over the default (greedy; 1.0 with --samples)."""
    from posttrain.cli import build_parser
    from posttrain.commands.eval import policy_config

    def config(*flags: str) -> dict:
        return policy_config(build_parser().parse_args(["eval", "--task-url", "http://t", "--model", "m", *flags]))

    assert config()["temperature"] == 0.0 and config("--samples", "4")["temperature"] == 1.0
    assert config("--policy-config", '{"n": 3, "temperature": 0.7}') == {"n": 3, "temperature": 0.7}
    assert config("--policy-config", '{"temperature": 0.7}', "--temperature", "0.2")["temperature"] == 0.2
    assert config("--max-tokens", "8")["max_tokens"] == 8


def test_summary_shows_the_task_apps_rubric_scores():
    rows = [
        {"seed": 1, "reward": 2.0, "metrics": {"outcome_score": 0.25, "events_score": 0.5}},
        {"seed": 2, "reward": 0.0, "metrics": {"outcome_score": 0.0, "events_score": None}},
        {"seed": 3, "reward": 1.0, "metrics": {}},
    ]
    summary = summarize(rows, model="m")
    assert summary.outcome_score == pytest.approx(0.125) and summary.events_score == pytest.approx(0.5)
    table = format_table([summary]).splitlines()
    assert (
        table[0].split()[-3:] == ["OUTCOME", "EVENTS", "TIME"] and "0.125" in table[1] and "0.500" in table[1]
    )
    plain = summarize([{"seed": 1, "reward": 1.0}], model="m")
    assert "OUTCOME" not in format_table([plain])  # a task app without rubric scores: no empty columns
