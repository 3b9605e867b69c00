"""The judge's settings, resolved once from `[judge]` and `[rubric]`: whether the trainer calls a judge, the
reward blend, which scores it judges, where it is and which rubric it scores against.

Two spellings blend a judge's scores into the reward (total = env * env_return + event * sum(event scores) +
outcome * outcome_score, posttrain.api.reward.blend_reward):
  - `[judge] reward_blend = { env = 0.6, outcome = 0.4 }` (synth's current one), or `[judge.rubric]
    enabled = true` with its `weights` or `reward_blend`;
  - synth's deprecated `[rubric] enabled = true` with `[rubric.weights]` (or `[rubric] reward_blend`); it wins
    over `[judge] reward_blend` when both are given, as in synth.
Either needs a judge: `[judge]` not disabled with `[judge.options]` provider and model (synth: an incomplete
`[judge.options]` means no judge, and `[rubric]` without a judge blends nothing). A blend names env, event and
outcome (events and env_return are accepted); a name it leaves out keeps its default (env 1, event 0,
outcome 0).

The judge is called (`enabled`) only where its score has weight: outcome when outcome > 0 and
`[judge.options] outcome` is not false, events likewise. A judge configured that scores nothing is `idle`:
`posttrain validate` warns naming the keys, the operator deploys no judge server for it and the trainer
calls nothing (`idle_reason` says why).

The rubric: `[judge.options.rubric_overrides.outcome|event]` where given; else the outcome and events rubrics
the task app's /task_info returns (synth's behaviour; the trainer fetches them, posttrain_trainer.task_rubric).

The same section types as the TOML schema and the custom resource (posttrain.api.sections) carry the values:
one definition per key. posttrain.api.settings puts the result on GSPOSettings (field `judge`), which the job
file carries to the trainer."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from posttrain.api.sections import (
    MAX_SECONDS,
    JudgeConfig,
    RubricConfig,
    RubricOverride,
    RubricOverrides,
    RubricWeights,
    is_self_hosted_judge,
)

WEIGHT_ALIASES = {"events": "event", "env_return": "env"}
WEIGHT_NAMES = ("env", "event", "outcome")
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONCURRENCY = 8
RubricSource = Literal["overrides", "task_info", "none"]
JudgedKind = Literal["outcome", "event"]


def blend_weights(given: dict[str, Any] | RubricWeights) -> tuple[RubricWeights, list[str]]:
    """A blend (RubricWeights or a reward_blend table) -> (the weights, the names it gives that are none of
    env, event, outcome). Names left out keep RubricWeights' defaults."""
    raw = given.model_dump(exclude_none=True) if isinstance(given, RubricWeights) else dict(given)
    values: dict[str, float] = {}
    unknown = []
    for key, value in raw.items():
        name = WEIGHT_ALIASES.get(key, key)
        if name in WEIGHT_NAMES:
            if value is not None:
                values[name] = float(value)
        else:
            unknown.append(key)
    return RubricWeights(**values), unknown


class JudgeSettings(BaseModel):
    """What the trainer (and the operator) need of the judge; `JudgeSettings.resolve(config)`."""

    model_config = ConfigDict(extra="allow")  # a newer operator may write fields an older trainer lacks

    configured: bool = Field(
        False, description="[judge] is not disabled and [judge.options] names provider and model."
    )
    enabled: bool = Field(
        False, description="The trainer calls the judge: configured and a judged score has weight."
    )
    weights: RubricWeights = Field(
        default_factory=RubricWeights, description="The reward blend (env, event, outcome)."
    )
    weights_from: str | None = Field(
        None, description="The key the blend came from, e.g. judge.reward_blend."
    )
    unknown_weights: list[str] = Field(
        default_factory=list, description="Blend names that are none of env, event, outcome."
    )
    provider: str | None = Field(None, description="judge.options.provider.")
    model: str | None = Field(None, description="judge.options.model.")
    base_url: str | None = Field(
        None, description="judge.options.base_url (else the provider's, or the operator's judge Service)."
    )
    timeout_s: float = Field(
        DEFAULT_TIMEOUT_S,
        gt=0,
        le=MAX_SECONDS,
        description="judge.options.timeout_s (judge.timeout_s migrates in).",
    )
    max_concurrency: int = Field(
        DEFAULT_CONCURRENCY, ge=1, le=1024, description="Judge calls in flight at most."
    )
    outcome: bool = Field(
        False, description="The outcome is judged (outcome weight > 0, options.outcome not false)."
    )
    event: bool = Field(False, description="Events are judged (event weight > 0, options.event not false).")
    api_key_env: str | None = Field(
        None, description="judge.options.api_key_env: the variable holding the key."
    )
    rubric_overrides: RubricOverrides | None = Field(None, description="judge.options.rubric_overrides.")
    rubric_source: RubricSource = Field(
        "none",
        description="Where the rubric of what is judged comes from: overrides, task_info (the task app's "
        "/task_info, for every judged score without an override) or none (no judge is called).",
    )
    gpus: int = Field(0, ge=0, description="GPUs of the self-hosted judge server the job needs (0: none).")
    idle_reason: str | None = Field(None, description="Why a configured judge is not called.")

    # ----------------------------------------------------------------------------------------- reads

    @property
    def self_hosted(self) -> bool:
        return is_self_hosted_judge(self.provider)

    @property
    def needs_server(self) -> bool:
        """A judge server must run next to the job: called, self-hosted and at no base_url of its own."""
        return self.enabled and self.self_hosted and not self.base_url

    @property
    def idle(self) -> bool:
        """Configured but never called: its scores have no weight (validate warns; nothing is deployed)."""
        return self.configured and not self.enabled

    def blend(self) -> dict[str, float]:
        return {name: float(getattr(self.weights, name)) for name in WEIGHT_NAMES}

    def judged(self) -> list[JudgedKind]:
        return [kind for kind in ("outcome", "event") if getattr(self, kind)]  # type: ignore[misc]

    def override(self, kind: JudgedKind) -> RubricOverride | None:
        return getattr(self.rubric_overrides, kind) if self.rubric_overrides is not None else None

    # ----------------------------------------------------------------------------------------- resolve

    @classmethod
    def resolve(cls, config: dict[str, Any], *, calls_judges: bool = True) -> JudgeSettings:
        """From a normalised config ([judge] or [verifier] already merged, judge.timeout_s migrated)."""
        judge, rubric = config.get("judge"), config.get("rubric")
        return cls.from_sections(
            JudgeConfig.model_validate(judge) if isinstance(judge, dict) else None,
            RubricConfig.model_validate(rubric) if isinstance(rubric, dict) else None,
            calls_judges=calls_judges,
        )

    @classmethod
    def from_sections(
        cls, judge: JudgeConfig | None, rubric: RubricConfig | None, *, calls_judges: bool = True
    ) -> JudgeSettings:
        """From the typed sections (a config's or a custom resource's). `calls_judges` is False for an
        algorithm that never calls a judge (ReST-EM): then nothing blends and a configured judge is idle."""
        options = judge.options if judge is not None else None
        extra = (options.model_extra or {}) if options is not None else {}
        configured = bool(judge is not None and judge.scores_rollouts())
        base: dict[str, Any] = {"configured": configured}
        if options is not None:
            timeout = options.timeout_s or (judge.timeout_s if judge is not None else None)
            base.update(
                provider=options.provider,
                model=options.model,
                base_url=str(extra["base_url"]) if extra.get("base_url") else None,
                timeout_s=timeout or DEFAULT_TIMEOUT_S,
                max_concurrency=int(extra.get("max_concurrency") or DEFAULT_CONCURRENCY),
                api_key_env=str(extra["api_key_env"]) if extra.get("api_key_env") else None,
                rubric_overrides=options.rubric_overrides,
            )
        if not configured:
            return cls(**base)
        if not calls_judges:
            return cls(
                **base, idle_reason="ReST-EM keeps samples by the task app's reward: it calls no judge"
            )
        source = _blend_source(judge, rubric)
        if source is None:
            hint = (
                " ([rubric] has weights but enabled is not true)"
                if rubric is not None and (rubric.weights is not None or rubric.reward_blend)
                else ""
            )
            return cls(**base, idle_reason="no reward blend gives the judge's scores a weight: set [judge] "
                       f"reward_blend = {{ env = ..., outcome = ... }}{hint}")  # fmt: skip
        key, given = source
        weights, unknown = blend_weights(given)
        assert options is not None
        outcome = weights.outcome > 0 and options.outcome is not False
        event = weights.event > 0 and options.event is not False
        settings = cls(**base, weights=weights, weights_from=key, unknown_weights=unknown, outcome=outcome,
                       event=event, enabled=outcome or event)  # fmt: skip
        if not settings.enabled:
            settings.idle_reason = _idle_reason(key, weights, options.outcome, options.event)
            return settings
        overridden = all(settings.override(kind) is not None for kind in settings.judged())
        settings.rubric_source = "overrides" if overridden else "task_info"
        settings.gpus = options.server_gpus() if settings.needs_server else 0
        return settings


def _blend_source(judge: JudgeConfig | None, rubric: RubricConfig | None) -> tuple[str, Any] | None:
    """(the key, the weights) of the blend in force: [rubric] (enabled) first, then [judge] reward_blend,
    then [judge.rubric] (enabled: its weights, else its reward_blend)."""
    if rubric is not None and rubric.enabled:
        if rubric.weights is not None:
            return "rubric.weights", rubric.weights
        if rubric.reward_blend:
            return "rubric.reward_blend", rubric.reward_blend
    if judge is not None and judge.reward_blend:
        return "judge.reward_blend", judge.reward_blend
    nested = judge.rubric if judge is not None else None
    if nested is not None and nested.enabled:
        if nested.weights is not None:
            return "judge.rubric.weights", nested.weights
        if nested.reward_blend:
            return "judge.rubric.reward_blend", nested.reward_blend
    return None


def _idle_reason(key: str, weights: RubricWeights, outcome: bool | None, event: bool | None) -> str:
    if not (weights.outcome or weights.event):
        return f"{key} gives outcome and event weight 0 (only the task app's return counts)"
    off = [f"judge.options.{name} = false" for name, switch, weight in
           (("outcome", outcome, weights.outcome), ("event", event, weights.event)) if weight and switch is False]  # fmt: skip
    return f"{' and '.join(off)} where {key} gives weight: the task app's own scores are blended instead"
