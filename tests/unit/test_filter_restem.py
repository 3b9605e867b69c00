"""ReST-EM filter: pure logic (posttrain.api.restem) and the `posttrain filter` command."""

from __future__ import annotations

import json

import pytest
from posttrain.api.restem import NO_RESPONSE, FilterSpec, filter_rollouts, row_reward, to_sft_records
from posttrain.cli import main

IMG = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}


def _row(reward, **meta):
    return {
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"},
        ],
        "reward": reward,
        "metadata": meta,
    }


ROWS = [
    _row(1.0, task_split="train", model="m1", judge_scores={"outcome": 0.9}, seed=1),
    _row(0.0, task_split="train", model="m1", seed=2),
    _row(1.0, task_split="test", model="m2", judge_scores={"outcome": 0.2}, seed=3),
    {"prompt": "2+2?", "completion": "4", "metadata": {"total_reward": 1.0, "seed": 4}},
    {"messages": [{"role": "user", "content": "no reward"}, {"role": "assistant", "content": "x"}]},
]


def _run(spec):
    return filter_rollouts(list(enumerate(ROWS, start=1)), spec)


def test_reward_threshold_default_one():
    records, stats = _run(FilterSpec())
    assert stats.rows == 5 and stats.kept_rows == 3  # the row without a reward fails the min threshold
    assert [r["metadata"]["seed"] for r in records] == [1, 3, 4]
    assert records[2]["messages"] == [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert records[0]["metadata"]["total_reward"] == 1.0


def test_synth_filters():
    assert [r["metadata"]["seed"] for r in _run(FilterSpec(splits=["train"]))[0]] == [1]
    assert [r["metadata"]["seed"] for r in _run(FilterSpec(models=["m2"]))[0]] == [3]
    assert [r["metadata"]["seed"] for r in _run(FilterSpec(min_judge_scores={"outcome": 0.5}))[0]] == [1]
    assert [r["metadata"]["seed"] for r in _run(FilterSpec(min_reward=None, max_reward=0.5))[0]] == [2]
    assert len(_run(FilterSpec(min_reward=None))[0]) == 5
    assert len(_run(FilterSpec(limit=2))[0]) == 2
    with pytest.raises(ValueError, match="limit"):
        _run(FilterSpec(limit=0))


def test_one_record_per_user_turn_with_tool_calls_and_images():
    row = {
        "reward": 1,
        "messages": [
            {"role": "system", "content": "sys"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, IMG]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "act", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "ok"},
            {"role": "user", "content": "next"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "done"},
        ],
    }
    records = to_sft_records(row, 1)
    assert len(records) == 3
    first = records[0]["messages"]
    assert first[0] == {"role": "system", "content": "sys"} and first[1]["content"][1] == IMG  # images kept
    assert json.loads(first[2]["content"])[0]["function"]["name"] == "act"  # tool-call payload preferred
    assert records[1]["messages"][-1] == {"role": "assistant", "content": NO_RESPONSE}
    assert records[2]["messages"][-1] == {"role": "assistant", "content": "done"}
    whole = to_sft_records(row, 1, per_turn=False)
    assert len(whole) == 1 and len(whole[0]["messages"]) == 7


def test_reward_sources():
    assert row_reward({"metrics": {"mean_return": 0.5}}) == 0.5
    assert row_reward({"total_reward": 2}) == 2.0 and row_reward({"reward": True}) == 1.0
    assert row_reward({"metadata": {}}) is None


def test_cli_filter(tmp_path, capsys):
    src = tmp_path / "rollouts.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = tmp_path / "sft.jsonl"
    assert main(["filter", "--input", str(src), "--output", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 3 and all(line["messages"][-1]["role"] == "assistant" for line in lines)
    assert "kept 3 of 5" in capsys.readouterr().err
    # the output is valid SFT data for the trainer
    from posttrain_trainer.sft_data import parse_jsonl

    assert len(parse_jsonl(out)) == 3


def test_cli_errors_are_one_line(tmp_path, capsys):
    src = tmp_path / "rollouts.jsonl"
    src.write_text(json.dumps(ROWS[0]) + "\nnot json\n")
    assert main(["filter", "--input", str(src), "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert f"{src}:2: not valid JSON" in err and "Traceback" not in err
    src.write_text(json.dumps(ROWS[1]) + "\n")
    assert main(["filter", "-i", str(src), "-o", str(tmp_path / "o.jsonl")]) == 2
    assert "no rollout matched" in capsys.readouterr().err and not (tmp_path / "o.jsonl").exists()
    assert main(["filter", "-i", str(src), "-o", str(tmp_path / "o.txt")]) == 2
    assert ".jsonl or .json" in capsys.readouterr().err


def test_cli_synth_toml(tmp_path):
    src = tmp_path / "rollouts.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    toml = tmp_path / "filter.toml"
    toml.write_text(
        '[filter]\ninput = "rollouts.jsonl"\noutput = "out.jsonl"\nmin_official_score = 1.0\n'
        'splits = ["train"]\n'
    )
    assert main(["filter", "--config", str(toml)]) == 0
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
    toml.write_text('[filter]\ndb = "sqlite+aiosqlite:///traces.db"\noutput = "out.jsonl"\n')
    assert main(["filter", "--config", str(toml)]) == 2
