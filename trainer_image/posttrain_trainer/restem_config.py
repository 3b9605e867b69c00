"""The ReST-EM trainer's settings, read from an RL job file whose [algorithm] variety is "restem"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain_trainer import distributed as D
from posttrain_trainer.rl_config import parse_eval_seeds
from posttrain_trainer.rollouts import section


class RestemConfigError(ValueError):
    pass


@dataclass
class RestemTrainerConfig:
    """Settings of one ReST-EM run (N iterations of E-step, M-step, sync, eval)."""

    iterations: int = field(
        default=1, metadata={"help": "training.num_epochs x training.iterations_per_epoch."}
    )
    prompts: int = field(default=8, metadata={"help": "training.batch_size: prompts (seeds) per E-step."})
    samples_per_prompt: int = field(
        default=4, metadata={"help": "training.group_size: K samples per prompt."}
    )
    reward_threshold: float = field(
        default=1.0, metadata={"help": "Samples with a reward at or above it are kept for the M-step."}
    )
    max_per_prompt: int | None = field(
        default=None, metadata={"help": "At most this many distinct kept samples per prompt; None = all."}
    )
    learning_rate: float = field(default=1e-5, metadata={"help": "M-step learning rate (AdamW)."})
    sft_epochs: int = field(default=2, metadata={"help": "M-step passes over the kept samples."})
    sft_batch_size: int = field(default=8, metadata={"help": "M-step global batch (all ranks)."})
    micro_batch: int = field(
        default=4, metadata={"help": "Largest per-forward batch (see restem_job.micro_batch_for)."}
    )
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of M-step steps spent warming up."})
    lr_scheduler: str = field(default="linear", metadata={"help": "M-step learning-rate schedule."})
    max_grad_norm: float | None = field(default=1.0, metadata={"help": "Gradient clipping; None = off."})
    seed: int = field(default=0, metadata={"help": "Seed of the RNGs and the M-step data order."})
    seed_start: int = field(default=0, metadata={"help": "data.seed_start: the first task seed."})
    eval_every: int = field(default=1, metadata={"help": "evaluation.every_n_iters."})
    eval_seeds: list[int] = field(
        default_factory=list, metadata={"help": "evaluation.seeds (a list or a 'lo-hi' range)."}
    )
    eval_instances: int = field(
        default=0, metadata={"help": "evaluation.instances: episodes of a sampled evaluation."}
    )
    eval_temperature: float = field(default=0.0, metadata={"help": "evaluation.temperature; 0 = greedy."})
    trainer_mode: str = field(default="full", metadata={"help": "full or lora."})
    lora: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "LoRA settings (r, alpha, dropout, target_modules)."}
    )
    parallel: D.ParallelConfig = field(
        default_factory=D.ParallelConfig, metadata={"help": "training.parallelism."}
    )


def parse_restem_config(config: dict[str, Any]) -> RestemTrainerConfig:
    training = section(config, "training")
    evaluation = section(config, "evaluation")
    model = section(config, "model") or section(config, "policy")
    data = section(config, "data")

    def get(key: str, default: Any) -> Any:
        value = training.get(key)
        return default if value is None else value

    lora = training.get("lora") if isinstance(training.get("lora"), dict) else section(config, "lora")
    cfg = RestemTrainerConfig(
        iterations=int(get("num_epochs", 1)) * int(get("iterations_per_epoch", 1)),
        prompts=int(get("batch_size", 8)),
        samples_per_prompt=int(get("group_size", 4)),
        reward_threshold=float(get("reward_threshold", 1.0)),
        max_per_prompt=int(training["max_per_prompt"]) if training.get("max_per_prompt") else None,
        learning_rate=float(get("learning_rate", 1e-5)),
        sft_epochs=int(get("sft_epochs", 2)),
        sft_batch_size=int(get("sft_batch_size", 8)),
        micro_batch=int(get("micro_batch", 4)),
        warmup_ratio=float(get("warmup_ratio", 0.0)),
        lr_scheduler=str(get("lr_scheduler", "linear")),
        max_grad_norm=get("max_grad_norm", 1.0),
        seed=int(get("seed", 0)),
        seed_start=int(data.get("seed_start") or training.get("seed_start") or 0),
        eval_every=int(evaluation.get("every_n_iters") or 1),
        eval_seeds=parse_eval_seeds(evaluation),
        eval_instances=int(evaluation.get("instances") or 0),
        eval_temperature=float(evaluation.get("temperature") or 0.0),
        trainer_mode=str(model.get("trainer_mode") or "full"),
        lora=dict(lora or {}),
        parallel=D.ParallelConfig.from_config(training.get("parallelism")),
    )
    if cfg.iterations < 1 or cfg.prompts < 1 or cfg.samples_per_prompt < 1:
        raise RestemConfigError("ReST-EM needs iterations, batch_size and group_size >= 1")
    if cfg.sft_epochs < 1 or cfg.sft_batch_size < 1 or cfg.micro_batch < 1:
        raise RestemConfigError("training.sft_epochs, sft_batch_size and micro_batch must be >= 1")
    return cfg
