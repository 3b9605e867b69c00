"""The GSPO trainer's settings, read from the job file's (synth) RL config.

Named apart from posttrain.api's RLConfig (the pydantic TOML model): this is what the trainer uses after
the lenient lookups below. Keys beyond synth's typed schema are read from [training] then [algorithm]."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from posttrain_trainer import distributed as D
from posttrain_trainer import gspo, offpolicy
from posttrain_trainer.rollouts import section


class RLConfigError(ValueError):
    pass


# [training].overlong: what happens to a rollout whose response stopped at max_tokens (finish_reason "length").
#   keep    - trained like any other on the task's reward (the default: see rl.sequences_from_results)
#   mask    - its reward still counts in its group's advantages, its tokens carry no loss (DAPO's overlong
#             filtering)
#   penalty - [training].overlong_penalty is added to its reward before the group advantages (DAPO's overlong
#             punishment, as a constant rather than DAPO's length ramp)
OVERLONG_TREATMENTS = ("keep", "mask", "penalty")
DEFAULT_OVERLONG_PENALTY = -1.0


@dataclass
class RLTrainerConfig:
    """Settings of one GSPO run (iterations = num_epochs x iterations_per_epoch)."""

    num_epochs: int = field(default=1, metadata={"help": "training.num_epochs."})
    iterations_per_epoch: int = field(default=1, metadata={"help": "training.iterations_per_epoch."})
    batch_size: int = field(default=1, metadata={"help": "Prompts (task seeds) per iteration."})
    group_size: int = field(
        default=2, metadata={"help": "Rollouts per prompt; rewards are normalised within a group (>= 2)."}
    )
    learning_rate: float = field(default=1e-5, metadata={"help": "Peak learning rate (AdamW)."})
    num_minibatches: int = field(
        default=4, metadata={"help": "Mini-batches (optimizer steps) per iteration; also `minibatches`."}
    )
    eps_low: float = field(
        default=gspo.EPS_LOW, metadata={"help": "Lower clip of the sequence ratio (1 - eps_low)."}
    )
    eps_high: float = field(
        default=gspo.EPS_HIGH, metadata={"help": "Upper clip of the sequence ratio (1 + eps_high)."}
    )
    beta: float = field(
        default=0.0,
        metadata={"help": "KL coefficient against the reference (also kl_beta, kl_coef); 0 = no reference."},
    )
    micro_batch: int = field(default=4, metadata={"help": "Sequences per forward pass (per_device_batch)."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Gradient clipping; None = off."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of optimizer steps spent warming up."})
    lr_scheduler: str = field(
        default="constant_with_warmup", metadata={"help": "Learning-rate schedule (posttrain_trainer.optim)."}
    )
    weight_sync_interval: int = field(
        default=1, metadata={"help": "Push the weights to the rollout servers every N iterations."}
    )
    skip_zero_advantage: bool = field(
        default=True,
        metadata={"help": "Drop sequences with advantage 0 (uniform groups) when beta = 0: no gradient."},
    )
    temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature (rollout.policy_config), also used in logprobs."}
    )
    seed: int = field(default=0, metadata={"help": "Seed of the trainer's RNGs and the mini-batch shuffle."})
    seed_start: int = field(default=0, metadata={"help": "data.seed_start: the first task seed."})
    eval_every: int = field(default=0, metadata={"help": "evaluation.every_n_iters; 0 = no periodic eval."})
    eval_seeds: list[int] = field(
        default_factory=list, metadata={"help": "evaluation.seeds (a list or a 'lo-hi' range)."}
    )
    eval_instances: int = field(
        default=0, metadata={"help": "evaluation.instances: episodes of a sampled evaluation."}
    )
    eval_temperature: float = field(default=0.0, metadata={"help": "evaluation.temperature; 0 = greedy."})
    overlong: str = field(
        default="keep", metadata={"help": f"Truncated rollouts: one of {', '.join(OVERLONG_TREATMENTS)}."}
    )
    overlong_penalty: float = field(
        default=DEFAULT_OVERLONG_PENALTY, metadata={"help": "Reward added to truncated rollouts (<= 0)."}
    )
    old_logprobs: str = field(
        default="trainer",
        metadata={
            "help": "The ratio's old logprobs: trainer (recomputed) or sampler (vLLM's captured logprobs as "
            "the behaviour policy, with truncated importance sampling)."
        },
    )
    tis_cap: float = field(
        default=gspo.DEFAULT_TIS_CAP, metadata={"help": "Cap of the truncated importance weight (>= 1)."}
    )
    gspo_variant: str = field(
        default="sequence", metadata={"help": f"One of {', '.join(gspo.GSPO_VARIANTS)} (GSPO or GSPO-token)."}
    )
    trainer_mode: str = field(default="full", metadata={"help": "full, lora or qlora."})
    lora: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "LoRA settings (r, alpha, dropout, target_modules)."}
    )
    parallel: D.ParallelConfig = field(
        default_factory=D.ParallelConfig, metadata={"help": "hyperparameters.parallelism."}
    )

    @property
    def iterations(self) -> int:
        return self.num_epochs * self.iterations_per_epoch


def _first(*values: Any, default: Any = None) -> Any:
    for value in values:
        if value is not None:
            return value
    return default


def parse_eval_seeds(evaluation: dict[str, Any]) -> list[int]:
    """evaluation.seeds: a list, or a "lo-hi" range string."""
    seeds = evaluation.get("seeds") or []
    if isinstance(seeds, str):  # "100-199"
        lo, _, hi = seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
    return [int(s) for s in seeds]


def parse_rl_config(config: dict[str, Any]) -> RLTrainerConfig:
    training = section(config, "training")
    algorithm = section(config, "algorithm")
    rollout = section(config, "rollout")
    evaluation = section(config, "evaluation")
    model = section(config, "model") or section(config, "policy")
    data = section(config, "data")

    def pick(*keys: str, default: Any = None) -> Any:
        return _first(*(training.get(k) for k in keys), *(algorithm.get(k) for k in keys), default=default)

    group_size = int(pick("group_size", default=2))
    if group_size < 2:
        raise RLConfigError("training.group_size must be >= 2 (GSPO normalises rewards within a group)")
    policy_config = dict(rollout.get("policy_config") or {})
    temperature = float(
        _first(policy_config.get("temperature"), section(config, "policy").get("temperature"), default=1.0)
    )
    mode = str(model.get("trainer_mode") or ("lora" if training.get("mode") == "lora" else "full"))
    lora = training.get("lora") if isinstance(training.get("lora"), dict) else section(config, "lora")
    cfg = RLTrainerConfig(
        num_epochs=int(pick("num_epochs", default=1)),
        iterations_per_epoch=int(pick("iterations_per_epoch", default=1)),
        batch_size=int(pick("batch_size", default=1)),
        group_size=group_size,
        learning_rate=float(pick("learning_rate", default=1e-5)),
        num_minibatches=int(pick("num_minibatches", "minibatches", default=4)),
        eps_low=float(pick("eps_low", "clip_eps_low", default=gspo.EPS_LOW)),
        eps_high=float(pick("eps_high", "clip_eps_high", default=gspo.EPS_HIGH)),
        beta=float(pick("beta", "kl_beta", "kl_coef", default=0.0)),
        micro_batch=int(pick("micro_batch", "per_device_batch", default=4)),
        max_grad_norm=pick("max_grad_norm", default=1.0),
        warmup_ratio=float(pick("warmup_ratio", default=0.0)),
        lr_scheduler=str(pick("lr_scheduler", default="constant_with_warmup")),
        weight_sync_interval=int(
            _first(
                training.get("weight_sync_interval"),
                section(training, "weight_sync").get("weight_sync_interval"),
                default=1,
            )
        ),
        skip_zero_advantage=bool(pick("skip_zero_advantage", default=True)),
        temperature=temperature if temperature > 0 else 1.0,
        seed=int(pick("seed", default=0)),
        seed_start=int(_first(data.get("seed_start"), training.get("seed_start"), default=0)),
        eval_every=int(evaluation.get("every_n_iters") or 0),
        eval_seeds=parse_eval_seeds(evaluation),
        eval_instances=int(evaluation.get("instances") or 0),
        eval_temperature=float(evaluation.get("temperature") or 0.0),
        overlong=str(training.get("overlong") or "keep"),
        overlong_penalty=float(_first(training.get("overlong_penalty"), default=DEFAULT_OVERLONG_PENALTY)),
        old_logprobs=str(pick("old_logprobs", default="trainer")),
        tis_cap=float(pick("tis_cap", default=gspo.DEFAULT_TIS_CAP)),
        gspo_variant=str(pick("gspo_variant", default="sequence")),
        trainer_mode=mode,
        lora=dict(lora or {}),
        parallel=D.ParallelConfig.from_config(
            section(section(config, "hyperparameters"), "parallelism") or training.get("parallelism")
        ),
    )
    _check(cfg)
    return cfg


def _check(cfg: RLTrainerConfig) -> None:
    if cfg.iterations < 1 or cfg.batch_size < 1:
        raise RLConfigError("num_epochs x iterations_per_epoch and batch_size must be >= 1")
    if cfg.overlong not in OVERLONG_TREATMENTS:
        raise RLConfigError(
            f"training.overlong = {cfg.overlong!r}: use one of {', '.join(OVERLONG_TREATMENTS)}"
        )
    if not math.isfinite(cfg.overlong_penalty) or cfg.overlong_penalty > 0:
        raise RLConfigError(f"training.overlong_penalty = {cfg.overlong_penalty}: use a number <= 0")
    if cfg.old_logprobs not in offpolicy.OLD_LOGPROBS:
        raise RLConfigError(
            f"training.old_logprobs = {cfg.old_logprobs!r}: use one of {', '.join(offpolicy.OLD_LOGPROBS)}"
        )
    if not math.isfinite(cfg.tis_cap) or cfg.tis_cap < 1:
        raise RLConfigError(f"training.tis_cap = {cfg.tis_cap}: use a number >= 1")
    if cfg.parallel.fsdp and cfg.parallel.use_deepspeed:
        raise RLConfigError(
            "training.parallelism.fsdp and use_deepspeed are both set: keep one (fsdp = false or "
            "use_deepspeed = false)"
        )
    if cfg.parallel.fsdp and cfg.trainer_mode != "full":
        raise RLConfigError(
            f"training.parallelism.fsdp shards full fine-tuning only, not trainer_mode = {cfg.trainer_mode!r}"
        )
    if cfg.gspo_variant not in gspo.GSPO_VARIANTS:
        raise RLConfigError(
            f"training.gspo_variant = {cfg.gspo_variant!r}: use one of {', '.join(gspo.GSPO_VARIANTS)}"
        )
