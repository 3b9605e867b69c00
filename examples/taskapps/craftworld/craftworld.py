"""Craftworld: a small text world of gathering and crafting, costing microseconds per step (pure, no I/O).

The world of a seed is a ring of areas (forest, lake, quarry, mine, cave and plains, in a seeded order) and a
seeded starting area. Actions gather what an area holds and craft from the inventory, in Crafter's chains:
wood -> table -> wood pickaxe -> stone and coal -> stone pickaxe -> iron -> furnace -> iron pickaxe -> diamond.
Every action that succeeds is an achievement event named like Crafter's (collect_wood, place_table,
make_wood_pickaxe, ...): `all` lists the events of a decision, `unique` those the episode had not seen before.
The environment's reward per step is the number of unique achievements it unlocked (Crafter's +1 per first
unlock), so an episode's return is its count of distinct achievements.

Step rewards (`step_rewards`, synth's block): decision_stepwise credit per decision, by strategy
  - "consistent" (also "simple", the default): indicator_lambda when the decision unlocked any new achievement;
  - "per_achievement" (also "complex"): indicator_lambda * sum of weights[name] (default 1.0) over the
    achievements the decision performed, each credited at most k_limits[name] times per episode (default 1;
    k <= 0: unlimited)."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

AREAS = ("forest", "lake", "quarry", "mine", "cave", "plains")
AREA_RESOURCES: dict[str, tuple[str, ...]] = {
    "forest": ("wood", "sapling"),
    "lake": ("drink",),
    "quarry": ("stone", "coal"),
    "mine": ("iron",),
    "cave": ("diamond",),
    "plains": (),
}
# Action list in a fixed order: the observation numbers them, a reply may name or number one.
ACTIONS = (
    "noop",
    "move",
    "collect_wood",
    "collect_sapling",
    "collect_drink",
    "place_table",
    "make_wood_pickaxe",
    "collect_stone",
    "collect_coal",
    "make_stone_pickaxe",
    "collect_iron",
    "place_furnace",
    "make_iron_pickaxe",
    "collect_diamond",
)
# Everything but noop and move is an achievement when it succeeds.
ACHIEVEMENTS = tuple(a for a in ACTIONS if a not in ("noop", "move"))
# Requirements: area to be in, inventory items consumed, tools/stations needed (kept).
RULES: dict[str, dict[str, Any]] = {
    "collect_wood": {"area": "forest", "gain": "wood"},
    "collect_sapling": {"area": "forest", "gain": "sapling"},
    "collect_drink": {"area": "lake", "gain": "drink"},
    "place_table": {"cost": {"wood": 2}, "gain": "table"},
    "make_wood_pickaxe": {"needs": ("table",), "cost": {"wood": 1}, "gain": "wood_pickaxe"},
    "collect_stone": {"area": "quarry", "needs": ("wood_pickaxe",), "gain": "stone"},
    "collect_coal": {"area": "quarry", "needs": ("wood_pickaxe",), "gain": "coal"},
    "make_stone_pickaxe": {"needs": ("table",), "cost": {"wood": 1, "stone": 1}, "gain": "stone_pickaxe"},
    "collect_iron": {"area": "mine", "needs": ("stone_pickaxe",), "gain": "iron"},
    "place_furnace": {"needs": ("table",), "cost": {"stone": 1}, "gain": "furnace"},
    "make_iron_pickaxe": {
        "needs": ("table", "furnace"),
        "cost": {"wood": 1, "coal": 1, "iron": 1},
        "gain": "iron_pickaxe",
    },
    "collect_diamond": {"area": "cave", "needs": ("iron_pickaxe",), "gain": "diamond"},
}
DEFAULT_MAX_STEPS = 10
MAX_STEPS_LIMIT = 200
MAX_ACTIONS_PER_DECISION = 4
STRATEGIES = {
    "consistent": "consistent",
    "simple": "consistent",
    "per_achievement": "per_achievement",
    "per-achievement": "per_achievement",
    "complex": "per_achievement",
}


class WorldError(ValueError):
    """A bad env.config or step_rewards block (the message names the field)."""


@dataclass
class World:
    seed: int
    split: str
    ring: list[str]
    area_index: int
    max_steps: int
    steps: int = 0
    inventory: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)  # achievements unlocked this episode
    counts: dict[str, int] = field(default_factory=dict)  # achievement events this episode

    @property
    def area(self) -> str:
        return self.ring[self.area_index]

    @property
    def done(self) -> bool:
        return "collect_diamond" in self.seen or self.steps >= self.max_steps


def make_world(seed: int, split: str, env_config: dict[str, Any] | None = None) -> World:
    """The world of (seed, split): train and eval seeds draw their rings from different generators."""
    config = dict(env_config or {})
    raw = config.get("max_steps_per_episode", config.get("max_steps", DEFAULT_MAX_STEPS))
    try:
        max_steps = int(raw)
    except (TypeError, ValueError) as exc:
        raise WorldError(f"env.config.max_steps_per_episode must be an integer, got {raw!r}") from exc
    if not 1 <= max_steps <= MAX_STEPS_LIMIT:
        raise WorldError(f"env.config.max_steps_per_episode must be in 1..{MAX_STEPS_LIMIT}, got {max_steps}")
    rng = random.Random(f"craftworld:{split}:{seed}")
    ring = list(AREAS)
    rng.shuffle(ring)
    return World(seed=seed, split=split, ring=ring, area_index=rng.randrange(len(ring)), max_steps=max_steps)


def legal_actions(world: World) -> list[str]:
    """The actions that would succeed now (shown to the policy as a hint)."""
    return [a for a in ACTIONS if a == "move" or (a in RULES and _failure(world, a) is None)]


def _failure(world: World, action: str) -> str | None:
    rule = RULES[action]
    if rule.get("area") and world.area != rule["area"]:
        return f"{action} needs the {rule['area']}; you are in the {world.area}"
    for item in rule.get("needs", ()):
        if world.inventory.get(item, 0) < 1:
            return f"{action} needs a {item}"
    for item, n in rule.get("cost", {}).items():
        if world.inventory.get(item, 0) < n:
            return f"{action} needs {n} {item} (have {world.inventory.get(item, 0)})"
    return None


def apply_action(world: World, action: str) -> dict[str, Any]:
    """One action: {action, ok, message, achievement (or None)}; the world changes in place."""
    if action == "noop":
        return {"action": action, "ok": True, "message": "you wait", "achievement": None}
    if action == "move":
        world.area_index = (world.area_index + 1) % len(world.ring)
        return {"action": action, "ok": True, "message": f"you walk to the {world.area}", "achievement": None}
    if action not in RULES:
        return {"action": action, "ok": False, "message": f"unknown action {action!r}", "achievement": None}
    why = _failure(world, action)
    if why is not None:
        return {"action": action, "ok": False, "message": why, "achievement": None}
    rule = RULES[action]
    for item, n in rule.get("cost", {}).items():
        world.inventory[item] -= n
    gain = rule["gain"]
    world.inventory[gain] = world.inventory.get(gain, 0) + 1
    return {"action": action, "ok": True, "message": f"{action} done", "achievement": action}


def step(world: World, actions: list[str]) -> dict[str, Any]:
    """One decision (up to MAX_ACTIONS_PER_DECISION actions, one world step): the results, the achievement
    events (`all`, in order, repeats kept), the newly unique ones, and the env reward (len(unique))."""
    results, events = [], []
    for action in actions[:MAX_ACTIONS_PER_DECISION] or ["noop"]:
        result = apply_action(world, action)
        results.append(result)
        if result["achievement"]:
            events.append(result["achievement"])
    unique = []
    for name in events:
        world.counts[name] = world.counts.get(name, 0) + 1
        if name not in world.seen:
            world.seen.add(name)
            unique.append(name)
    world.steps += 1
    return {
        "results": results,
        "all": events,
        "unique": unique,
        "reward": float(len(unique)),
        "done": world.done,
    }


def observation_text(world: World, last: dict[str, Any] | None = None) -> str:
    """What the policy reads each turn, compact (a small model reads it): the last result, then the state,
    and last the legal actions (the area and what is possible sit next to the reply)."""
    here = ", ".join(AREA_RESOURCES[world.area]) or "nothing to gather"
    inventory = ", ".join(f"{k} {v}" for k, v in sorted(world.inventory.items()) if v) or "empty"
    lines = []
    if last:
        result = "; ".join(r["message"] for r in last["results"])
        new = f" New: {', '.join(last['unique'])}." if last["unique"] else ""
        lines.append(f"Result: {result}.{new}")
    lines += [
        f"Step {world.steps + 1}/{world.max_steps}. Area: {world.area} ({here}). Inventory: {inventory}. "
        f"Achievements: {', '.join(sorted(world.seen)) or 'none'}.",
        f"Legal actions: {', '.join(legal_actions(world))}.",
    ]
    return "\n".join(lines)


def actions_text() -> str:
    """The numbered action list (a reply may name an action by its number; /task_info shows the list)."""
    return "Actions: " + ", ".join(f"{i} {a}" for i, a in enumerate(ACTIONS)) + "."


def observation_dict(world: World) -> dict[str, Any]:
    return {
        "area": world.area,
        "inventory": {k: v for k, v in sorted(world.inventory.items()) if v},
        "achievements_status": {a: a in world.seen for a in ACHIEVEMENTS},
        "achievements_counts": {a: world.counts.get(a, 0) for a in ACHIEVEMENTS},
        "step": world.steps,
        "max_steps": world.max_steps,
    }


_WORD = re.compile(r"[a-z_]+|\d+")


def action_from_token(value: Any) -> str | None:
    """An action name or its number (int or digit string) -> the action, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return ACTIONS[value] if 0 <= value < len(ACTIONS) else None
    text = str(value).strip().lower().replace(" ", "_").replace("-", "_")
    if text.isdigit():
        return action_from_token(int(text))
    return text if text in ACTIONS else None


def actions_from_text(text: str) -> list[str]:
    """The first action named or numbered in a free-text reply (one), or [] when there is none."""
    for token in _WORD.findall((text or "").lower()):
        action = action_from_token(token)
        if action is not None:
            return [action]
    return []


# ---------------------------------------------------------------------------------------------- step rewards


@dataclass(frozen=True)
class StepRewards:
    enabled: bool = False
    mode: str = "off"
    strategy: str = "consistent"
    indicator_lambda: float = 1.0
    step_beta: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)
    k_limits: dict[str, int] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.enabled and self.mode == "decision_stepwise"

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "strategy": self.strategy,
            "indicator_lambda": self.indicator_lambda,
            "step_beta": self.step_beta,
            **({"weights": dict(self.weights)} if self.weights else {}),
            **({"k_limits": dict(self.k_limits)} if self.k_limits else {}),
        }


def step_rewards_from(policy_config: dict[str, Any], env_config: dict[str, Any]) -> StepRewards:
    """synth's lookup: policy.config.step_rewards first, then env.config.step_rewards."""
    raw = policy_config.get("step_rewards") or env_config.get("step_rewards") or {}
    if not isinstance(raw, dict):
        raise WorldError("step_rewards must be a table")
    mode = str(raw.get("mode") or "off").lower()
    if mode not in ("off", "decision_stepwise", "env_sparse"):
        raise WorldError(f"step_rewards.mode must be off, decision_stepwise or env_sparse, got {mode!r}")
    strategy_raw = str(raw.get("strategy") or "consistent").strip().lower()
    if strategy_raw not in STRATEGIES:
        raise WorldError(f"step_rewards.strategy must be one of {sorted(STRATEGIES)}, got {strategy_raw!r}")
    try:
        lam = raw.get("indicator_lambda")
        indicator_lambda = 1.0 if lam is None else float(lam)
        beta = float(raw.get("step_beta", raw.get("beta")) or 0.0)
        weights = {str(k): float(v) for k, v in dict(raw.get("weights") or {}).items()}
        k_limits = {str(k): int(v) for k, v in dict(raw.get("k_limits") or {}).items()}
    except (TypeError, ValueError) as exc:
        raise WorldError(
            f"step_rewards: indicator_lambda, step_beta, weights, k_limits must be numbers: {exc}"
        ) from exc
    return StepRewards(
        enabled=bool(raw.get("enabled", False)),
        mode=mode,
        strategy=STRATEGIES[strategy_raw],
        indicator_lambda=indicator_lambda,
        step_beta=beta,
        weights=weights,
        k_limits=k_limits,
    )


def stepwise_reward(
    settings: StepRewards, events: list[str], unique: list[str], credited_counts: dict[str, int]
) -> dict[str, Any]:
    """The decision's stepwise credit (info.stepwise) under the strategy; credited_counts is updated."""
    if settings.strategy == "per_achievement":
        base, credited = 0.0, []
        for name in events:
            limit = settings.k_limits.get(name, 1)
            prior = credited_counts.get(name, 0)
            if limit <= 0 or prior < limit:
                base += settings.weights.get(name, 1.0)
                credited_counts[name] = prior + 1
                credited.append(name)
    else:
        base, credited = (1.0 if unique else 0.0), list(unique)
    return {
        "indicator": 1 if unique else 0,
        "base_reward": base,
        "reward": settings.indicator_lambda * base,
        "strategy": settings.strategy,
        "new_achievements": list(unique),
        "credited_achievements": credited,
    }
