"""Step and event rewards as synth's multi-step configs use them (pure functions, no I/O).

Settings: `[training]` step_rewards_enabled / _mode / _strategy / _indicator_lambda / _beta / _weights /
_k_limits and event_rewards_kind (the flat form), or the same keys under `[training.rewards]` (the nested
form, which wins where both are given).

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
from dataclasses import dataclass, field
from typing import Any

STRATEGIES = {
    "consistent": "consistent",
    "simple": "consistent",
    "per_achievement": "per_achievement",
    "per-achievement": "per_achievement",
    "complex": "per_achievement",
}
EVENT_KINDS = ("unique", "absolute")
EPS = 1e-6


@dataclass(frozen=True)
class StepRewardSettings:
    enabled: bool | None = None  # None: the TOML did not say (nothing is sent)
    mode: str = "off"
    strategy: str = "consistent"
    indicator_lambda: float = 1.0
    beta: float = 0.0
    weights: dict[str, float] = field(default_factory=dict)
    k_limits: dict[str, int] = field(default_factory=dict)
    event_kind: str = "unique"

    @property
    def active(self) -> bool:
        """Decision rewards become per-decision credit."""
        return bool(self.enabled) and self.mode == "decision_stepwise"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> StepRewardSettings:
        training = config.get("training") if isinstance(config.get("training"), dict) else {}
        nested = training.get("rewards") if isinstance(training.get("rewards"), dict) else {}

        def pick(key: str) -> Any:
            return nested[key] if nested.get(key) is not None else training.get(key)

        strategy = str(pick("step_rewards_strategy") or "consistent").strip().lower()
        if strategy not in STRATEGIES:
            raise ValueError(
                f"training.step_rewards_strategy = {strategy!r}: use one of {', '.join(sorted(STRATEGIES))}"
            )
        kind = str(pick("event_rewards_kind") or "unique")
        if kind not in EVENT_KINDS:
            raise ValueError(f"training.event_rewards_kind = {kind!r}: use unique or absolute")
        lam = pick("step_rewards_indicator_lambda")
        enabled = pick("step_rewards_enabled")
        return cls(
            enabled=None if enabled is None else bool(enabled),
            mode=str(pick("step_rewards_mode") or ("decision_stepwise" if enabled else "off")),
            strategy=STRATEGIES[strategy],
            indicator_lambda=1.0 if lam is None else float(lam),
            beta=float(pick("step_rewards_beta") or 0.0),
            weights={str(k): float(v) for k, v in dict(pick("step_rewards_weights") or {}).items()},
            k_limits={str(k): int(v) for k, v in dict(pick("step_rewards_k_limits") or {}).items()},
            event_kind=kind,
        )

    def request_block(self) -> dict[str, Any] | None:
        """The `step_rewards` block for env.config, or None when the TOML does not configure step rewards."""
        if self.enabled is None:
            return None
        block: dict[str, Any] = {
            "enabled": bool(self.enabled),
            "mode": self.mode,
            "strategy": self.strategy,
            "indicator_lambda": self.indicator_lambda,
            "step_beta": self.beta,
            "event_rewards_kind": self.event_kind,
        }
        if self.weights:
            block["weights"] = dict(self.weights)
        if self.k_limits:
            block["k_limits"] = dict(self.k_limits)
        return block


def with_step_rewards(env_config: dict[str, Any], settings: StepRewardSettings) -> dict[str, Any]:
    """env.config with the step_rewards block added (the TOML's own env_config.step_rewards keys win)."""
    block = settings.request_block()
    if block is None:
        return dict(env_config)
    own = env_config.get("step_rewards") if isinstance(env_config.get("step_rewards"), dict) else {}
    return {**env_config, "step_rewards": {**block, **own}}


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
