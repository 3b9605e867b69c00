"""`make demo DEMO_ARGS=--task agent`: the multi-step variant selects its own config (examples/demo/agent.toml,
craftworld with synth's step rewards), which is a valid multi-turn RL config."""

from __future__ import annotations

import pytest
from posttrain.api import convert
from posttrain.local.demo import DEMO_DIR, parse_args


def test_task_selects_the_config_and_threshold():
    math, agent = parse_args([]), parse_args(["--task", "agent"])
    assert (math.config, math.min_accuracy) == (DEMO_DIR / "rl.toml", 0.8)
    assert (agent.config, agent.min_accuracy) == (DEMO_DIR / "agent.toml", 0.0)
    assert "craftworld" in agent.title
    mine = parse_args(["--task", "agent", "--config", "x.toml", "--min-accuracy", "0.5"])
    assert (str(mine.config), mine.min_accuracy) == ("x.toml", 0.5)
    with pytest.raises(SystemExit):
        parse_args(["--task", "agent", "--sft-warmup"])


def test_agent_config_is_multi_turn_with_step_rewards():
    path = DEMO_DIR / "agent.toml"
    kind, config, warnings = convert.load(path.read_text(), file=str(path))
    assert kind == "rl" and not warnings
    assert config.rollout.env_name == "craftworld" and config.rollout.max_turns > 1
    assert config.training.step_rewards_enabled and config.training.step_rewards_mode == "decision_stepwise"
