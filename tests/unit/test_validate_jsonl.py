"""SFT JSONL rules of `posttrain validate` (and of `posttrain train`, local or on a cluster, before it
uploads a dataset), each reported with the file and line number."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posttrain.api.dataset import validate_jsonl
from posttrain.cli import main
from posttrain.dataset_upload import check_dataset
from posttrain.errors import UserError

USER = {"role": "user", "content": "What is 2 + 3?"}
ASSISTANT = {"role": "assistant", "content": "5"}


def write(tmp_path: Path, rows: list) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def problems(path: Path, **kw) -> list[tuple[int | None, str]]:
    return [(p.line, p.message) for p in validate_jsonl(path, **kw).problems]


def test_a_good_file_has_no_problems(tmp_path):
    report = validate_jsonl(write(tmp_path, [{"messages": [USER, ASSISTANT]}] * 3))
    assert report.problems == [] and report.examples == 3


def test_fewer_than_two_turns_is_reported_on_its_line(tmp_path):
    path = write(tmp_path, [{"messages": [USER, ASSISTANT]}, {"messages": [USER]}])
    [(line, message)] = problems(path)
    assert line == 2 and "at least 2" in message


def test_invalid_json_and_missing_messages_name_their_lines(tmp_path):
    path = write(tmp_path, ["{not json", {"prompt": "x"}])
    found = problems(path)
    assert [line for line, _ in found] == [1, 2]
    assert "not valid JSON" in found[0][1] and "messages must be a list" in found[1][1]


def test_role_must_be_a_non_empty_string(tmp_path):
    path = write(tmp_path, [{"messages": [{"role": "", "content": "hi"}, ASSISTANT]}])
    assert any(
        p.field == "messages[0].role" and "must be a non-empty string" in p.message
        for p in validate_jsonl(path).problems
    )


def test_image_urls_must_be_https_or_data_urls(tmp_path):
    def image(url: str) -> dict:
        parts = [{"type": "text", "text": "what is this?"}, {"type": "image_url", "image_url": {"url": url}}]
        return {"messages": [{"role": "user", "content": parts}, ASSISTANT]}

    path = write(
        tmp_path,
        [image("https://x/cat.png"), image("data:image/png;base64,AAAA"), image("file:///etc/passwd")],
    )
    found = problems(path)
    assert [line for line, _ in found] == [3]
    assert "https://" in found[0][1]


def test_more_images_than_max_images_per_message_are_trimmed_with_a_warning(tmp_path):
    """The trainer keeps the first max_images_per_message images of a message; validate says so."""
    parts = [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}] * 3
    path = write(tmp_path, [{"messages": [{"role": "user", "content": parts}, ASSISTANT]}])
    assert validate_jsonl(path, max_images_per_message=3).warnings == []
    report = validate_jsonl(path, max_images_per_message=2)
    assert report.problems == []
    [warning] = report.warnings
    assert warning.startswith(f"{path}:1: ") and "keeps the first 2" in warning


def test_an_empty_file_is_an_error(tmp_path):
    [(_, message)] = problems(write(tmp_path, [""]))
    assert "no SFT examples" in message


def test_training_refuses_a_dataset_with_every_problem_on_its_line(tmp_path):
    assert check_dataset(write(tmp_path, [{"messages": [USER, ASSISTANT]}])) == 1
    bad = write(tmp_path, ['{"messages": [{"role": "user"}]}', "not json"])
    with pytest.raises(UserError) as err:
        check_dataset(bad)
    assert [p.line for p in err.value.problems] == [1, 2] and err.value.problems[0].file == str(bad)


def test_cli_validate_exits_2_and_prints_file_line(tmp_path, capsys):
    config = Path(__file__).resolve().parents[2] / "examples" / "sft_lora.toml"
    data = write(tmp_path, [{"messages": [USER, ASSISTANT]}, {"messages": [USER]}])
    assert main(["validate", "--config", str(config), "--dataset", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}:2" in err
