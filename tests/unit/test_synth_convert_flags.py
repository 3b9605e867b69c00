"""synth's configs unchanged: `convert --judge-key-secret NAME[:KEY]` names the judge's key
Secret, `convert --set KEY=VALUE` replaces a key validated like `train --set`, and `--allow-experimental` on
convert, validate, train and eval does what SDK_EXPERIMENTAL=1 does. The hosted-judge examples are the
synth-ai 0.2.19 wheel's own files (skipped, saying so, when the wheel is absent)."""

from __future__ import annotations

import argparse
import re

import pytest
import yaml
from posttrain.cli import main
from posttrain.commands import judge_key

from tests.fixtures.synth_wheel import example
from tests.unit.test_set_override import CONFIG

HOSTED_JUDGE = [
    "multi_step/configs/crafter_rl_stepwise_hosted_judge.toml",
    "multi_step/configs/verilog_rl_lora.toml",
]
TASK_URL = "http://127.0.0.1:8101"


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch):
    for name in ("SDK_EXPERIMENTAL", "POSTTRAIN_EXPERIMENTAL", "TASK_APP_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("relative", HOSTED_JUDGE)
def test_hosted_judge_examples_need_the_flag_and_convert_with_it(relative, capsys):
    path = example(relative)
    assert main(["convert", "-c", str(path), "--task-url", TASK_URL]) == 2
    err = capsys.readouterr().err
    assert "judge.api_key_secret_ref" in err and "--judge-key-secret NAME[:KEY]" in err, err

    assert main(["convert", "-c", str(path), "--task-url", TASK_URL, "--judge-key-secret", "judge-key"]) == 0
    spec = yaml.safe_load(capsys.readouterr().out)["spec"]
    assert spec["judge"]["apiKeySecretRef"] == {"name": "judge-key"}, spec["judge"]
    assert "api_key_secret_ref" not in spec["originalToml"]  # the file itself is unchanged

    assert main(["convert", "-c", str(path), "--task-url", TASK_URL,
                 "--judge-key-secret", "judge-key:OPENAI_API_KEY"]) == 0  # fmt: skip
    spec = yaml.safe_load(capsys.readouterr().out)["spec"]
    assert spec["judge"]["apiKeySecretRef"] == {"name": "judge-key", "key": "OPENAI_API_KEY"}


def test_judge_key_secret_is_checked_and_ignored_without_a_judge(capsys, tmp_path):
    assert judge_key.parse("judge-key:OPENAI_API_KEY") == ("judge-key", "OPENAI_API_KEY")
    assert judge_key.parse("judge-key") == ("judge-key", None)
    for bad in ("Judge_Key", "judge-key:bad key", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            judge_key.parse(bad)
    assert judge_key.overrides({"verifier": {"enabled": True}}, ("k", None)) == [
        ("verifier.api_key_secret_ref.name", "k")
    ]
    assert judge_key.overrides({"training": {}}, ("k", "K")) == []

    assert (
        main(["convert", "-c", str(CONFIG), "--task-url", TASK_URL, "--judge-key-secret", "judge-key"]) == 0
    )
    captured = capsys.readouterr()
    assert "--judge-key-secret is ignored: the config has no [judge]" in captured.err
    assert "judge" not in yaml.safe_load(captured.out)["spec"]


def test_convert_set_is_validated_like_train_set(capsys):
    assert (
        main(
            ["convert", "-c", str(CONFIG), "--task-url", TASK_URL, "--set", "training.iterations_per_epoch=1"]
        )
        == 0
    )
    spec = yaml.safe_load(capsys.readouterr().out)["spec"]
    assert spec["training"]["iterationsPerEpoch"] == 1 or spec["training"].get("iterations_per_epoch") == 1, (
        spec["training"]
    )

    assert (
        main(
            [
                "convert",
                "-c",
                str(CONFIG),
                "--task-url",
                TASK_URL,
                "--set",
                "training.iterations_per_epoch=-3",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--set training.iterations_per_epoch" in err and ".toml:" not in err.split("--set")[0], err


@pytest.mark.parametrize("command", ["convert", "validate"])
def test_allow_experimental_does_what_the_variable_does(command, tmp_path, capsys, monkeypatch):
    from posttrain.api.model_ids import SUPPORTED_MODELS

    experimental = sorted(m.id for m in SUPPORTED_MODELS.values() if m.experimental and "rl" in m.modes)
    assert experimental, "no experimental RL model in the allowlist"
    text = re.sub(r"^base = .*$", f'base = "{experimental[0]}"', CONFIG.read_text(), count=1, flags=re.M)
    path = tmp_path / "rl.toml"
    path.write_text(text)
    argv = [command, "-c", str(path)] + (["--task-url", TASK_URL] if command == "convert" else [])
    assert main(argv) == 2
    assert "SDK_EXPERIMENTAL=1" in capsys.readouterr().err
    monkeypatch.setenv("SDK_EXPERIMENTAL", "0")  # the flag wins over a variable that says no
    assert main(argv + ["--allow-experimental"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "eval"])
def test_train_and_eval_take_the_flag(command):
    from posttrain.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    flags = {flag for action in sub._actions for flag in action.option_strings}
    assert "--allow-experimental" in flags
