"""`validate` applies exactly the trainer's dataset rules (one home: posttrain.api.dataset, imported by
posttrain_trainer.sft_data), to the training and the validation file; local dataset files bound for a
cluster are uploaded (S3 set) or refused with the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posttrain.api.dataset import validate_jsonl
from posttrain.cli import main
from posttrain_trainer.sft_data import DataError, parse_jsonl

REPO = Path(__file__).resolve().parents[2]
USER = {"role": "user", "content": "What is 2 + 3?"}
ASSISTANT = {"role": "assistant", "content": "5"}

ROWS = {
    "good": {"messages": [USER, ASSISTANT]},
    "system, tool call and tool result": {"messages": [
        {"role": "system", "content": "be brief"}, USER,
        {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "add", "arguments": "{}"}}]},
        {"role": "tool", "content": "5"}, ASSISTANT]},
    "no assistant turn": {"messages": [USER, {"role": "user", "content": "well?"}]},
    "human and bot": {"messages": [{"role": "human", "content": "hi"}, {"role": "bot", "content": "yo"}]},
    "one message": {"messages": [USER]},
    "no role": {"messages": [{"content": "x"}, ASSISTANT]},
    "bad content type": {"messages": [{"role": "user", "content": 5}, ASSISTANT]},
    "image without url": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                                       ASSISTANT]},
    "https image": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "https://x/cat.png"}}]}, ASSISTANT]},
    "file:// image": {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}, ASSISTANT]},
    "string part": {"messages": [{"role": "user", "content": ["hello"]}, ASSISTANT]},
    "tool call without a name": {"messages": [USER, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
    "arguments not JSON": {"messages": [USER, {"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "{nope"}}]}]},
    "metadata not an object": {"messages": [USER, ASSISTANT], "metadata": 3},
    "not an object": [1, 2],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROWS))
def test_validate_and_the_trainer_agree_on_every_row(name, tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps({"messages": [USER, ASSISTANT]}) + "\n" + json.dumps(ROWS[name]) + "\n")
    report = validate_jsonl(path)
    try:
        parse_jsonl(path)
        trainer_ok, trainer_error = True, ""
    except DataError as err:
        trainer_ok, trainer_error = False, str(err)
    assert (not report.problems) == trainer_ok, (name, report.problems, trainer_error)
    if not trainer_ok:
        first = report.problems[0]
        assert first.line == 2 and trainer_error.startswith("data.jsonl:2: ")
        assert first.message in trainer_error and (first.fix or "") in trainer_error


def test_human_and_bot_are_refused_with_the_role_meant(tmp_path, capsys):
    path = tmp_path / "hb.jsonl"
    path.write_text(json.dumps(ROWS["human and bot"]) + "\n")
    assert main(["validate", "--dataset", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        f"error: {path}:1: messages[0].role: 'human' is not a chat role" in err[0]
        and 'use "role": "user"' in err[0]
    )
    assert 'use "role": "assistant"' in err[1]
    assert "no assistant message to learn from" in err[2]


def test_validate_checks_the_validation_file_too(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text(json.dumps(ROWS["good"]) + "\n")
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps(ROWS["good"]) + "\n" + json.dumps(ROWS["no assistant turn"]) + "\n")
    config = tmp_path / "sft.toml"
    config.write_text(
        (REPO / "examples" / "demo" / "sft.toml")
        .read_text()
        .replace('data = "examples/demo/sft_warmup.jsonl"', f'data = "{train}"')
        + f'\n[data]\nvalidation_path = "{val}"\n'
    )
    assert main(["validate", "--config", str(config)]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: {val}:2: ") and "no assistant message" in line
    val.write_text(json.dumps(ROWS["good"]) + "\n")
    assert main(["validate", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert f"ok: {train}: 1 examples" in out and f"ok: {val}: 1 examples" in out


def test_convert_refuses_local_dataset_files_without_s3(tmp_path, monkeypatch, capsys):
    for name in ("S3_ENDPOINT", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(REPO)
    assert (
        main(
            [
                "convert",
                "--config",
                "examples/sft_lora.toml",
                "--dataset",
                "examples/datasets/math_chat.jsonl",
            ]
        )
        == 2
    )
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: --dataset: examples/datasets/math_chat.jsonl is a local file")
    assert "set S3_ENDPOINT, S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY to upload it" in line
    # [job].data and [data].validation_path from the TOML: refused at their line
    config = tmp_path / "sft.toml"
    config.write_text((REPO / "examples" / "sft_full.toml").read_text().replace(
        '"s3://posttrain/datasets/math_chat_val.jsonl"', f'"{REPO / "examples/datasets/math_chat_val.jsonl"}"'))  # fmt: skip
    assert main(["convert", "--config", str(config), "--dataset", "s3://b/train.jsonl"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    number = int(line.split(":")[2])
    assert "validation_path" in config.read_text().splitlines()[number - 1]
    assert "data.validation_path: " in line and "is a local file" in line


def test_an_upload_that_fails_names_s3_not_the_api_server(monkeypatch, capsys):
    """S3 unreachable (nothing listens on the port): the one-line error names S3 and its endpoint, and exit 2;
    before, urllib3's error reached the CLI's handler for the Kubernetes API server and blamed it."""
    from posttrain.localhost import free_port

    endpoint = f"127.0.0.1:{free_port()}"
    for key, value in {"S3_ENDPOINT": endpoint, "S3_ACCESS_KEY_ID": "k", "S3_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("S3_SECURE", "false")
    code = main(["convert", "--config", "examples/sft_lora.toml", "--dataset", "examples/datasets/math_chat.jsonl"])
    [line] = capsys.readouterr().err.splitlines()
    assert code == 2, line
    assert f"to S3 at {endpoint} failed" in line and "Kubernetes" not in line, line


def test_convert_uploads_local_dataset_files_to_s3(s3_env, tmp_path, monkeypatch, capsys):
    import yaml

    monkeypatch.setenv("S3_BUCKET", s3_env.bucket)
    config = tmp_path / "sft.toml"
    config.write_text((REPO / "examples" / "sft_full.toml").read_text().replace(
        '"s3://posttrain/datasets/math_chat_val.jsonl"', f'"{REPO / "examples/datasets/math_chat_val.jsonl"}"'))  # fmt: skip
    assert (
        main(
            ["convert", "--config", str(config), "--dataset", str(REPO / "examples/datasets/math_chat.jsonl")]
        )
        == 0
    )
    captured = capsys.readouterr()
    spec = yaml.safe_load(captured.out)["spec"]
    train, val = spec["dataset"]["uri"], spec["validationDataset"]["uri"]
    assert train.startswith(f"s3://{s3_env.bucket}/datasets/") and train.endswith("-math_chat.jsonl")
    assert val.endswith("-math_chat_val.jsonl")
    keys = {
        o.object_name for o in s3_env.client().list_objects(s3_env.bucket, prefix="datasets/", recursive=True)
    }
    assert {train.split("/", 3)[3], val.split("/", 3)[3]} <= keys
    body = s3_env.client().get_object(s3_env.bucket, val.split("/", 3)[3]).read()
    assert body == (REPO / "examples/datasets/math_chat_val.jsonl").read_bytes()
