"""The SFT trainer's settings, read from the job file's (synth) SFT config.

Named apart from posttrain.api's SFTConfig and ValidationConfig (the pydantic TOML models): these are what the
trainer uses after the lenient lookups below. Eval keys are also read from hyperparameters and
hyperparameters.parallelism (where synth's TOML scoping sometimes puts them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from posttrain_trainer import distributed as D

EVAL_KEYS = (
    "enabled",
    "evaluation_strategy",
    "eval_steps",
    "save_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
    "early_stopping_patience",
    "early_stopping_threshold",
)
LOSS_METRICS = {"val.loss", "val_loss", "eval_loss", "eval.loss", "loss", "validation_loss"}


@dataclass
class ValidationSettings:
    """Held-out evaluation, best-model tracking and early stopping (synth's training.validation keys)."""

    enabled: bool = field(default=False, metadata={"help": "Evaluate on the validation set."})
    strategy: str = field(default="steps", metadata={"help": "evaluation_strategy: steps, epoch or no."})
    eval_steps: int = field(
        default=0, metadata={"help": "Evaluate every N optimizer steps (strategy steps)."}
    )
    save_best_model_at_end: bool = field(
        default=False, metadata={"help": "End with the weights of the best evaluation, not the last step."}
    )
    metric: str = field(
        default="val.loss",
        metadata={"help": "metric_for_best_model: a loss name, perplexity or token_accuracy."},
    )
    greater_is_better: bool = field(default=False, metadata={"help": "Whether a larger metric is better."})
    patience: int | None = field(
        default=None,
        metadata={
            "help": "early_stopping_patience: stop after N evaluations without improvement; None = never."
        },
    )
    threshold: float = field(
        default=0.0,
        metadata={"help": "early_stopping_threshold: the least change that counts as improvement."},
    )


@dataclass
class SFTTrainerConfig:
    """Settings of one SFT run."""

    trainer_mode: str = field(default="full", metadata={"help": "full, lora or qlora."})
    lora: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "LoRA settings (r, alpha, dropout, target_modules)."}
    )
    n_epochs: int = field(default=1, metadata={"help": "hyperparameters.n_epochs."})
    max_steps: int | None = field(
        default=None,
        metadata={
            "help": "total_steps | train_steps | steps: caps n_epochs when both are given, else replaces it."
        },
    )
    hyperparameters: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "The raw hyperparameters (the batch plan reads them)."}
    )
    sequence_length: int = field(
        default=2048, metadata={"help": "Longest tokenized example; longer are cut."}
    )
    learning_rate: float = field(
        default=1e-5, metadata={"help": "Peak learning rate (default 1e-4 for LoRA, 1e-5 for full)."}
    )
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of steps spent warming up."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    scheduler: str = field(
        default="linear", metadata={"help": "lr_scheduler_type | lr_scheduler (posttrain_trainer.optim)."}
    )
    seed: int = field(default=42, metadata={"help": "Seed of the RNGs and the data order."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping."})
    parallel: D.ParallelConfig = field(
        default_factory=D.ParallelConfig, metadata={"help": "hyperparameters.parallelism."}
    )
    validation: ValidationSettings = field(
        default_factory=ValidationSettings, metadata={"help": "Evaluation and early stopping."}
    )
    validation_path: str | None = field(
        default=None, metadata={"help": "data.validation_path (when the job file's dataset has none)."}
    )
    max_images_per_message: int | None = field(
        default=None, metadata={"help": "Vision models: extra images per message are trimmed."}
    )


def _lora_mode(config: dict[str, Any]) -> bool:
    training = config.get("training") or {}
    hp = config.get("hyperparameters") or {}
    algorithm = config.get("algorithm") or {}
    model = config.get("model") or config.get("policy") or {}
    return (
        str(training.get("mode", "")).lower() in ("lora", "qlora", "peft")
        or bool(training.get("use_qlora"))
        or str(hp.get("train_kind", "")).lower() == "peft"
        or str(algorithm.get("variety", "")).lower() in ("lora", "qlora")
        or str(model.get("trainer_mode", "")).lower() in ("lora", "qlora")
    )


def _qlora_mode(config: dict[str, Any]) -> bool:
    training = config.get("training") or {}
    algorithm = config.get("algorithm") or {}
    model = config.get("model") or config.get("policy") or {}
    return (
        str(training.get("mode", "")).lower() == "qlora"
        or bool(training.get("use_qlora"))
        or str(algorithm.get("variety", "")).lower() == "qlora"
        or str(model.get("trainer_mode", "")).lower() == "qlora"
    )


def parse_sft_config(config: dict[str, Any]) -> SFTTrainerConfig:
    hp = dict(config.get("hyperparameters") or {})
    training = config.get("training") or {}
    parallel_raw = dict(hp.get("parallelism") or {})
    val_raw: dict[str, Any] = {}
    for source in (parallel_raw, hp, training.get("validation") or {}):  # later wins
        val_raw.update({k: source[k] for k in EVAL_KEYS if k in source})
    for key in EVAL_KEYS:
        parallel_raw.pop(key, None)
    lora = dict(training.get("lora") or config.get("lora") or {})
    for key in (
        "r",
        "alpha",
        "dropout",
        "target_modules",
    ):  # synth drops hyperparameters.lora_*; we honour them
        if f"lora_{key}" in hp and key not in lora:
            lora[key] = hp[f"lora_{key}"]
    if "lora_rank" in hp and "r" not in lora:
        lora["r"] = hp["lora_rank"]
    steps = hp.get("total_steps") or hp.get("train_steps") or hp.get("steps")
    strategy = str(val_raw.get("evaluation_strategy") or "steps")
    validation = ValidationSettings(
        enabled=bool(val_raw.get("enabled", bool(val_raw))),
        strategy=strategy,
        eval_steps=int(val_raw.get("eval_steps") or 0),
        save_best_model_at_end=bool(val_raw.get("save_best_model_at_end", False)),
        metric=str(val_raw.get("metric_for_best_model") or "val.loss"),
        greater_is_better=bool(val_raw.get("greater_is_better", False)),
        patience=int(val_raw["early_stopping_patience"]) if val_raw.get("early_stopping_patience") else None,
        threshold=float(val_raw.get("early_stopping_threshold") or 0.0),
    )
    if validation.metric.lower() not in LOSS_METRICS | {
        "perplexity",
        "val.perplexity",
        "eval_perplexity",
        "token_accuracy",
        "val.token_accuracy",
    }:
        raise ValueError(
            f"metric_for_best_model {validation.metric!r} is not one this trainer computes "
            "(val.loss, perplexity, token_accuracy)"
        )
    lora_mode = _lora_mode(config)
    model_section = config.get("model") or config.get("policy") or {}
    max_images = model_section.get("max_images_per_message") or hp.get("max_images_per_message")
    return SFTTrainerConfig(
        trainer_mode=("qlora" if _qlora_mode(config) else "lora") if lora_mode else "full",
        lora=lora,
        n_epochs=int(hp.get("n_epochs") or 1),
        max_steps=int(steps) if steps else None,
        hyperparameters=hp,
        sequence_length=int(hp.get("sequence_length") or 2048),
        learning_rate=float(hp.get("learning_rate") or (1e-4 if lora_mode else 1e-5)),
        warmup_ratio=float(hp.get("warmup_ratio") or 0.0),
        weight_decay=float(hp.get("weight_decay") or 0.0),
        scheduler=str(hp.get("lr_scheduler_type") or hp.get("lr_scheduler") or "linear"),
        seed=int(hp.get("seed") or 42),
        max_grad_norm=float(hp.get("max_grad_norm") if hp.get("max_grad_norm") is not None else 1.0),
        parallel=D.ParallelConfig.from_config(parallel_raw),
        validation=validation,
        validation_path=(config.get("data") or {}).get("validation_path"),
        max_images_per_message=int(max_images) if max_images else None,
    )


def metric_value(metrics: dict[str, float], name: str) -> float:
    name = name.lower()
    if name in LOSS_METRICS:
        return metrics["loss"]
    if "perplexity" in name:
        return metrics["perplexity"]
    return metrics["token_accuracy"]
