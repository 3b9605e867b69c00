"""`posttrain train --set KEY=VALUE` (api/overrides.py): one TOML key replaced from the command line and
validated as the field it replaces; a bad value names the flag, not a file line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from posttrain.api import convert
from posttrain.api.overrides import apply_overrides, parse_set
from posttrain.cli import main
from posttrain.errors import UserError

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "craftworld_rl_stepwise.toml"


def test_parse_set_reads_toml_values_or_text():
    assert parse_set("training.iterations_per_epoch=1") == ("training.iterations_per_epoch", 1)
    assert parse_set("policy.temperature = 0.5") == ("policy.temperature", 0.5)
    assert parse_set('rollout.ops=["agent", "env"]') == ("rollout.ops", ["agent", "env"])
    assert parse_set("model.base=Qwen/Qwen3-0.6B") == ("model.base", "Qwen/Qwen3-0.6B")
    assert parse_set('model.base="x=y"') == ("model.base", "x=y")
    for bad in ("training", "=1", "training..x=1", "a b=1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_set(bad)


def test_overrides_replace_and_create_keys_without_touching_the_input():
    raw = {"training": {"iterations_per_epoch": 10}, "rollout": "flat"}
    out = apply_overrides(raw, [("training.iterations_per_epoch", 1), ("evaluation.seeds", [1, 2])])
    assert out == {
        "training": {"iterations_per_epoch": 1},
        "rollout": "flat",
        "evaluation": {"seeds": [1, 2]},
    }
    assert raw["training"]["iterations_per_epoch"] == 10
    with pytest.raises(UserError, match="rollout is not a table"):
        apply_overrides(raw, [("rollout.max_turns", 3)])


def test_set_values_are_validated_like_the_toml_field():
    text = CONFIG.read_text()
    _, base, _ = convert.load(text, file=str(CONFIG))
    _, small, _ = convert.load(text, file=str(CONFIG), overrides=[("training.iterations_per_epoch", 1),
                                                                  ("training.batch_size", 2)])  # fmt: skip
    assert (small.training.iterations_per_epoch, small.training.batch_size) == (1, 2)
    assert base.training.iterations_per_epoch != 1
    with pytest.raises(UserError) as err:
        convert.load(text, file=str(CONFIG), overrides=[("training.iterations_per_epoch", "many")])
    (problem,) = err.value.problems
    assert problem.field == "--set training.iterations_per_epoch" and problem.line is None, problem


def test_train_refuses_a_bad_set_before_starting_anything(tmp_path, capsys):
    code = main(["train", "--local", "--runs-dir", str(tmp_path), "--config", str(CONFIG),
                 "--set", "training.iterations_per_epoch=-3"])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert "--set training.iterations_per_epoch" in err and not any(tmp_path.iterdir())
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--config", str(CONFIG), "--set", "no-equals-sign"])
    assert exit_.value.code == 2
