"""The sections of synth-ai's RL and SFT TOML configs, typed.

Every section keeps unknown keys (synth forwards them verbatim). The same classes are the sections of the
RLJob / SFTJob spec (camelCase there, unknown keys under `extras`). Cross-section rules and lenient aliases
live in posttrain.api.config; the per-section rules live here."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from posttrain.api import model_ids
from posttrain.api.base import Section
from posttrain.api.fields import (  # noqa: F401 - MAX_* re-exported for the modules that import them here
    MAX_COUNT,
    MAX_EPOCHS,
    MAX_GPUS,
    MAX_GROUP,
    MAX_SECONDS,
    MAX_STEPS,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_WEIGHT,
    OVERLONG_PENALTY_BOUNDS,
    TIS_CAP_BOUNDS,
    AsyncDepth,
    Count,
    Epochs,
    EventRewardsKind,
    Fraction,
    GroupSize,
    GspoVariant,
    Iterations,
    Keep,
    LearningRate,
    OldLogprobs,
    Overlong,
    ReportTo,
    Seed,
    SFTEpochs,
    StepRewardsMode,
    Temperature,
    Tokens,
    TrainerMode,
)
from posttrain.api.urls import check_url

PLACEHOLDER_URLS = ("", "placeholder")  # synth injects task_url = "placeholder" when [services] is absent
OPS = ("agent", "env")


def http_url(value: str | None) -> str | None:
    """An http(s) URL with a host (or synth's placeholder); a ValueError carrying its fix otherwise."""
    if value is None or value.strip() in PLACEHOLDER_URLS:
        return value
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL -- fix: write e.g. http://task-app:8000")
    try:
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError:
        raise ValueError(f"{value!r} has an invalid port -- fix: write e.g. http://task-app:8000") from None
    return value.strip()


def service_url(value: str | None) -> str | None:
    """A task app's or a judge's URL (or synth's placeholder): posttrain.api.urls' rules."""
    if value is None or value.strip() in PLACEHOLDER_URLS:
        return value
    return check_url(value)


# ------------------------------------------------------------------------------------------ shared


class LoraConfig(Section):
    """LoRA adapter settings (`[training.lora]`; top-level `[lora]` is the deprecated alias)."""

    r: int | None = Field(None, ge=1, le=65536, description="LoRA rank.")
    alpha: int | None = Field(None, ge=1, le=1_000_000, description="LoRA alpha (scaling = alpha / r).")
    dropout: float | None = Field(None, ge=0, le=1, description="Dropout on the LoRA path.")
    target_modules: list[str] | None = Field(
        None,
        max_length=64,
        description='Modules to adapt, e.g. ["all-linear"]; keep projector targets (mm_projector) for VL.',
    )


class TopologyConfig(Section):
    """How the job's GPUs split between rollout inference (vLLM), training and the reference model."""

    type: str | None = Field(None, description='"single_node_split" (or "multi_node").')
    gpus_for_vllm: int | None = Field(
        None, ge=0, le=MAX_GPUS, description="GPUs serving the rollout policy (vLLM)."
    )
    gpus_for_training: int | None = Field(None, ge=0, le=MAX_GPUS, description="Trainer GPUs.")
    gpus_for_ref: int | None = Field(
        None, ge=0, le=MAX_GPUS, description="Reference-model GPUs (KL reference)."
    )
    tensor_parallel: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="vLLM tensor-parallel degree; must divide gpus_for_vllm."
    )
    reference_placement: Literal["none", "shared", "dedicated"] | None = Field(
        None, description='Where the reference model runs: "none", "shared" or "dedicated".'
    )


class ComputeConfig(Section):
    """The hardware the job asks for."""

    gpu_type: str = Field(description='GPU model, e.g. "H100", "A100", "L40S" ("CPU" for local runs).')
    gpu_count: int = Field(ge=1, le=MAX_GPUS, description="Total GPUs for the job.")
    nodes: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="Node count; must divide the trainer GPUs."
    )
    topology: TopologyConfig | None = Field(None, description="GPU roles (top-level [topology] is an alias).")

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type_nonempty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("gpu_type must not be empty")
        return value


class PolicySection(Section):
    """`[policy]`: the policy model and its sampling defaults (synth PolicyConfig)."""

    model_name: str | None = Field(None, description="Base model (like model.base); `model` is an alias.")
    source: str | None = Field(None, description="Fine-tuned checkpoint id (like model.source).")
    max_tokens: Tokens = Field(512, description="Sampling: maximum new tokens.")
    temperature: Temperature = Field(0.7, description="Sampling temperature.")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus sampling.")
    top_k: int | None = Field(None, ge=-1, le=MAX_TOKENS, description="Top-k sampling (-1: off).")
    repetition_penalty: float = Field(1.0, gt=0, le=100, description="Repetition penalty.")
    stop_sequences: list[str] | None = Field(None, max_length=64, description="Stop strings.")
    trainer_mode: TrainerMode | None = Field(
        None, description="lora, qlora or full (required when [policy] names the model)."
    )
    label: str | None = Field(None, description="Human-readable run/model label.")
    inference_url: str | None = Field(None, description="Optional inference URL override.")

    @field_validator("inference_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return http_url(value)


# ------------------------------------------------------------------------------------------ RL


class AlgorithmConfig(Section):
    """`[algorithm]`: RL is (online, policy_gradient, gspo); SFT is (offline, sft|supervised_finetune,
    fft|lora|qlora)."""

    type: str = Field(description='"online" (RL) or "offline" (SFT).')
    method: str = Field(description='"policy_gradient" (RL); "sft" or "supervised_finetune" (SFT).')
    variety: str = Field(description='"gspo" (RL); "fft", "lora" or "qlora" (SFT).')


class ModelSection(Section):
    """`[model]`: the starting weights. Exactly one of `base` (a model id) and `source` (a fine-tuned id)."""

    base: str | None = Field(
        None,
        max_length=model_ids.MODEL_ID_MAX_LENGTH,
        description="Base model id, e.g. Qwen/Qwen3-4B (cold start).",
        json_schema_extra={"pattern": model_ids.BASE_PATTERN},
    )
    source: str | None = Field(
        None,
        max_length=model_ids.MODEL_ID_MAX_LENGTH,
        description="Fine-tuned model id (ft:/fft:/qft:/rl:<base>:<namespace>.<name>.<uid8>) from an earlier "
        "posttrain job, or an s3:// URI of weights.",
        json_schema_extra={"pattern": model_ids.SOURCE_PATTERN},
    )
    trainer_mode: TrainerMode | None = Field(
        None, description="lora, qlora or full (required for RL)."
    )
    label: str | None = Field(None, description="Human-readable run/model label (required for RL).")
    supports_vision: bool | None = Field(
        None, description="Load the vision processor (auto-set for Qwen3-VL models)."
    )
    max_images_per_message: int | None = Field(
        None,
        ge=1,
        le=MAX_COUNT,
        description="Images kept per message; extra images are trimmed (Qwen3-VL default 1).",
    )
    vision_processor_id: str | None = Field(
        None, description="HF processor id, e.g. Qwen/Qwen3-VL-4B-Instruct (auto-set for Qwen3-VL)."
    )


class PolicyConfigSection(Section):
    """`[rollout.policy_config]`: merged into the task app's `policy.config` for every rollout."""

    model: str | None = Field(None, description="Model name the task app sends to the inference server.")
    temperature: Temperature | None = Field(None, description="Sampling temperature.")
    top_p: float | None = Field(None, gt=0, le=1, description="Nucleus sampling.")
    max_tokens: Tokens | None = Field(None, description="Maximum new tokens per call.")
    max_llm_calls: int | None = Field(None, ge=1, le=MAX_COUNT, description="LLM calls per rollout.")
    use_vision: bool | None = Field(None, description="Include image segments in prompts.")
    image_only_mode: bool | None = Field(
        None, description="Send images without text observations (implies use_vision)."
    )
    max_images_per_step: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Images kept per request, newest first (wins over [rollout])."
    )
    use_tools: bool | None = Field(None, description="Let the policy call tools.")
    thinking_mode: Literal["think", "no_think"] | None = Field(
        None, description='"think" or "no_think" (set it for -Thinking models).'
    )
    thinking_budget: int | None = Field(None, ge=1, le=MAX_TOKENS, description="Token budget for <think>.")


class EnvConfigSection(Section):
    """`[rollout.env_config]`: forwarded to the task app as `env.config`."""

    difficulty: str | None = Field(None, description="Task difficulty, where the task app knows one.")
    split: str | None = Field(None, description="Dataset split the task app samples from.")


class RolloutConfig(Section):
    """`[rollout]`: how episodes are collected from the task app."""

    env_name: str = Field(description="Environment name the task app recognises (env.env_name).")
    policy_name: str = Field(description="Policy name (policy.policy_name).")
    env_config: EnvConfigSection | None = Field(None, description="Forwarded as env.config.")
    policy_config: PolicyConfigSection | None = Field(None, description="Merged into policy.config.")
    max_turns: int = Field(ge=1, le=MAX_COUNT, description="Steps per episode.")
    episodes_per_batch: int = Field(ge=1, le=MAX_COUNT, description="Episodes collected per batch.")
    max_concurrent_rollouts: int = Field(
        ge=1, le=MAX_COUNT, description="Parallel /rollout calls to the task app."
    )
    batches_per_step: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Batches per training step (default 1)."
    )
    ops: list[str] | None = Field(None, max_length=64, description='Op pattern, e.g. ["agent", "env"].')
    use_vision: bool | None = Field(None, description="Policy prompts include image segments.")
    image_only_mode: bool | None = Field(None, description="Images without text observations.")
    max_images_per_step: int | None = Field(None, ge=1, le=MAX_COUNT, description="Images kept per step.")
    task_app_origin_rewards_only: bool | None = Field(None, description="Use only the task app's rewards.")

    @field_validator("env_name", "policy_name")
    @classmethod
    def _nonempty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("ops")
    @classmethod
    def _ops(cls, value: list[str] | None) -> list[str] | None:
        for op in value or []:
            if op not in OPS:
                raise ValueError(
                    f'op {op!r} is not one of {", ".join(OPS)} -- fix: write e.g. ops = ["agent", "env"]'
                )
        return value


class WeightSyncConfig(Section):
    """`[training.weight_sync]`: pushing trainer weights to the rollout servers."""

    enable: bool | None = Field(None, description="Sync weights to vLLM during training.")
    targets: list[str] | None = Field(None, max_length=8, description='Servers to update, e.g. ["policy"].')
    mode: str | None = Field(None, description='Sync mode, e.g. "direct".')
    direct: bool | None = Field(None, description="Direct sync.")
    verify_every_k: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="Verify the sync every k updates (0: never)."
    )


class RewardsConfig(Section):
    """`[training.rewards]`: the nested form of the step_rewards_* fields."""

    step_rewards_enabled: bool | None = Field(None, description="Per-decision rewards.")
    step_rewards_mode: StepRewardsMode | None = Field(
        None, description="off, decision_stepwise or env_sparse."
    )
    step_rewards_indicator_lambda: float | None = Field(None, description="Indicator weight.")
    step_rewards_beta: float | None = Field(None, description="Step reward beta.")
    step_rewards_strategy: str | None = Field(None, description='e.g. "consistent", "per_achievement".')
    event_rewards_kind: EventRewardsKind | None = Field(None, description="unique or absolute.")


class ParallelismConfig(Section):
    """`[hyperparameters.parallelism]`."""

    use_deepspeed: bool | None = Field(None, description="Train with DeepSpeed.")
    deepspeed_stage: int | None = Field(None, ge=0, le=3, description="ZeRO stage.")
    fsdp: bool | None = Field(
        None, description="FSDP2 sharding of RL full fine-tuning (not with use_deepspeed, LoRA or QLoRA)."
    )
    bf16: bool | None = Field(
        None,
        description="bf16 autocast where the hardware has native bf16 (GPUs with bf16, CPUs with "
        "AVX512-BF16/AMX); elsewhere fp32 with a warning. Unset: bf16 exactly where native.",
    )
    force_bf16: bool | None = Field(
        None, description="bf16 even where it is emulated (many times slower than fp32 on such CPUs)."
    )
    fp16: bool | None = Field(None, description="fp16.")
    activation_checkpointing: bool | None = Field(None, description="Gradient checkpointing.")
    tensor_parallel_size: int | None = Field(None, ge=1, le=MAX_GPUS, description="Tensor parallel degree.")
    pipeline_parallel_size: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="Pipeline parallel degree."
    )


class RLTrainingConfig(Section):
    """`[training]` for RL (GSPO)."""

    num_epochs: Epochs = Field(description="Epochs.")
    iterations_per_epoch: Iterations = Field(description="Training iterations per epoch.")
    max_turns: Count = Field(description="Maximum turns per episode (rollout.max_turns wins).")
    batch_size: Count = Field(description="Training batch (groups).")
    group_size: GroupSize = Field(
        description="Rollouts per prompt/seed: the GSPO group (at least 2), or ReST-EM's K samples per prompt.",
    )
    learning_rate: LearningRate = Field(description="Learning rate (at most 1).")
    gradient_accumulation_steps: int | None = Field(None, ge=1, le=MAX_COUNT, description="Default 1.")
    max_accumulated_minibatch: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Cap on accumulated minibatches."
    )
    log_interval: int | None = Field(None, ge=1, le=MAX_STEPS, description="Log every N steps.")
    report_to: ReportTo = None
    weight_sync_interval: Iterations | None = Field(None, description="Push weights to vLLM every N steps.")
    weight_sync: WeightSyncConfig | None = Field(None, description="Weight sync settings.")
    lora: LoraConfig | None = Field(None, description="LoRA settings (top-level [lora] is an alias).")
    parallelism: ParallelismConfig | None = Field(None, description="Precision and parallelism settings.")
    rewards: RewardsConfig | None = Field(None, description="Nested step-reward settings.")
    step_rewards_enabled: bool | None = Field(None, description="Deprecated flat form of rewards.*.")
    step_rewards_mode: StepRewardsMode | None = Field(
        None, description="off, decision_stepwise or env_sparse."
    )
    step_rewards_indicator_lambda: float | None = Field(None, description="Indicator weight.")
    step_rewards_beta: float | None = Field(None, description="Step reward beta.")
    step_rewards_strategy: str | None = Field(None, description='e.g. "consistent".')
    event_rewards_kind: EventRewardsKind | None = Field(None, description="unique or absolute.")
    async_semaphore_max: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Cap on concurrent in-flight async work."
    )
    supports_vision: bool | None = Field(None, description="Mirror of model.supports_vision.")
    max_images_per_message: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Mirror of model.max_images_per_message."
    )
    overlong: Overlong | None = Field(
        None,
        description="posttrain: responses cut at max_tokens (finish_reason length): keep (default; trained on "
        "the task's reward), mask (no loss; still in the group's advantages) or penalty (overlong_penalty "
        "added to the reward before the advantages).",
    )
    overlong_penalty: float | None = Field(
        None,
        **OVERLONG_PENALTY_BOUNDS,
        description="posttrain: reward added to a truncated response under overlong = penalty (-1).",
    )
    old_logprobs: OldLogprobs | None = Field(
        None,
        description="posttrain: the GSPO ratio's old policy: trainer (default; recomputed at the pre-update "
        "weights) or sampler (vLLM's captured sampling logprobs as the behaviour policy, corrected by "
        "truncated importance sampling, capped at tis_cap).",
    )
    tis_cap: float | None = Field(
        None,
        **TIS_CAP_BOUNDS,
        description="posttrain: cap of the truncated importance weight under old_logprobs = sampler (2).",
    )
    async_depth: AsyncDepth | None = Field(
        None,
        description="posttrain: GSPO samples iteration k+1 with the weights of k while it updates to k+1 "
        "(0, default: sample, then update); rollouts older than this many weight versions are dropped. "
        "Needs old_logprobs = sampler (set for you when unset) and weight_sync_interval = 1.",
    )
    gspo_variant: GspoVariant | None = Field(
        None,
        description="posttrain: GSPO (sequence, default) or GSPO-token (token-level ratios sg[s_i] "
        "pi(y_t)/sg[pi(y_t)]; differs with token-level importance weights).",
    )
    keep_checkpoints: Keep | None = Field(
        None, description="posttrain: newest checkpoints kept in S3 (default 3; 0 keeps all)."
    )
    keep_weight_versions: Keep | None = Field(
        None,
        description="posttrain: newest synced weight versions kept, locally and in S3 (default 2; 0 keeps all); "
        "the served one is never deleted.",
    )


class EvaluationConfig(Section):
    """`[evaluation]`: periodic evaluation on fixed seeds."""

    instances: Count = Field(description="Evaluation episodes.")
    every_n_iters: Iterations = Field(description="Evaluate every N iterations.")
    seeds: list[Seed] = Field(max_length=100000, description="Seeds sent to the task app.")


class RubricWeights(Section):
    env: float = Field(1.0, ge=0, le=MAX_WEIGHT, description="Weight of the environment return.")
    event: float = Field(0.0, ge=0, le=MAX_WEIGHT, description="Weight of the summed event scores.")
    outcome: float = Field(0.0, ge=0, le=MAX_WEIGHT, description="Weight of the outcome score.")


class RubricConfig(Section):
    """`[rubric]` (synth's deprecated spelling of judge.reward_blend): with enabled = true and a [judge]
    configured, total = env*return + event*sum(events) + outcome*outcome_score (these weights win over
    judge.reward_blend)."""

    enabled: bool = Field(False, description="Blend judge scores into the reward (needs a configured [judge]).")
    weights: RubricWeights | None = Field(None, description="Blend weights (at least one non-zero).")
    reward_blend: dict[str, float] | None = Field(None, max_length=16, description="Blend weights by name.")


class RubricCriterion(Section):
    id: str = Field(description="Criterion id.")
    weight: float | None = Field(None, description="Weight.")
    scale: str | None = Field(None, description='"binary" or "bounded".')
    description: str | None = Field(None, description="What the judge looks for.")


class RubricOverride(Section):
    goal_text: str | None = Field(None, description="What the episode should achieve.")
    aggregation: str | None = Field(None, description='e.g. "weighted_sum".')
    criteria: list[RubricCriterion] | None = Field(None, max_length=64, description="Criteria.")


class RubricOverrides(Section):
    event: RubricOverride | None = Field(None, description="Per-event rubric.")
    outcome: RubricOverride | None = Field(None, description="Outcome rubric.")


# Judge providers. External ones are called through their OpenAI-compatible API with the key from
# <PROVIDER>_API_KEY; a self-hosted judge is a vLLM server the operator (or the local runner) deploys next to
# the job. A config names one of JUDGE_PROVIDERS; a custom resource written by hand may use any of the
# self-hosted aliases.
EXTERNAL_JUDGE_PROVIDERS = ("openai", "groq", "gemini")
JUDGE_PROVIDERS = (*EXTERNAL_JUDGE_PROVIDERS, "self-hosted", "vllm")
SELF_HOSTED_JUDGE_PROVIDERS = frozenset({"self-hosted", "selfhosted", "self", "vllm", "posttrain", "local"})
SELF_HOSTED_JUDGE_GPUS = 1  # GPUs of a self-hosted judge server unless [judge.options].gpus says otherwise


def is_self_hosted_judge(provider: str | None) -> bool:
    """Whether a judge provider name means a judge served next to the job (any spelling, any case)."""
    return str(provider or "").lower() in SELF_HOSTED_JUDGE_PROVIDERS


class JudgeOptionsConfig(Section):
    """`[judge.options]`: which judge model scores rollouts. provider and model are required for a judge."""

    provider: str | None = Field(
        None, description='openai, groq, gemini, or "self-hosted"/"vllm" (served next to the job).'
    )
    model: str | None = Field(None, description="Judge model name.")
    rubric_id: str | None = Field(None, description="Stored rubric id.")
    event: bool | None = Field(None, description="Score events (default true).")
    outcome: bool | None = Field(None, description="Score the outcome (default true).")
    timeout_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="Judge call timeout.")
    weights: dict[str, float] | None = Field(None, max_length=16, description="Score weights by name.")
    rubric_overrides: RubricOverrides | None = Field(
        None, description="Inline rubric; a judged score without one uses the task app's /task_info rubric."
    )
    gpus: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="posttrain: GPUs for a self-hosted judge (default 1)."
    )

    def self_hosted(self) -> bool:
        return is_self_hosted_judge(self.provider)

    def server_gpus(self) -> int:
        """GPUs of the judge server the job deploys: 0 for an external provider."""
        return (self.gpus or SELF_HOSTED_JUDGE_GPUS) if self.self_hosted() else 0


class SecretKeyRef(Section):
    """A key of a Secret in the job's namespace."""

    name: str = Field(description="Secret name.")
    key: str | None = Field(None, description="Key in the Secret.")


class JudgeConfig(Section):
    """`[judge]` (`[verifier]` in later synth): LLM judges whose scores are blended into the reward."""

    type: str | None = Field(None, description="Judge type.")
    timeout_s: float | None = Field(
        None, gt=0, le=MAX_SECONDS, description="Judge call timeout (migrated into options)."
    )
    enabled: bool | None = Field(None, description="Turn the judge on or off.")
    reward_blend: dict[str, float] | None = Field(
        None,
        max_length=16,
        description="Blend weights, e.g. {env = 0.5, outcome = 0.5} (names left out: env 1, event 0, outcome 0); "
        "the judge is called only for a score with weight > 0, else validate warns and none is deployed.",
    )
    rubric: RubricConfig | None = Field(None, description="Rubric settings.")
    options: JudgeOptionsConfig | None = Field(None, description="Judge provider, model and rubric.")
    url: str | None = Field(None, description="Judge service base URL (services.judge_url).")
    api_key_secret_ref: SecretKeyRef | None = Field(
        None, description="posttrain: Secret holding the judge provider's API key."
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return service_url(value)

    def scores_rollouts(self) -> bool:
        """A judge scores rollouts when it is not disabled and [judge.options] names a provider and a model
        (synth: an incomplete [judge.options] means no judge)."""
        if self.enabled is False or self.options is None:
            return False
        return bool(self.options.provider and self.options.model)

    def base_url(self) -> object:
        """[judge.options].base_url (a key the trainer reads, kept among the section's extras)."""
        return ((self.options.model_extra or {}) if self.options is not None else {}).get("base_url")

    def needs_key_secret(self) -> bool:
        """Whether the judge is called somewhere that takes a key: an external provider, or any base_url
        (an endpoint of the job's choosing). In a cluster that key comes only from the Secret the job
        names (api_key_secret_ref), never from the trainer's environment."""
        if not self.scores_rollouts():
            return False
        assert self.options is not None
        return not self.options.self_hosted() or self.base_url() is not None

    def cluster_problems(self) -> list[tuple[str, str, str]]:
        """(field under the judge, message, fix) for what a cluster job cannot run: a base_url the URL
        rules refuse, a judge that needs a key without a Secret named for it."""
        out: list[tuple[str, str, str]] = []
        url = self.base_url()
        if url is not None:
            try:
                check_url(url)
            except ValueError as err:
                reason, _, fix = str(err).partition(" -- fix: ")
                out.append(("options.base_url", f"the judge's URL {reason}", fix or "write an http(s) URL"))
        if self.needs_key_secret() and (self.api_key_secret_ref is None or not self.api_key_secret_ref.name):
            where = "a custom base_url" if url is not None else f"provider {self.options.provider!r}"  # type: ignore[union-attr]
            out.append(("api_key_secret_ref", f"the judge ({where}) needs its key from a Secret the job names",
                        "create a Secret with the key and name it: [judge.api_key_secret_ref] name = \"judge-key\", "
                        "key = \"OPENAI_API_KEY\" (spec.judge.apiKeySecretRef); a key never comes from the "
                        "trainer's environment"))  # fmt: skip
        return out


class ServicesConfig(Section):
    """`[services]`: where the task app (and optionally a judge service) lives."""

    task_url: str | None = Field(None, description="Task app base URL (--task-url / TASK_APP_URL win).")
    judge_url: str | None = Field(None, description="Judge service base URL (`verifier_url` is an alias).")

    @field_validator("task_url", "judge_url")
    @classmethod
    def _urls(cls, value: str | None) -> str | None:
        return service_url(value)


class VllmConfig(Section):
    """`[vllm]`: rollout inference server settings."""

    tensor_parallel_size: int | None = Field(
        None, ge=1, le=MAX_GPUS, description="Align with topology.tensor_parallel."
    )
    max_model_len: int | None = Field(None, ge=1, le=MAX_TOKENS, description="Context length (tokens).")
    limit_mm_per_prompt: dict[str, int] | None = Field(
        None, max_length=8, description="Multimodal limits, e.g. {image = 1}."
    )
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, description="vLLM GPU memory fraction.")
    tool_call_parser: str | None = Field(
        None,
        pattern=r"^[a-z][a-z0-9_]{0,39}$",
        description="vLLM's tool-call parser for task apps that ask for tool calls (e.g. hermes, llama3_json); "
        "none turns tool calling off. Default: hermes for Qwen-family models, else none.",
    )


class ReferenceConfig(Section):
    """`[reference]`: the KL reference model server."""

    placement: Literal["none", "shared", "dedicated"] | None = Field(
        None, description="none, shared or dedicated (wins over an injected reference_placement = none)."
    )
    port: int | None = Field(None, ge=1, le=65535, description="Server port.")
    tp: int | None = Field(None, ge=1, le=MAX_GPUS, description="Tensor-parallel degree.")
    health_max_wait_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="Startup wait.")
    health_interval_ms: float | None = Field(
        None, gt=0, le=MAX_SECONDS * 1000, description="Health poll interval."
    )


# ------------------------------------------------------------------------------------------ SFT


class SFTJobSection(Section):
    """`[job]` of an SFT config."""

    model: str | None = Field(None, description="Base model (SFT allowlist) or a fine-tuned id.")
    data: str | None = Field(None, description="Training JSONL (--dataset wins; relative to the CWD).")
    data_path: str | None = Field(None, description="Alias of data.")
    poll_seconds: int | None = Field(None, ge=1, le=MAX_SECONDS, description="Poll interval.")


class DataTopology(Section):
    container_count: int | None = Field(None, ge=1, le=MAX_GPUS, description="Containers.")


class SFTDataSection(Section):
    """`[data]` of an SFT config."""

    topology: DataTopology | None = Field(None, description="Forwarded as effective_config.data.topology.")
    validation_path: str | None = Field(None, description="Validation JSONL.")


class ValidationConfig(Section):
    """`[training.validation]`: held-out evaluation during SFT."""

    enabled: bool | None = Field(None, description="Evaluate on the validation set.")
    evaluation_strategy: str | None = Field(None, description='"steps" or "epoch".')
    eval_steps: Iterations | None = Field(None, description="Evaluate every N steps.")
    save_best_model_at_end: bool | None = Field(None, description="Keep the best checkpoint.")
    metric_for_best_model: str | None = Field(None, description='e.g. "val.loss".')
    greater_is_better: bool | None = Field(None, description="Direction of the metric.")


class SFTTrainingConfig(Section):
    """`[training]` of an SFT config."""

    mode: str | None = Field(None, description='"sft_offline", "lora" or "full_finetune".')
    use_qlora: bool | None = Field(None, description="QLoRA (mode = lora + use_qlora = true).")
    validation: ValidationConfig | None = Field(None, description="Validation settings.")
    lora: LoraConfig | None = Field(None, description="LoRA settings.")
    keep_checkpoints: Keep | None = Field(
        None, description="posttrain: newest checkpoints kept in S3 (default 3; 0 keeps all)."
    )
    report_to: ReportTo = None


class HyperparametersConfig(Section):
    """`[hyperparameters]` of an SFT config."""

    n_epochs: SFTEpochs = Field(1, description="Epochs.")
    total_steps: int | None = Field(None, ge=0, le=MAX_STEPS, description="Total optimizer steps.")
    train_steps: int | None = Field(None, ge=0, le=MAX_STEPS, description="Alias of total_steps.")
    steps: int | None = Field(None, ge=0, le=MAX_STEPS, description="Alias of total_steps.")
    batch_size: int | None = Field(None, ge=1, le=MAX_COUNT, description="Batch size.")
    global_batch: int | None = Field(None, ge=1, le=MAX_COUNT, description="Global batch.")
    per_device_batch: int | None = Field(None, ge=1, le=MAX_COUNT, description="Per-device batch.")
    gradient_accumulation_steps: int | None = Field(
        None, ge=1, le=MAX_COUNT, description="Gradient accumulation."
    )
    sequence_length: Tokens | None = Field(None, description="Maximum tokens per example (default 2048).")
    learning_rate: LearningRate | None = Field(
        None, description="Learning rate (at most 1; default 1e-4 for LoRA/QLoRA, 1e-5 for full)."
    )
    warmup_ratio: Fraction | None = Field(None, description="Warmup fraction in [0, 1].")
    train_kind: Literal["fft", "peft"] | None = Field(None, description='"fft" or "peft".')
    weight_decay: Fraction | None = Field(None, description="Weight decay.")
    parallelism: ParallelismConfig | None = Field(None, description="Parallelism settings.")
    evaluation_strategy: str | None = Field(None, description='"steps" or "epoch".')
    eval_steps: Iterations | None = Field(None, description="Evaluate every N steps.")
    save_best_model_at_end: bool | None = Field(None, description="Keep the best checkpoint.")
    metric_for_best_model: str | None = Field(None, description='e.g. "val.loss".')
    greater_is_better: bool | None = Field(None, description="Direction of the metric.")
