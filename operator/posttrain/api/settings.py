"""The trainer's settings, resolved once, typed: one model per algorithm, carried in the job file.

A synth config names a setting in several places ([training] num_minibatches or minibatches, [data] or
[training] seed_start, ...) and leaves most of them out. Each model below says, per field, where the field
is read from (`Keys`: the config paths, first one present wins), its default, its bounds and its help; the
rules that join fields live on the model too. `settings_for(kind, config)` resolves a normalised config
(posttrain.api.config.normalized_config, or posttrain.api.convert.spec_to_config of a job's spec) into the
model of its algorithm; posttrain.api.jobfile.build_jobfile puts it into the job file, and the trainer reads
it from there (posttrain_trainer.*_config) without a second set of defaults or aliases. The keys these
models read beyond synth's typed sections are the pass-through keys of posttrain.api.extras (derived from
here), and posttrain.api.config's cross-field rules call the rule functions below: one home per rule.

How to add an algorithm (an RL variety, `[algorithm] variety = "x"`):
  1. here: a model subclassing the closest one (GSPOSettings), with its fields (Keys, defaults, bounds,
     help) and rules, a `variety` and a `trainer`, listed in RL_ALGORITHMS. The TOML schema, the CRD's CEL
     rule, the pass-through keys and the trainer's dispatch follow from that list.
  2. the trainer module named by `trainer` (posttrain_trainer.rl for GSPO's family) reads the new fields.
  3. tests: a hand-computed unit test of what is new, and a short run that learns.
Importing this module imports no torch: the operator and the CLI use it."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.api.fields import (  # noqa: F401 - re-exported
    MAX_COUNT,
    OVERLONG_PENALTY_BOUNDS,
    OVERLONG_TREATMENTS,
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
    NonNegative,
    OldLogprobs,
    Overlong,
    OverlongPenalty,
    Positive,
    ReportTo,
    Reward,
    Seconds,
    Seed,
    SFTEpochs,
    StepRewardsMode,
    Steps,
    SyncFormat,
    Temperature,
    Text,
    TisCap,
    Tokens,
    TrainerMode,
)
from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.rollout_settings import RolloutSettings

# ------------------------------------------------------------------------------------------ shared types
# One definition each: posttrain.api.fields (imported above, re-exported for the modules that import them here).

EPS_LOW = 3e-4  # GSPO's clip band (the paper's)
EPS_HIGH = 4e-4
DEFAULT_TIS_CAP = 2.0
DEFAULT_OVERLONG_PENALTY = -1.0
SFT_LOSS_METRICS = frozenset({"val.loss", "val_loss", "eval_loss", "eval.loss", "loss", "validation_loss"})
SFT_METRICS = SFT_LOSS_METRICS | {"perplexity", "val.perplexity", "eval_perplexity", "token_accuracy",
                                  "val.token_accuracy"}  # fmt: skip


class Keys:
    """Field metadata: the config paths a setting is read from, in order (the first present wins)."""

    def __init__(self, *paths: str):
        self.paths = paths


def keys_of(info: Any) -> tuple[str, ...]:
    return next((m.paths for m in info.metadata if isinstance(m, Keys)), ())


def lookup(config: dict[str, Any], path: str) -> Any:
    """config["a"]["b"] for "a.b"; None when a part is missing or not a table."""
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _table(config: dict[str, Any], *paths: str) -> dict[str, Any]:
    """The first of `paths` that is a non-empty table, else {}."""
    for path in paths:
        value = lookup(config, path)
        if isinstance(value, dict) and value:
            return value
    return {}


# ------------------------------------------------------------------------------------------ rules
# (field, message, fix) each; posttrain.api.config reports them with the TOML's file:line, the models below
# refuse a job file that breaks them.


def group_problems(group_size: int) -> list[tuple[str, str, str]]:
    if group_size < 2:
        return [("training.group_size", f"group_size = {group_size}: GSPO normalises rewards within a group",
                 "set group_size >= 2")]  # fmt: skip
    return []


def fsdp_problems(fsdp: bool, use_deepspeed: bool, trainer_mode: str | None) -> list[tuple[str, str, str]]:
    """training.parallelism.fsdp (FSDP2) shards full fine-tuning; it is one sharding or the other."""
    if not fsdp:
        return []
    out = []
    if use_deepspeed:
        out.append(("training.parallelism.fsdp", "fsdp and use_deepspeed are both set: each shards the model "
                    "its own way", "keep one: fsdp = false or use_deepspeed = false"))  # fmt: skip
    if trainer_mode in ("lora", "qlora"):
        out.append(("training.parallelism.fsdp", f'fsdp shards full fine-tuning only, not trainer_mode = "{trainer_mode}"',
                    "set fsdp = false (an adapter's gradients and optimizer state are small) or "
                    'trainer_mode = "full"'))  # fmt: skip
    return out


def async_problems(async_depth: int, old_logprobs: str | None, weight_sync_interval: int | None) -> list[tuple[str, str, str]]:
    """training.async_depth > 0: rollouts lag the update by up to async_depth weight versions; the sampler's
    logprobs must be the behaviour policy (old_logprobs = sampler, truncated importance sampling), and every
    update's weights must reach the rollout servers for the bound to hold."""
    if not async_depth:
        return []
    out = []
    if old_logprobs == "trainer":
        out.append(("training.old_logprobs", f'old_logprobs = "trainer" with training.async_depth = {async_depth}: '
                    "rollouts sampled by older weights need the sampler's logprobs as the behaviour policy",
                    'set old_logprobs = "sampler" (or leave it unset), or async_depth = 0'))  # fmt: skip
    if weight_sync_interval is not None and weight_sync_interval > 1:
        out.append(("training.weight_sync_interval", f"weight_sync_interval = {weight_sync_interval} with "
                    f"training.async_depth = {async_depth}: rollouts would lag more than async_depth versions "
                    "and be dropped", "set weight_sync_interval = 1, or async_depth = 0"))  # fmt: skip
    return out


def _refuse(problems: list[tuple[str, str, str]]) -> None:
    if problems:
        raise ValueError("; ".join(f"{field}: {message} (fix: {fix})" for field, message, fix in problems))


# ------------------------------------------------------------------------------------------ models


class ParallelSettings(BaseModel):
    """hyperparameters.parallelism (synth) or training.parallelism: sharding and precision."""

    model_config = ConfigDict(extra="ignore")

    use_deepspeed: bool = Field(False, description="Train with DeepSpeed ZeRO.")
    deepspeed_stage: int = Field(2, ge=0, le=3, description="ZeRO stage.")
    fsdp: bool = Field(False, description="FSDP2 sharding (RL full fine-tuning only).")
    bf16: bool | None = Field(None, description="None: bf16 exactly where the hardware has it natively.")
    force_bf16: bool = Field(False, description="bf16 even where it is emulated (slow).")
    activation_checkpointing: bool = Field(False, description="Gradient checkpointing.")
    deepspeed_config: dict[str, Any] = Field(
        default_factory=dict, description="deepspeed_config: merged into the DeepSpeed config (use_deepspeed)."
    )

    @classmethod
    def from_config(cls, raw: dict[str, Any] | None) -> ParallelSettings:
        raw = {k: v for k, v in (raw or {}).items() if v is not None}
        known = {k: raw.pop(k) for k in list(raw) if k in cls.model_fields}  # the other keys do nothing here
        known = {k: (bool(v) if k in ("use_deepspeed", "fsdp", "force_bf16") else v) for k, v in known.items()}
        return cls(**known)

    def precision(self, lora_policy: bool = False) -> Any:
        """The dtypes of this run on this machine (posttrain.hardware's decision table)."""
        from posttrain import hardware

        return hardware.plan(self.bf16, self.force_bf16, lora_policy)


class Resolved(BaseModel):
    """A model resolved from a normalised config: each field from its Keys, then `derived`."""

    model_config = ConfigDict(extra="allow")  # a newer operator may write fields an older trainer lacks

    @classmethod
    def resolve(cls, config: dict[str, Any]) -> Self:
        """A normalised config -> the settings: each field from its Keys, then the lookups no key list says."""
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            for path in keys_of(info):
                value = lookup(config, path)
                if value is not None:
                    values[name] = value
                    break
        if "rollout" in cls.model_fields:
            values["rollout"] = RolloutSettings.from_config(config)
        values.update(cls.derived(config, values))
        return cls.model_validate(values)

    @classmethod
    def derived(cls, config: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
        return {}


class TrainerSettings(Resolved):
    """What every algorithm's model shares."""

    algorithm: str
    trainer: ClassVar[str]  # the posttrain_trainer module that runs it

    keep_checkpoints: Annotated[Keep, Keys("training.keep_checkpoints")] = Field(
        3, description="Newest checkpoints kept in S3; 0 keeps all."
    )
    report_to: Annotated[ReportTo, Keys("training.report_to")] = None


class OnlineSettings(TrainerSettings):
    """What the algorithms that sample from the policy share (GSPO, DAPO, ReST-EM): the task app's
    requests, and the weights pushed to the rollout servers."""

    rollout: RolloutSettings = Field(default_factory=RolloutSettings, description="The task app's requests.")
    keep_weight_versions: Annotated[Keep, Keys("training.keep_weight_versions")] = Field(
        2, description="Newest synced weight versions kept, locally and in S3; 0 keeps all (never the served one)."
    )
    weight_sync_format: Annotated[SyncFormat, Keys("training.weight_sync.format")] = Field(
        "full", description='"lora": a LoRA policy syncs its adapter only; else the merged full weights.'
    )


def _eval_seeds(value: Any) -> list[int]:
    """evaluation.seeds: a list, or a "lo-hi" range string."""
    seeds = value or []
    if isinstance(seeds, str):  # "100-199"
        lo, _, hi = seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
    return [int(s) for s in seeds]


def _pick(*keys: str) -> Keys:
    """[training] then [algorithm] (synth puts some keys there), each key in order."""
    return Keys(*(f"training.{k}" for k in keys), *(f"algorithm.{k}" for k in keys))


class GSPOSettings(OnlineSettings):
    """GSPO (posttrain_trainer.rl): iterations = num_epochs x iterations_per_epoch."""

    algorithm: Literal["gspo"] = "gspo"
    variety: ClassVar[str] = "gspo"
    title: ClassVar[str] = "GSPO"
    method: ClassVar[str] = "policy_gradient"
    trainer: ClassVar[str] = "rl"
    needs_groups: ClassVar[bool] = True  # rewards are normalised within a group: group_size >= 2

    # training.num_epochs .. learning_rate are required by the TOML schema; the defaults serve job files
    # built by hand (tests, tools)
    num_epochs: Annotated[Epochs, _pick("num_epochs")] = Field(1, description="training.num_epochs.")
    iterations_per_epoch: Annotated[Iterations, _pick("iterations_per_epoch")] = Field(
        1, description="training.iterations_per_epoch."
    )
    batch_size: Annotated[Count, _pick("batch_size")] = Field(1, description="Prompts (task seeds) per iteration.")
    group_size: Annotated[GroupSize, _pick("group_size")] = Field(
        2, description="Rollouts per prompt; rewards are normalised within a group (>= 2)."
    )
    learning_rate: Annotated[LearningRate, _pick("learning_rate")] = Field(1e-5, description="Peak learning rate (AdamW).")
    num_minibatches: Annotated[Count, _pick("num_minibatches", "minibatches")] = Field(
        4, description="Mini-batches (optimizer steps) per iteration; also `minibatches`."
    )
    eps_low: Annotated[Fraction, _pick("eps_low", "clip_eps_low")] = Field(
        EPS_LOW, description="Lower clip of the ratio (1 - eps_low); also clip_eps_low."
    )
    eps_high: Annotated[Fraction, _pick("eps_high", "clip_eps_high")] = Field(
        EPS_HIGH, description="Upper clip of the ratio (1 + eps_high); also clip_eps_high."
    )
    beta: Annotated[NonNegative, _pick("beta", "kl_beta", "kl_coef")] = Field(
        0.0, description="KL coefficient against the reference (also kl_beta, kl_coef); 0 = no reference."
    )
    micro_batch: Annotated[Count, _pick("micro_batch", "per_device_batch")] = Field(
        4, description="Sequences per forward pass (per_device_batch)."
    )
    max_grad_norm: Annotated[Positive | None, _pick("max_grad_norm")] = Field(
        1.0, description="Gradient clipping; None = off."
    )
    warmup_ratio: Annotated[Fraction, _pick("warmup_ratio")] = Field(
        0.0, description="Share of optimizer steps spent warming up."
    )
    lr_scheduler: Annotated[Text, _pick("lr_scheduler")] = Field(
        "constant_with_warmup", description="Learning-rate schedule (posttrain_trainer.optim)."
    )
    weight_sync_interval: Annotated[
        Iterations, Keys("training.weight_sync_interval", "training.weight_sync.weight_sync_interval")
    ] = Field(1, description="Push the weights to the rollout servers every N iterations.")
    skip_zero_advantage: Annotated[bool, _pick("skip_zero_advantage")] = Field(
        True, description="Drop sequences with advantage 0 (uniform groups) when beta = 0: no gradient."
    )
    temperature: float = Field(
        1.0, gt=0, description="Sampling temperature (rollout.policy_config, else policy), also used in logprobs."
    )
    seed: Annotated[Seed, _pick("seed")] = Field(0, description="Seed of the trainer's RNGs and the mini-batch shuffle.")
    seed_start: Annotated[Seed, Keys("data.seed_start", "training.seed_start")] = Field(
        0, description="data.seed_start: the first task seed."
    )
    eval_every: Annotated[Iterations | None, Keys("evaluation.every_n_iters")] = Field(
        None, description="evaluation.every_n_iters; None = no periodic eval."
    )
    eval_seeds: list[int] = Field(default_factory=list, description="evaluation.seeds (a list or a 'lo-hi' range).")
    eval_instances: Annotated[Count | None, Keys("evaluation.instances")] = Field(
        None, description="evaluation.instances: episodes of a sampled evaluation (None: one per seed)."
    )
    eval_temperature: Annotated[Temperature, Keys("evaluation.temperature")] = Field(
        0.0, description="evaluation.temperature; 0 = greedy."
    )
    overlong: Annotated[Overlong, Keys("training.overlong")] = Field(
        "keep", description=f"Truncated rollouts: one of {', '.join(OVERLONG_TREATMENTS)}."
    )
    overlong_penalty: Annotated[OverlongPenalty, Keys("training.overlong_penalty")] = Field(
        DEFAULT_OVERLONG_PENALTY,
        description="Reward added to truncated rollouts (<= 0); under overlong = shaped, the full penalty of a "
        "response at max_tokens.",
    )
    overlong_buffer: Annotated[Count | None, Keys("training.overlong_buffer")] = Field(
        None,
        description="overlong = shaped: the last this many tokens before max_tokens, over which the penalty "
        "ramps from 0 to overlong_penalty (DAPO's L_cache); default a fifth of max_tokens.",
    )
    max_response_tokens: Annotated[Tokens, Keys("rollout.policy_config.max_tokens", "policy.max_tokens")] = Field(512, description="Sampling's max_tokens per call: where overlong = shaped's ramp ends.")
    dynamic_sampling: Annotated[bool, Keys("training.dynamic_sampling")] = Field(
        False,
        description="Drop groups whose rewards are all equal (no signal) and sample more prompts until "
        "batch_size groups carry signal, or max_sampling_rounds (DAPO's dynamic sampling); a further round "
        "samples as many groups as the signal rate so far says are missing, at most batch_size.",
    )
    max_sampling_rounds: Annotated[Count, Keys("training.max_sampling_rounds")] = Field(
        3, description="dynamic_sampling: rounds of sampling per iteration at most (the first included)."
    )
    old_logprobs: Annotated[OldLogprobs, _pick("old_logprobs")] = Field(
        "trainer",
        description="The ratio's old logprobs: trainer (recomputed) or sampler (vLLM's captured logprobs as "
        "the behaviour policy, with truncated importance sampling).",
    )
    tis_cap: Annotated[TisCap, _pick("tis_cap")] = Field(
        DEFAULT_TIS_CAP, description="Cap of the truncated importance weight (>= 1)."
    )
    gspo_variant: Annotated[GspoVariant, _pick("gspo_variant")] = Field(
        "sequence", description="sequence (GSPO) or token (GSPO-token)."
    )
    async_depth: Annotated[AsyncDepth, Keys("training.async_depth")] = Field(
        0,
        description="Sample iteration k+1 with the weights of k while updating to k+1; rollouts more than this "
        "many weight versions behind are dropped (0: sample, then update).",
    )
    trainer_mode: TrainerMode = Field("full", description="full, lora or qlora.")
    lora: dict[str, Any] = Field(default_factory=dict, description="LoRA settings (r, alpha, dropout, target_modules).")
    parallel: ParallelSettings = Field(default_factory=ParallelSettings, description="hyperparameters.parallelism.")
    judge: JudgeSettings = Field(
        default_factory=JudgeSettings, description="[judge] and [rubric]: the reward blend and the judge it calls."
    )

    @property
    def iterations(self) -> int:
        return self.num_epochs * self.iterations_per_epoch

    @property
    def overlong_ramp(self) -> int:
        """overlong = shaped: tokens over which the penalty ramps up (DAPO's L_cache)."""
        return self.overlong_buffer or max(1, self.max_response_tokens // 5)

    @classmethod
    def derived(cls, config: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
        temperature = next((v for v in (lookup(config, "rollout.policy_config.temperature"),
                                        lookup(config, "policy.temperature")) if v is not None), 1.0)  # fmt: skip
        training = _table(config, "training")
        lora = training.get("lora") if isinstance(training.get("lora"), dict) else _table(config, "lora")
        return {
            "temperature": temperature if temperature > 0 else 1.0,  # greedy sampling: logprobs at 1
            "eval_seeds": _eval_seeds(lookup(config, "evaluation.seeds")),
            "trainer_mode": trainer_mode(config),
            "lora": dict(lora or {}),
            "parallel": ParallelSettings.from_config(
                _table(config, "hyperparameters.parallelism") or training.get("parallelism")
            ),
            "judge": JudgeSettings.resolve(config),
            # asynchronous sampling: the sampler is the behaviour policy unless the config says otherwise
            **({"old_logprobs": "sampler"} if found.get("async_depth") and "old_logprobs" not in found else {}),
        }

    @model_validator(mode="after")
    def _rules(self) -> Self:
        problems = fsdp_problems(self.parallel.fsdp, self.parallel.use_deepspeed, self.trainer_mode)
        problems += async_problems(self.async_depth, self.old_logprobs, self.weight_sync_interval)
        if self.needs_groups:
            problems += group_problems(self.group_size)
        _refuse(problems)
        return self


class DAPOSettings(GSPOSettings):
    """DAPO (Yu et al. 2025, arXiv:2503.14476, "DAPO: An Open-Source LLM Reinforcement Learning System at
    Scale") on GSPO's loop (posttrain_trainer.rl): clip-higher (eps_high > eps_low, per-token ratios), a
    token-level loss (every token of a mini-batch weighs the same: gspo.gspo_terms variant "dapo"), dynamic
    sampling of groups with signal, and overlong reward shaping (the penalty ramps up over the last
    overlong_buffer tokens before max_tokens)."""

    algorithm: Literal["dapo"] = "dapo"  # type: ignore[assignment]
    variety: ClassVar[str] = "dapo"
    title: ClassVar[str] = "DAPO"

    eps_low: Annotated[Fraction, _pick("eps_low", "clip_eps_low")] = Field(
        0.2, description="Lower clip of the per-token ratio (1 - eps_low)."
    )
    eps_high: Annotated[Fraction, _pick("eps_high", "clip_eps_high")] = Field(
        0.28, description="Upper clip of the per-token ratio (1 + eps_high): clip-higher, above eps_low."
    )
    gspo_variant: Literal["dapo"] = Field(  # type: ignore[assignment]
        "dapo", description="DAPO's token-level loss (not read from the config)."
    )
    overlong: Annotated[Overlong, Keys("training.overlong")] = Field(
        "shaped", description=f"Truncated rollouts: one of {', '.join(OVERLONG_TREATMENTS)} (DAPO: shaped)."
    )
    dynamic_sampling: Annotated[bool, Keys("training.dynamic_sampling")] = Field(
        True, description="Drop groups without reward variance and sample more prompts (DAPO: on)."
    )


class RestemSettings(OnlineSettings):
    """ReST-EM (posttrain_trainer.restem_job): N iterations of E-step, M-step, sync, eval."""

    algorithm: Literal["restem"] = "restem"
    variety: ClassVar[str] = "restem"
    title: ClassVar[str] = "ReST-EM"
    method: ClassVar[str] = "restem"
    trainer: ClassVar[str] = "restem_job"
    needs_groups: ClassVar[bool] = False

    num_epochs: Annotated[Epochs, Keys("training.num_epochs")] = Field(1, description="training.num_epochs.")
    iterations_per_epoch: Annotated[Iterations, Keys("training.iterations_per_epoch")] = Field(
        1, description="training.iterations_per_epoch."
    )
    prompts: Annotated[Count, Keys("training.batch_size")] = Field(
        8, description="training.batch_size: prompts (seeds) per E-step."
    )
    samples_per_prompt: Annotated[GroupSize, Keys("training.group_size")] = Field(
        4, description="training.group_size: K samples per prompt."
    )
    reward_threshold: Annotated[Reward, Keys("training.reward_threshold")] = Field(
        1.0, description="Samples with a reward at or above it are kept for the M-step."
    )
    max_per_prompt: Annotated[Count | None, Keys("training.max_per_prompt")] = Field(
        None, description="At most this many distinct kept samples per prompt; None = all."
    )
    learning_rate: Annotated[LearningRate, Keys("training.learning_rate")] = Field(1e-5, description="M-step learning rate (AdamW).")
    sft_epochs: Annotated[Count, Keys("training.sft_epochs")] = Field(2, description="M-step passes over the kept samples.")
    sft_batch_size: Annotated[Count, Keys("training.sft_batch_size")] = Field(8, description="M-step global batch (all ranks).")
    micro_batch: Annotated[Count, Keys("training.micro_batch")] = Field(
        4, description="Largest per-forward batch (see restem_job.micro_batch_for)."
    )
    warmup_ratio: Annotated[Fraction, Keys("training.warmup_ratio")] = Field(0.0, description="Share of M-step steps spent warming up.")
    lr_scheduler: Annotated[Text, Keys("training.lr_scheduler")] = Field("linear", description="M-step learning-rate schedule.")
    max_grad_norm: Annotated[Positive | None, Keys("training.max_grad_norm")] = Field(
        1.0, description="Gradient clipping; None = off."
    )
    seed: Annotated[Seed, Keys("training.seed")] = Field(0, description="Seed of the RNGs and the M-step data order.")
    seed_start: Annotated[Seed, Keys("data.seed_start", "training.seed_start")] = Field(
        0, description="data.seed_start: the first task seed."
    )
    eval_every: Annotated[Iterations, Keys("evaluation.every_n_iters")] = Field(1, description="evaluation.every_n_iters.")
    eval_seeds: list[int] = Field(default_factory=list, description="evaluation.seeds (a list or a 'lo-hi' range).")
    eval_instances: Annotated[Count | None, Keys("evaluation.instances")] = Field(
        None, description="evaluation.instances: episodes of a sampled evaluation (None: one per seed)."
    )
    eval_temperature: Annotated[Temperature, Keys("evaluation.temperature")] = Field(
        0.0, description="evaluation.temperature; 0 = greedy."
    )
    trainer_mode: TrainerMode = Field("full", description="full or lora.")
    lora: dict[str, Any] = Field(default_factory=dict, description="LoRA settings (r, alpha, dropout, target_modules).")
    parallel: ParallelSettings = Field(default_factory=ParallelSettings, description="training.parallelism.")

    @property
    def iterations(self) -> int:
        return self.num_epochs * self.iterations_per_epoch

    @classmethod
    def derived(cls, config: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
        training = _table(config, "training")
        lora = training.get("lora") if isinstance(training.get("lora"), dict) else _table(config, "lora")
        return {
            "eval_seeds": _eval_seeds(lookup(config, "evaluation.seeds")),
            "trainer_mode": trainer_mode(config),
            "lora": dict(lora or {}),
            "parallel": ParallelSettings.from_config(training.get("parallelism")),
        }


def _eval_key(key: str) -> Keys:
    return Keys(f"training.validation.{key}", f"hyperparameters.{key}", f"hyperparameters.parallelism.{key}")


class ValidationSettings(Resolved):
    """SFT's held-out evaluation, best-model tracking and early stopping: synth's training.validation keys,
    also read from hyperparameters and hyperparameters.parallelism (where synth's TOML scoping puts them)."""

    enabled: Annotated[bool, _eval_key("enabled")] = Field(False, description="Evaluate on the validation set.")
    strategy: Annotated[str, _eval_key("evaluation_strategy")] = Field(
        "steps", description="evaluation_strategy: steps, epoch or no."
    )
    eval_steps: Annotated[Iterations | None, _eval_key("eval_steps")] = Field(
        None, description="Evaluate every N optimizer steps (strategy steps); None: at each epoch's end only."
    )
    save_best_model_at_end: Annotated[bool, _eval_key("save_best_model_at_end")] = Field(
        False, description="End with the weights of the best evaluation, not the last step."
    )
    metric: Annotated[str, _eval_key("metric_for_best_model")] = Field(
        "val.loss", description="metric_for_best_model: a loss name, perplexity or token_accuracy."
    )
    greater_is_better: Annotated[bool, _eval_key("greater_is_better")] = Field(
        False, description="Whether a larger metric is better."
    )
    patience: Annotated[Count | None, _eval_key("early_stopping_patience")] = Field(
        None, description="early_stopping_patience: stop after N evaluations without improvement; None = never."
    )
    threshold: Annotated[NonNegative, _eval_key("early_stopping_threshold")] = Field(
        0.0, description="early_stopping_threshold: the least change that counts as improvement."
    )

    @classmethod
    def derived(cls, config: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
        return {"enabled": bool(found.get("enabled", bool(found)))}  # on when any of its keys is given

    @model_validator(mode="after")
    def _metric(self) -> Self:
        if self.metric.lower() not in SFT_METRICS:
            raise ValueError(f"metric_for_best_model {self.metric!r} is not one this trainer computes "
                             "(val.loss, perplexity, token_accuracy)")  # fmt: skip
        return self


SFT_EVAL_KEYS = tuple(keys_of(info)[0].rpartition(".")[2] for info in ValidationSettings.model_fields.values())


class SFTSettings(TrainerSettings):
    """Supervised fine-tuning (posttrain_trainer.sft)."""

    algorithm: Literal["sft"] = "sft"
    trainer: ClassVar[str] = "sft"

    trainer_mode: TrainerMode = Field("full", description="full, lora or qlora.")
    lora: dict[str, Any] = Field(default_factory=dict, description="LoRA settings (r, alpha, dropout, target_modules).")
    n_epochs: Annotated[SFTEpochs, Keys("hyperparameters.n_epochs")] = Field(1, description="hyperparameters.n_epochs.")
    max_steps: Annotated[
        Steps | None, Keys("hyperparameters.total_steps", "hyperparameters.train_steps", "hyperparameters.steps")
    ] = Field(
        None, description="total_steps | train_steps | steps: caps n_epochs when both are given, else replaces it."
    )
    epochs_given: bool = Field(False, description="hyperparameters.n_epochs is set (> 0): it caps max_steps.")
    per_device_batch: Annotated[Count | None, Keys("hyperparameters.per_device_batch")] = Field(
        None, description="Examples per forward pass on each rank (else batch_size)."
    )
    batch_size: Annotated[Count | None, Keys("hyperparameters.batch_size")] = Field(
        None, description="Examples per forward pass on each rank when per_device_batch is unset."
    )
    global_batch: Annotated[Count | None, Keys("hyperparameters.global_batch")] = Field(
        None, description="Examples per optimizer step over all ranks (wins: split into ranks, then accumulation)."
    )
    gradient_accumulation_steps: Annotated[Count | None, Keys("hyperparameters.gradient_accumulation_steps")] = Field(
        None, description="Micro-batches per optimizer step (default 1)."
    )
    sequence_length: Annotated[Tokens, Keys("hyperparameters.sequence_length")] = Field(
        2048, description="Longest tokenized example; longer are cut."
    )
    learning_rate: Annotated[LearningRate, Keys("hyperparameters.learning_rate")] = Field(
        1e-5, description="Peak learning rate (default 1e-4 for LoRA, 1e-5 for full)."
    )
    warmup_ratio: Annotated[Fraction, Keys("hyperparameters.warmup_ratio")] = Field(
        0.0, description="Share of steps spent warming up."
    )
    weight_decay: Annotated[Fraction, Keys("hyperparameters.weight_decay")] = Field(0.0, description="AdamW weight decay.")
    scheduler: Annotated[Text, Keys("hyperparameters.lr_scheduler_type", "hyperparameters.lr_scheduler")] = Field(
        "linear", description="lr_scheduler_type | lr_scheduler (posttrain_trainer.optim)."
    )
    seed: Annotated[Seed, Keys("hyperparameters.seed")] = Field(42, description="Seed of the RNGs and the data order.")
    max_grad_norm: Annotated[Positive, Keys("hyperparameters.max_grad_norm")] = Field(
        1.0, description="Gradient clipping."
    )
    parallel: ParallelSettings = Field(default_factory=ParallelSettings, description="hyperparameters.parallelism.")
    validation: ValidationSettings = Field(default_factory=ValidationSettings, description="Evaluation and early stopping.")
    validation_path: str | None = Field(None, description="data.validation_path (when the job file's dataset has none).")
    max_images_per_message: Annotated[
        Count | None, Keys("model.max_images_per_message", "policy.max_images_per_message",
                           "hyperparameters.max_images_per_message")  # fmt: skip
    ] = Field(None, description="Vision models: extra images per message are trimmed.")

    def batch_keys(self) -> dict[str, int]:
        """The batch keys the job gives (posttrain_trainer.optim.BatchPlan.from_hyperparameters)."""
        keys = ("per_device_batch", "batch_size", "global_batch", "gradient_accumulation_steps")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}

    @classmethod
    def derived(cls, config: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
        hp = _table(config, "hyperparameters")
        training = _table(config, "training")
        parallel_raw = {k: v for k, v in (hp.get("parallelism") or {}).items() if k not in SFT_EVAL_KEYS}
        lora = dict(training.get("lora") or _table(config, "lora"))
        for key in ("r", "alpha", "dropout", "target_modules"):  # synth drops hyperparameters.lora_*; we honour them
            if f"lora_{key}" in hp and key not in lora:
                lora[key] = hp[f"lora_{key}"]
        if "lora_rank" in hp and "r" not in lora:
            lora["r"] = hp["lora_rank"]
        steps = hp.get("total_steps") or hp.get("train_steps") or hp.get("steps")
        mode = trainer_mode(config)
        return {
            "trainer_mode": mode,
            "lora": lora,
            "n_epochs": hp.get("n_epochs") or 1,
            "max_steps": steps or None,
            "epochs_given": bool(hp.get("n_epochs")),
            "sequence_length": hp.get("sequence_length") or 2048,
            "learning_rate": hp.get("learning_rate") or (1e-4 if mode != "full" else 1e-5),
            "warmup_ratio": hp.get("warmup_ratio") or 0.0,
            "weight_decay": hp.get("weight_decay") or 0.0,
            "parallel": ParallelSettings.from_config(parallel_raw),
            "validation": ValidationSettings.resolve(config),
            "validation_path": lookup(config, "data.validation_path"),
            **({"max_images_per_message": None} if not found.get("max_images_per_message") else {}),
        }


LORA_SPELLINGS = frozenset({"lora", "qlora", "peft"})


def trainer_mode(config: dict[str, Any]) -> TrainerMode:
    """full, lora or qlora of a normalised RL or SFT config: the one derivation (the trainer's settings, the
    artifacts manifest, the job's status, the rendered servers and the local runner all use it).

    [model] (or [policy]) trainer_mode wins when given; else any LoRA spelling makes it lora:
    training.mode = "lora" | "qlora" | "peft", training.use_qlora = true, algorithm.variety = "lora" |
    "qlora", hyperparameters.train_kind = "peft". A LoRA is a QLoRA when any of training.mode = "qlora",
    training.use_qlora = true, algorithm.variety = "qlora" or trainer_mode = "qlora" says so."""
    training, hp = _table(config, "training"), _table(config, "hyperparameters")
    variety = str(lookup(config, "algorithm.variety") or "").lower()
    mode = str(training.get("mode") or "").lower()
    explicit = str(_table(config, "model").get("trainer_mode") or _table(config, "policy").get("trainer_mode") or "")
    explicit = explicit.lower()
    use_qlora = training.get("use_qlora") is True
    qlora = use_qlora or "qlora" in (mode, variety, explicit)
    if explicit in ("full", "lora", "qlora"):
        lora = explicit != "full"
    else:
        lora = (use_qlora or mode in LORA_SPELLINGS or variety in LORA_SPELLINGS
                or str(hp.get("train_kind") or "").lower() == "peft")  # fmt: skip
    if not lora:
        return "full"
    return "qlora" if qlora else "lora"


# ------------------------------------------------------------------------------------------ registry

# RL varieties ([algorithm] variety), each with its settings model; posttrain.api.config accepts exactly
# these (type "online", the model's method), the CRD's CEL rule is written from them.
RL_ALGORITHMS: dict[str, type[GSPOSettings] | type[RestemSettings]] = {
    GSPOSettings.variety: GSPOSettings,
    RestemSettings.variety: RestemSettings,
    DAPOSettings.variety: DAPOSettings,
}
AnySettings = Annotated[
    GSPOSettings | DAPOSettings | RestemSettings | SFTSettings, Field(discriminator="algorithm")
]


def rl_settings_class(config: dict[str, Any]) -> type[GSPOSettings] | type[RestemSettings]:
    variety = str(lookup(config, "algorithm.variety") or "").lower()
    return RL_ALGORITHMS.get(variety, GSPOSettings)


def settings_for(kind: str, config: dict[str, Any]) -> GSPOSettings | RestemSettings | SFTSettings:
    """The trainer settings of a normalised config; pydantic.ValidationError when a value breaks a bound or
    a rule (the message names the setting)."""
    if kind == "sft":
        return SFTSettings.resolve(config)
    return rl_settings_class(config).resolve(config)
