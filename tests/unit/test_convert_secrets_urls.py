"""`posttrain convert` / `validate` and the tenancy rules: task-app URLs (posttrain.api.urls), a judge's key
only from a Secret the job names, and no literal secret in a TOML. Each refusal is exit 2 with file:line,
the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from posttrain.api.literal_secrets import is_secret_key, literal_secrets
from posttrain.api.resources import TaskApp, parse_spec
from posttrain.cli import main
from pydantic import ValidationError

REPO = Path(__file__).resolve().parents[2]
RL = (REPO / "examples" / "rl_qwen3_4b.toml").read_text()


@pytest.fixture(autouse=True)
def _no_task_url_env(monkeypatch):
    monkeypatch.delenv("TASK_APP_URL", raising=False)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rl.toml"
    path.write_text(text)
    return path


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


@pytest.mark.parametrize(
    "url,why",
    [
        ("http://math-task-app:8000/internal/admin?x=", "has a query"),
        ("http://math-task-app:8000/internal/admin#", "has a fragment"),
        ("http://user:pw@math-task-app:8000", "carries user info"),
        ("file:///etc/passwd", "is not an http or https URL"),
    ],
)
def test_a_bad_task_url_is_refused_by_validate_and_convert_with_its_line(tmp_path, capsys, url, why):
    assert 'task_url = "http://math-task-app:8000"' in RL
    text = RL.replace('task_url = "http://math-task-app:8000"', f'task_url = "{url}"')
    path = _write(tmp_path, text)
    line = _line_of(text, "task_url =")
    for command in (["validate", "--config", str(path)], ["convert", "--config", str(path)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{path}:{line}: services.task_url:" in err and why in err, err
        assert "pw" not in err and "Traceback" not in err


def test_a_bad_task_url_flag_or_env_is_refused_naming_where_it_came_from(tmp_path, capsys, monkeypatch):
    path = _write(tmp_path, RL)
    with pytest.raises(SystemExit) as refused:  # the flag's type refuses it, as argparse does: exit 2
        main(["convert", "--config", str(path), "--task-url", "http://t:1/admin?x=/health"])
    assert refused.value.code == 2
    assert "argument --task-url: has a query" in capsys.readouterr().err
    monkeypatch.setenv("TASK_APP_URL", "http://u:p@t:1")
    assert main(["convert", "--config", str(path)]) == 2
    assert "TASK_APP_URL: the task app URL carries user info" in capsys.readouterr().err
    monkeypatch.setenv("TASK_APP_URL", "http://t:1/apps/math")
    assert main(["convert", "--config", str(path)]) == 0
    assert "url: http://t:1/apps/math" in capsys.readouterr().out


def test_custom_resources_refuse_bad_urls_in_the_model_too():
    with pytest.raises(ValidationError, match="has a query"):
        parse_spec("TaskApp", {"url": "http://t:1/x?y="})
    with pytest.raises(ValidationError, match="user info"):
        TaskApp.model_validate(
            {"metadata": {"name": "a"}, "spec": {"url": "https://a:b@t"}}, context={"cr": True}
        )


JUDGE = """
[judge]
enabled = true
reward_blend = { env = 0.5, outcome = 0.5 }

[judge.options]
provider = "openai"
model = "gpt-4o-mini"
base_url = "https://collector.example/v1"
api_key_env = "S3_SECRET_ACCESS_KEY"
"""


def test_a_judge_at_a_custom_url_needs_a_named_secret(tmp_path, capsys):
    text = RL + JUDGE
    path = _write(tmp_path, text)
    assert main(["convert", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{_line_of(text, '[judge]')}: judge.api_key_secret_ref:" in err
    assert "needs its key from a Secret the job names" in err and "Traceback" not in err
    # validate (which also serves local runs) warns; convert, for a cluster, refuses
    assert main(["validate", "--config", str(path)]) == 0
    assert "posttrain convert refuses it" in capsys.readouterr().err

    named = text + '\n[judge.api_key_secret_ref]\nname = "judge-keys"\nkey = "OPENAI_API_KEY"\n'
    path = _write(tmp_path, named)
    assert main(["convert", "--config", str(path)]) == 0
    captured = capsys.readouterr()
    assert "apiKeySecretRef:\n      name: judge-keys" in captured.out
    assert "api_key_env is read only by `posttrain train --local`" in captured.err


def test_a_judge_base_url_follows_the_url_rules(tmp_path, capsys):
    text = RL + JUDGE.replace("https://collector.example/v1", "https://k:v@collector.example/v1")
    path = _write(tmp_path, text)
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:{_line_of(text, 'base_url')}: judge.options.base_url: the judge's URL carries user info" in err


@pytest.mark.parametrize(
    "snippet,field",
    [
        ('[judge.options]\nprovider = "openai"\nmodel = "m"\napi_key = "sk-live-123"\n', "judge.options.api_key"),
        ('[rollout.env_config]\naccess_token = "ghp_abc"\n', "rollout.env_config.access_token"),
        ('[tags]\ndb_password = "hunter2"\n', "tags.db_password"),
        ('[services]\nauthToken = "t0k3n"\n', "services.authToken"),
        ('[extra]\nclient_secret = "s3cr3t"\n', "extra.client_secret"),
    ],
)
def test_literal_secrets_are_refused_with_file_line_and_the_fix(tmp_path, capsys, snippet, field):
    header, body = snippet.split("\n", 1)
    text = RL.replace(f"{header}\n", f"{header}\n{body}", 1) if f"\n{header}\n" in RL else RL + "\n" + snippet
    path = _write(tmp_path, text)
    key = field.rsplit(".", 1)[1]
    line = _line_of(text, f"{key} =")
    for command in (["validate", "--config", str(path)], ["convert", "--config", str(path)]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert f"{path}:{line}: {field}: a literal secret in the config" in err, err
        assert "Secret" in err and "api_key_env" in err
        assert "sk-live-123" not in err and "hunter2" not in err and "Traceback" not in err


def test_what_is_not_a_literal_secret():
    for key in ("api_key_env", "api_key_secret_ref", "secret_name", "token_file", "max_tokens", "pad_token",
                "eos_token", "tokenizer", "max_new_tokens", "keyword", "monkey"):  # fmt: skip
        assert not is_secret_key(key), key
    for key in ("api_key", "apiKey", "API_KEY", "hf_token", "password", "secret", "private_key", "bearer"):
        assert is_secret_key(key), key
    raw = {"a": {"api_key": "", "token": 3, "x": [{"password": "p"}]}, "b": {"max_tokens": "5"}}
    assert list(literal_secrets(raw)) == ["a.x.password"]
