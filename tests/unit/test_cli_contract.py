"""The CLI never lies: no abbreviated flags anywhere, --version, `--model` overrides the TOML's model as
synth's flag does, numeric flags refuse nonsense, and every refusal is one `error:` line with exit 2 (usage
mistakes, an unreachable API server, unreadable inputs)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest
from posttrain import __version__
from posttrain.cli import build_parser, main
from posttrain.localhost import free_port

REPO = Path(__file__).resolve().parents[2]


def _parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_no_parser_accepts_abbreviated_flags():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) >= 12  # the root and every subcommand
    assert [p.prog for p in parsers if p.allow_abbrev] == []


def test_train_model_is_not_taken_for_model_path(capsys):
    """argparse's prefix matching used to read `--model X` as `--model-path X` (then ignored it on a
    cluster); now --model is its own flag and an abbreviation of another is refused."""
    args = build_parser().parse_args(["train", "--config", "x.toml", "--model", "Qwen/Qwen3-1.7B"])
    assert args.model == "Qwen/Qwen3-1.7B" and args.model_path is None
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["train", "--config", "x.toml", "--model-p", "/m"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and err.startswith("error: posttrain")
        and "unrecognized arguments: --model-p" in err
    )


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"posttrain {__version__}"


@pytest.mark.parametrize(
    "argv",
    [
        ["verify-task-app", "http://127.0.0.1:1", "--timeout", "0"],
        ["verify-task-app", "http://127.0.0.1:1", "--timeout", "inf"],
        ["train", "--config", "x.toml", "--poll-timeout", "-1"],
        ["train", "--config", "x.toml", "--nproc-per-node", "0"],
        ["status", "x", "--interval", "nan"],
        ["filter", "--input", "a.jsonl", "--output", "b.jsonl", "--min-reward", "inf"],
        ["eval", "--task-url", "http://x", "--model", "m", "--concurrency", "0"],
        ["eval", "--task-url", "http://x", "--model", "m", "--seeds", "9-3"],
    ],
)
def test_numeric_flags_refuse_nonsense_as_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: posttrain ") and "(fix: " in err


def test_an_unreachable_api_server_is_one_line_and_exit_2(tmp_path):
    """A kubeconfig pointing at a port nobody listens on: status, train and logs say so in one line."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "http://127.0.0.1:{free_port()}"}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u, namespace: team}}}}]
current-context: x
"""
    )
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    for argv in (["status", "some-job"], ["status", "-A"], ["logs", "some-job"],
                 ["train", "--config", str(REPO / "examples" / "rl_qwen3_4b.toml"), "--task-url", "http://t:1"]):  # fmt: skip
        done = subprocess.run([sys.executable, "-m", "posttrain.cli", *argv, "--runs-dir" if argv[0] != "train" else "--name",
                               str(tmp_path / "runs") if argv[0] != "train" else "x"],
                              capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
        assert "cannot reach the Kubernetes API server at http://127.0.0.1:" in line and "(fix: " in line
