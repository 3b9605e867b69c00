"""`make demo DEMO_ARGS=--task agent`: the multi-step variant selects its own config (examples/demo/agent.toml,
craftworld with synth's step rewards), which is a valid multi-turn RL config."""

from __future__ import annotations

import sys
import tomllib

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


def test_agent_held_out_seeds_give_no_constant_action_a_pass():
    """As many eval seeds per start area: every constant action (what a greedy policy blind to the observation
    plays) returns 1/6, so a held-out rise is not a constant policy flipping from one action to another."""
    sys.path.insert(0, str(DEMO_DIR.parents[1] / "examples" / "taskapps" / "craftworld"))
    import craftworld as W

    config = tomllib.loads((DEMO_DIR / "agent.toml").read_text())
    seeds, turns = config["evaluation"]["seeds"], config["rollout"]["env_config"]["max_steps_per_episode"]
    assert config["evaluation"]["instances"] == len(seeds) == len(set(seeds))
    areas = [W.make_world(seed, "eval").area for seed in seeds]
    assert all(seed >= 1_000_000 for seed in seeds) and len({areas.count(a) for a in W.AREAS}) == 1

    def constant(action: str) -> float:
        total = 0.0
        for seed in seeds:
            world = W.make_world(seed, "eval", {"max_steps_per_episode": turns})
            total += sum(W.step(world, [action])["reward"] for _ in range(turns))
        return total / len(seeds)

    for action in config["rollout"]["policy_config"]["structured_outputs"]["choice"]:
        assert constant(action) <= 1 / 6 + 1e-9, action
