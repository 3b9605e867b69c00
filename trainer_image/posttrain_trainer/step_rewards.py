"""Step and event rewards as synth's multi-step configs use them (pure functions, no I/O).

Settings: `[training]` step_rewards_enabled / _mode / _strategy / _indicator_lambda / _beta / _weights /
_k_limits and event_rewards_kind (the flat form), or the same keys under `[training.rewards]` (the nested
form, which wins where both are given), resolved once into the job file's settings
(posttrain.api.rollout_settings.StepRewardSettings: `job.settings.rollout.step_rewards`).

1. The request: when step_rewards_enabled is set, the block {enabled, mode, strategy, indicator_lambda,
   step_beta, weights, k_limits} goes to the task app as `env.config.step_rewards`, where synth's backend puts
   it and synth's Crafter app reads it (keys the TOML sets in `[rollout.env_config.step_rewards]` win).
2. Decision rewards: a task app in decision_stepwise mode returns per step `info.meta.decision_rewards`
   {turn, ach_delta, unique_delta, all, unique}. The trainer's reward for decision t is
     - event_rewards_kind "unique" (default) counts the achievements new to the episode (`unique`), "absolute"
       every achievement event of the decision (`all`);
     - strategy "consistent" (default; "simple"): indicator_lambda * 1[count > 0];
       "per_achievement" ("complex"): indicator_lambda * sum of weights[name] (default 1) over those
       achievements, each credited at most k_limits[name] times per episode (default 1; k <= 0 unlimited).
3. Credit: the decision's return-to-go G_t = sum of d_t' for t' >= t; within a group (the rollouts of one
   seed) the G_t of each turn are standardised over the rollouts that reached it, (G_t - mean_t) /
   (std_t + eps), and that credit is added to
   the episode's group advantage on the tokens the policy sampled at decision t (rl.py trains those
   per-token advantages with GSPO-token). step_rewards_beta is forwarded to the task app as step_beta
   (synth's Crafter app reserves it; it changes no credit here)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from posttrain.api.rollout_settings import (  # noqa: F401 - re-exported
    EVENT_KINDS,
    STEP_REWARD_STRATEGIES,
    StepRewardSettings,
    with_step_rewards,
)

# The settings are resolved once into the job file (posttrain.api.rollout_settings), re-exported here.
STRATEGIES = STEP_REWARD_STRATEGIES
EPS = 1e-6


def decision_meta(response: dict[str, Any]) -> list[dict[str, Any] | None]:
    """Each step's info.meta.decision_rewards (None where a step has none), over the first trajectory."""
    trajectories = response.get("trajectories") or []
    if not trajectories or not isinstance(trajectories[0], dict):
        return []
    out: list[dict[str, Any] | None] = []
    for step in trajectories[0].get("steps") or []:
        info = step.get("info") if isinstance(step, dict) else None
        meta = info.get("meta") if isinstance(info, dict) else None
        block = meta.get("decision_rewards") if isinstance(meta, dict) else None
        out.append(block if isinstance(block, dict) else None)
    return out


def _names(block: dict[str, Any], kind: str) -> tuple[list[str], int]:
    """The achievements a decision counts under `kind`, and their number (a count alone when no list)."""
    names = block.get("unique" if kind == "unique" else "all")
    count_key = "unique_delta" if kind == "unique" else "ach_delta"
    names = [str(n) for n in names] if isinstance(names, list) else []
    try:
        count = int(block.get(count_key) or len(names))
    except (TypeError, ValueError):
        count = len(names)
    return names, max(count, len(names), 0)


def decision_rewards(blocks: Sequence[dict[str, Any] | None], settings: StepRewardSettings) -> list[float]:
    """Per-decision rewards d_t (module docstring, 2.); a step without a block gets 0."""
    credited: dict[str, int] = {}
    out = []
    for block in blocks:
        if not block:
            out.append(0.0)
            continue
        names, count = _names(block, settings.event_kind)
        if settings.strategy == "per_achievement":
            base = 0.0
            for name in names:
                limit = settings.k_limits.get(name, 1)
                if limit <= 0 or credited.get(name, 0) < limit:
                    base += settings.weights.get(name, 1.0)
                    credited[name] = credited.get(name, 0) + 1
            base += float(max(0, count - len(names)))  # counted but unnamed events: weight 1, no cap
        else:
            base = 1.0 if count > 0 else 0.0
        value = settings.indicator_lambda * base
        out.append(value if math.isfinite(value) else 0.0)
    return out


def returns_to_go(rewards: Sequence[float]) -> list[float]:
    out, total = [], 0.0
    for r in reversed(list(rewards)):
        total += float(r)
        out.append(total)
    return out[::-1]


def group_decision_credit(per_rollout: Sequence[Sequence[float]]) -> list[list[float]]:
    """Returns-to-go of every decision of a group's rollouts -> credits, each standardised against the same
    decision (turn) of the group's other rollouts; zero where that turn's returns-to-go are all equal or only
    one rollout reached it.

    Per turn, not over all decisions at once: a first decision's return-to-go holds the whole episode and a
    last one's almost nothing, so pooling them credits every first decision and blames every last one
    whatever it chose, even in a group whose rollouts all did the same."""
    credits = [[0.0] * len(r) for r in per_rollout]
    for turn in range(max((len(r) for r in per_rollout), default=0)):
        reached = [i for i, r in enumerate(per_rollout) if len(r) > turn]
        values = [float(per_rollout[i][turn]) for i in reached]
        if len(values) < 2:
            continue
        mean = sum(values) / len(values)
        std = math.sqrt(sum((g - mean) ** 2 for g in values) / len(values))
        if std < EPS:
            continue
        for i, g in zip(reached, values, strict=True):
            credits[i][turn] = (g - mean) / (std + EPS)
    return credits


def token_advantages(advantage: float, credits: Sequence[float], call_of_token: Sequence[int]) -> list[float]:
    """Per completion token: the episode's advantage plus the credit of the decision (policy call) that
    sampled it; call_of_token[i] is that call's index in the episode (-1 for tokens the policy did not
    sample: they carry no loss and get the episode's advantage). A call past the decisions gets no credit."""
    return [advantage + (credits[c] if 0 <= c < len(credits) else 0.0) for c in call_of_token]
