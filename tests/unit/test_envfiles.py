"""Env files for `train` and `eval` (posttrain.envfiles): --env-file repeatable with the later file winning
and overriding the environment, ./.env loaded by default filling only what the environment lacks, values
never printed. The cluster path (the key becomes a Secret, never part of the RLJob) is in
tests/integration/test_cli_cluster.py."""

from __future__ import annotations

import argparse

import pytest
from posttrain.cli import main
from posttrain.envfiles import load_env_files
from posttrain.errors import UserError


@pytest.fixture(autouse=True)
def _restore_environ():
    """The commands load env files into os.environ: put it back as it was after each test."""
    import os

    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


SECRET_A = "sk_env_first_file_value_123"
SECRET_B = "sk_env_second_file_value_456"


def test_later_file_wins_and_overrides_the_environment(tmp_path):
    a, b = tmp_path / "a.env", tmp_path / "b.env"
    a.write_text(f"ENVIRONMENT_API_KEY={SECRET_A}\nONLY_A=1\n# comment\nexport QUOTED='x y'\n")
    b.write_text(f'ENVIRONMENT_API_KEY="{SECRET_B}"\nEMPTY\n')
    environ = {"ENVIRONMENT_API_KEY": "from-shell", "OTHER": "kept"}
    loaded = load_env_files([a, b], cwd=tmp_path, environ=environ)
    assert environ == {"ENVIRONMENT_API_KEY": SECRET_B, "OTHER": "kept", "ONLY_A": "1", "QUOTED": "x y"}
    assert loaded.files == [a, b] and sorted(loaded.applied) == ["ENVIRONMENT_API_KEY", "ONLY_A", "QUOTED"]
    assert SECRET_A not in loaded.summary() and SECRET_B not in loaded.summary()


def test_default_dot_env_fills_only_gaps(tmp_path):
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={SECRET_A}\nTASK_APP_URL=http://127.0.0.1:9\n")
    environ = {"TASK_APP_URL": "http://from-shell:1"}
    loaded = load_env_files(None, cwd=tmp_path, environ=environ)
    assert environ == {"TASK_APP_URL": "http://from-shell:1", "ENVIRONMENT_API_KEY": SECRET_A}
    assert loaded.files == [tmp_path / ".env"]
    # --env-file given: ./.env is not read
    other = tmp_path / "other.env"
    other.write_text("X=1\n")
    environ = {}
    load_env_files([other], cwd=tmp_path, environ=environ)
    assert environ == {"X": "1"}
    assert load_env_files(None, cwd=tmp_path / "nowhere", environ={}).files == []


def test_missing_env_file_names_the_flag(tmp_path):
    with pytest.raises(UserError) as err:
        load_env_files([tmp_path / "absent.env"], environ={})
    assert "--env-file" in str(err.value)


def test_train_local_sees_the_env_files_and_prints_no_value(tmp_path, monkeypatch, capsys):
    """`posttrain train --local --env-file a --env-file b`: the runner starts with b's key in the environment."""
    import posttrain.local.runner as runner

    seen: dict[str, str | None] = {}

    class Result:
        phase, message = "Succeeded", ""

    def fake_run(options):  # the runner is tested elsewhere: here only what it is handed
        import os

        seen["key"] = os.environ.get("ENVIRONMENT_API_KEY")
        seen["url"] = os.environ.get("TASK_APP_URL")
        return Result()

    monkeypatch.setattr(runner, "run_local", fake_run)
    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.setenv("TASK_APP_URL", "http://shell:1")
    monkeypatch.chdir(tmp_path)
    a, b = tmp_path / "a.env", tmp_path / "b.env"
    a.write_text(f"ENVIRONMENT_API_KEY={SECRET_A}\nTASK_APP_URL=http://127.0.0.1:8100\n")
    b.write_text(f"ENVIRONMENT_API_KEY={SECRET_B}\n")
    from pathlib import Path

    config = Path(__file__).resolve().parents[2] / "examples" / "restem_math.toml"
    code = main(["train", "--config", str(config), "--local", "--env-file", str(a), "--env-file", str(b)])
    out = capsys.readouterr()
    assert code == 0 and seen == {"key": SECRET_B, "url": "http://127.0.0.1:8100"}
    assert SECRET_A not in out.out + out.err and SECRET_B not in out.out + out.err


def test_eval_reads_the_default_dot_env(tmp_path, monkeypatch):
    from posttrain.commands.eval import task_and_key

    monkeypatch.delenv("ENVIRONMENT_API_KEY", raising=False)
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text(f"ENVIRONMENT_API_KEY={SECRET_A}\nTASK_APP_URL=http://127.0.0.1:8100\n")
    args = argparse.Namespace(env_file=None, api_key_env="ENVIRONMENT_API_KEY", task_url=None, task_app=None)
    assert task_and_key(args) == ("http://127.0.0.1:8100", SECRET_A)
    later = tmp_path / "later.env"
    later.write_text("TASK_APP_URL=http://127.0.0.1:8200\n")
    args.env_file = [later]
    assert task_and_key(args) == ("http://127.0.0.1:8200", SECRET_A)
