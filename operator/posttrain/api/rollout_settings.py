"""What an online trainer (GSPO, DAPO, ReST-EM) sends to the task app, resolved once from the config into the
trainer's settings (posttrain.api.settings: `settings.rollout`): the /rollout request's env and policy parts,
the sampling config, the step-reward block, the concurrency, the timeout and the error budget. The trainer
(posttrain_trainer.rollouts.build_rollout_request) builds each request from these fields only.

The task app's own tables, [rollout.env_config] and [rollout.policy_config], are forwarded verbatim (synth
passes unknown keys through): they are the `env_config` / `policy_config` fields here, merged with what
posttrain adds (the step_rewards block; [policy]'s sampling defaults and max_turns).

Step rewards (synth's multi-step configs): `[training]` step_rewards_enabled / _mode / _strategy /
_indicator_lambda / _beta / _weights / _k_limits and event_rewards_kind (the flat form), or the same keys
under `[training.rewards]` (the nested form, which wins where both are given). When step_rewards_enabled is
set, the block {enabled, mode, strategy, indicator_lambda, step_beta, weights, k_limits} goes to the task app
as `env.config.step_rewards` (keys the TOML sets in `[rollout.env_config.step_rewards]` win);
posttrain_trainer.step_rewards turns the decision rewards the task app returns into per-decision credit."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from posttrain.api.fields import Count, EventRewardsKind, Fraction, Seconds, Text

# strategy spellings -> the strategy (validate refuses any other: posttrain.api.config)
STEP_REWARD_STRATEGIES = {
    "consistent": "consistent",
    "simple": "consistent",
    "per_achievement": "per_achievement",
    "per-achievement": "per_achievement",
    "complex": "per_achievement",
}
EVENT_KINDS = ("unique", "absolute")
DEFAULT_ERROR_BUDGET = 0.25
DEFAULT_TIMEOUT_S = 600.0
DEFAULT_CONCURRENCY = 8
# [policy] keys sent as the task app's sampling config (rollout.policy_config wins over each)
POLICY_SAMPLING_KEYS = ("temperature", "top_p", "max_tokens", "thinking_mode", "thinking_budget", "top_k")


def _table(config: dict[str, Any], *path: str) -> dict[str, Any]:
    value: Any = config
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


class StepRewardSettings(BaseModel):
    """Step and event rewards (posttrain_trainer.step_rewards)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    enabled: bool | None = Field(None, description="None: the TOML did not say (nothing is sent).")
    mode: str = Field("off", description="off, decision_stepwise or env_sparse.")
    strategy: str = Field("consistent", description="consistent or per_achievement.")
    indicator_lambda: float = Field(1.0, allow_inf_nan=False, description="Reward per decision with events.")
    beta: float = Field(0.0, allow_inf_nan=False, description="step_rewards_beta, forwarded as step_beta.")
    weights: dict[str, float] = Field(default_factory=dict, description="Per-achievement weights.")
    k_limits: dict[str, int] = Field(default_factory=dict, description="Per-achievement credit caps.")
    event_kind: EventRewardsKind = Field("unique", description="unique or absolute.")

    @property
    def active(self) -> bool:
        """Decision rewards become per-decision credit."""
        return bool(self.enabled) and self.mode == "decision_stepwise"

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> StepRewardSettings:
        """The step-reward settings of a normalised config ([training.rewards] wins over the flat keys)."""
        training = _table(config, "training")
        nested = _table(training, "rewards")

        def pick(key: str) -> Any:
            return nested[key] if nested.get(key) is not None else training.get(key)

        strategy = str(pick("step_rewards_strategy") or "consistent").strip().lower()
        if strategy not in STEP_REWARD_STRATEGIES:
            raise ValueError(f"training.step_rewards_strategy = {strategy!r}: use one of "
                             f"{', '.join(sorted(STEP_REWARD_STRATEGIES))}")  # fmt: skip
        kind = str(pick("event_rewards_kind") or "unique")
        if kind not in EVENT_KINDS:
            raise ValueError(f"training.event_rewards_kind = {kind!r}: use unique or absolute")
        lam = pick("step_rewards_indicator_lambda")
        enabled = pick("step_rewards_enabled")
        return cls(
            enabled=None if enabled is None else bool(enabled),
            mode=str(pick("step_rewards_mode") or ("decision_stepwise" if enabled else "off")),
            strategy=STEP_REWARD_STRATEGIES[strategy],
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


def _concurrency(config: dict[str, Any]) -> int:
    """min(rollout.max_concurrent_rollouts, training.async_semaphore_max, rollout.async_semaphore_max),
    whichever are given (default 8)."""
    caps = [
        _table(config, "rollout").get("max_concurrent_rollouts"),
        _table(config, "training").get("async_semaphore_max"),
        _table(config, "rollout").get("async_semaphore_max"),
    ]
    caps = [int(c) for c in caps if isinstance(c, int | float) and not isinstance(c, bool) and c > 0]
    return min(caps) if caps else DEFAULT_CONCURRENCY


def _policy_config(config: dict[str, Any], max_turns: int | None) -> dict[str, Any]:
    """policy.config without model and inference_url: [policy]'s sampling params (temperature, top_p,
    max_tokens, thinking_*, top_k, repetition_penalty unless 1.0, stop_sequences sent as `stop`), then
    everything in rollout.policy_config (it wins), then max_turns unless given."""
    policy = _table(config, "policy")
    out: dict[str, Any] = {key: policy[key] for key in POLICY_SAMPLING_KEYS if policy.get(key) is not None}
    if policy.get("repetition_penalty") not in (None, 1.0):  # 1.0 is no penalty: nothing to send
        out["repetition_penalty"] = policy["repetition_penalty"]
    if policy.get("stop_sequences"):
        out["stop"] = list(policy["stop_sequences"])  # the chat-completions name
    out.update(_table(config, "rollout", "policy_config"))
    if max_turns and "max_turns" not in out:
        out["max_turns"] = int(max_turns)
    return out


class RolloutSettings(BaseModel):
    """The task app's /rollout requests of an online trainer, resolved from the config (`from_config`)."""

    model_config = ConfigDict(extra="allow")  # a newer operator may write fields an older trainer lacks

    env_name: str | None = Field(None, description="rollout.env_name (env.env_name).")
    policy_name: str | None = Field(None, description="rollout.policy_name (policy.policy_name).")
    env_config: dict[str, Any] = Field(
        default_factory=dict,
        description="env.config: [rollout.env_config] verbatim, with the step_rewards block when configured.",
    )
    policy_config: dict[str, Any] = Field(
        default_factory=dict,
        description="policy.config without model and inference_url: [policy] sampling defaults, "
        "[rollout.policy_config] verbatim (it wins), max_turns.",
    )
    served_model_name: Annotated[Text, Field(description="policy.served_model_name.")] | None = None
    max_turns: Count = Field(1, description="rollout.max_turns, else training.max_turns: agent/env op pairs.")
    ops: list[str] = Field(default_factory=lambda: ["agent", "env"], description="rollout.ops, per turn.")
    timeout_s: Seconds = Field(DEFAULT_TIMEOUT_S, description="rollout.timeout_s: one rollout's time limit.")
    concurrency: Count = Field(
        DEFAULT_CONCURRENCY,
        description="Parallel /rollout calls: min of rollout.max_concurrent_rollouts and async_semaphore_max.",
    )
    error_budget: Fraction = Field(
        DEFAULT_ERROR_BUDGET,
        description="rollout.error_budget (or training.rollout_error_budget): failed share per iteration.",
    )
    step_rewards: StepRewardSettings = Field(default_factory=StepRewardSettings, description="Step rewards.")

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> RolloutSettings:
        rollout, training = _table(config, "rollout"), _table(config, "training")
        max_turns = rollout.get("max_turns") or training.get("max_turns")
        step_rewards = StepRewardSettings.from_config(config)
        budget = rollout.get("error_budget", training.get("rollout_error_budget"))
        values: dict[str, Any] = {
            "env_name": rollout.get("env_name"),
            "policy_name": rollout.get("policy_name"),
            "env_config": with_step_rewards(_table(rollout, "env_config"), step_rewards),
            "policy_config": _policy_config(config, max_turns),
            "served_model_name": _table(config, "policy").get("served_model_name"),
            "max_turns": int(max_turns or 1),
            "concurrency": _concurrency(config),
            "step_rewards": step_rewards,
        }
        if isinstance(rollout.get("ops"), list) and rollout["ops"]:
            values["ops"] = list(rollout["ops"])
        if rollout.get("timeout_s"):
            values["timeout_s"] = rollout["timeout_s"]
        if budget is not None:
            values["error_budget"] = budget
        return cls.model_validate(values)
