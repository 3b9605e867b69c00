"""`.env` and `--env-file` never change where a key is sent without saying so (posttrain.envfiles
url_notices): a URL taken from the environment is printed with its origin, and the value it beats, before
`train` sends anything; and the literal-secret check knows the providers' usual key names."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from posttrain.api.literal_secrets import is_secret_key, literal_secrets
from posttrain.cli import main
from posttrain.envfiles import load_env_files, url_notices

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "restem_math.toml"


@pytest.fixture(autouse=True)
def _restore_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_a_dot_env_task_url_is_announced_with_its_file_and_the_toml_value_it_beats(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("TASK_APP_URL=http://user:pw@evil.example:9/\nS3_ENDPOINT=http://s3.x:9000\n")
    environ: dict[str, str] = {}
    loaded = load_env_files(None, cwd=tmp_path, environ=environ)
    toml = {"services": {"task_url": "http://good.example:8000"}}
    lines = url_notices(loaded, environ, toml)
    assert lines[0] == f"S3_ENDPOINT http://s3.x:9000 from {tmp_path / '.env'} (S3_ENDPOINT)"
    assert lines[1].startswith(f"task app URL http://evil.example:9/ from {tmp_path / '.env'} (TASK_APP_URL), "
                               "not the TOML's http://good.example:8000")  # fmt: skip
    assert "pw" not in "".join(lines)  # user info is not printed
    # the same from the shell's environment: said too
    loaded = load_env_files(None, cwd=tmp_path / "none", environ={})
    lines = url_notices(loaded, {"TASK_APP_URL": "http://shell:1"}, toml)
    assert len(lines) == 1 and "from the environment (TASK_APP_URL), not the TOML's" in lines[0], lines
    # --task-url given, or an SFT job: TASK_APP_URL is not used, nothing to say
    assert url_notices(loaded, {"TASK_APP_URL": "http://shell:1"}, toml, given={"TASK_APP_URL": "http://cli"}) == []
    assert url_notices(loaded, {"TASK_APP_URL": "http://shell:1"}, toml, unused=frozenset({"TASK_APP_URL"})) == []


def test_train_prints_the_origin_before_it_sends_anything(tmp_path: Path, monkeypatch, capsys) -> None:
    """`posttrain train --local` with a ./.env that names another task app: the line is on stderr before
    the runner (which would send ENVIRONMENT_API_KEY there) starts."""
    import posttrain.local.runner as runner

    order: list[str] = []

    class Result:
        phase, message = "Succeeded", ""

    def fake_run(options):
        order.append("run:" + capsys.readouterr().err)
        return Result()

    monkeypatch.setattr(runner, "run_local", fake_run)
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("TASK_APP_URL=http://elsewhere.example:9\nENVIRONMENT_API_KEY=sk_dotenv_1234567\n")
    assert main(["train", "--config", str(EXAMPLE), "--local"]) == 0
    assert len(order) == 1 and "task app URL http://elsewhere.example:9 from ./.env (TASK_APP_URL)" in order[0], order
    assert "sk_dotenv_1234567" not in order[0]


PROVIDER_NAMES = [
    "OPENAI_KEY", "OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GROQ_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY",
    "HF_TOKEN", "WANDB_API_KEY", "aws_access_key_id", "access_key_id", "secret_access_key",
    "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "my_token", "CLIENT_SECRET", "webhook_secret", "password",
    "db_password", "openaiApiKey", "mistral_key", "api_key", "apiKey",
]  # fmt: skip
NOT_SECRETS = [
    "api_key_env", "api_key_secret_ref", "access_key_id_env", "token_file", "secret_name", "pad_token",
    "eos_token", "max_tokens", "model", "openai_base_url", "key", "password_file",
]  # fmt: skip


@pytest.mark.parametrize("name", PROVIDER_NAMES)
def test_the_providers_usual_names_are_secret(name: str) -> None:
    assert is_secret_key(name)
    assert list(literal_secrets({"judge": {name: "x-literal-value"}})) == [f"judge.{name}"]


@pytest.mark.parametrize("name", NOT_SECRETS)
def test_references_and_text_are_not(name: str) -> None:
    assert not is_secret_key(name)
