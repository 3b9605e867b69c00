"""Supervised fine-tuning: chat JSONL -> loss on assistant tokens only, DDP/DeepSpeed, eval, early stop,
S3 checkpoints with resume, final artifacts.

Loss: token-level cross entropy summed over the assistant tokens of the whole optimizer step (all ranks, all
accumulation micro-batches) and divided by their count, so N processes compute the same update as one
process with the same global batch (every rank builds the same step plan, so the count needs no collective).

Config (synth SFT TOML, normalised): hyperparameters {n_epochs, total_steps|train_steps|steps, batch_size |
per_device_batch | global_batch, gradient_accumulation_steps, sequence_length, learning_rate, warmup_ratio,
weight_decay, parallelism{use_deepspeed, deepspeed_stage, bf16, activation_checkpointing}, lr_scheduler_type,
seed, max_grad_norm}; training {mode, use_qlora, lora{r, alpha, dropout, target_modules}, validation{enabled,
evaluation_strategy, eval_steps, save_best_model_at_end, metric_for_best_model, greater_is_better,
early_stopping_patience, early_stopping_threshold}}; data.validation_path. Eval keys are also read from
hyperparameters and hyperparameters.parallelism (where synth's TOML scoping sometimes puts them).
model.max_images_per_message (vision models) trims extra images per message.

Vision models (config with a vision_config: Qwen2-VL, Qwen2.5-VL, Qwen3-VL) train through their processor
(sft_vision): the same assistant-only loss, with pixel values and image grids in every batch."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from posttrain.api.exitcodes import EXIT_DATA_ERROR
from posttrain.api.jobfile import JobFile
from posttrain.plotting import plot_curves

from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import distributed as D
from posttrain_trainer import storage as s3
from posttrain_trainer.optim import BatchPlan, build_optimizer, build_scheduler
from posttrain_trainer.report import Reporter
from posttrain_trainer.sft_data import (
    IGNORE_INDEX,
    DataError,
    Encoded,
    collate,
    encode_all,
    epoch_batches,
    iter_chunks,
    parse_jsonl,
    split_global_batch,
)
from posttrain_trainer.sft_vision import collate_vision, encode_all_vision

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
class ValidationConfig:
    enabled: bool = False
    strategy: str = "steps"  # steps | epoch | no
    eval_steps: int = 0
    save_best_model_at_end: bool = False
    metric: str = "val.loss"
    greater_is_better: bool = False
    patience: int | None = None
    threshold: float = 0.0


@dataclass
class SFTConfig:
    trainer_mode: str = "full"
    lora: dict[str, Any] = field(default_factory=dict)
    n_epochs: int = 1
    max_steps: int | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    sequence_length: int = 2048
    learning_rate: float = 1e-5
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    scheduler: str = "linear"
    seed: int = 42
    max_grad_norm: float = 1.0
    parallel: D.ParallelConfig = field(default_factory=D.ParallelConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    validation_path: str | None = None
    max_images_per_message: int | None = None


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


def parse_sft_config(config: dict[str, Any]) -> SFTConfig:
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
    validation = ValidationConfig(
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
    return SFTConfig(
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


def _metric_value(metrics: dict[str, float], name: str) -> float:
    name = name.lower()
    if name in LOSS_METRICS:
        return metrics["loss"]
    if "perplexity" in name:
        return metrics["perplexity"]
    return metrics["token_accuracy"]


def _local_path(uri: str | None, job: JobFile, name: str) -> str | None:
    if not uri:
        return None
    if s3.is_s3_uri(uri):
        if job.storage is None:
            raise DataError(f"dataset {uri} is in S3 but the job file has no storage section")
        return str(
            s3.download_file(
                s3.client_from_env(job.storage), uri, Path(job.workdir) / "data" / f"rank-{D.rank()}" / name
            )
        )
    return uri


def token_loss_sums(model, batch: dict[str, torch.Tensor], autocast) -> tuple[torch.Tensor, int, int]:
    """(sum of CE over target tokens, number of target tokens, number of correct argmax predictions)."""
    device = D.device()
    batch = {k: v.to(device) for k, v in batch.items()}
    inputs = {k: v for k, v in batch.items() if k != "labels"}  # + pixel_values, image_grid_thw, ... (vision)
    with autocast:
        logits = model(**inputs).logits
    labels = batch["labels"][:, 1:]
    keep = labels != IGNORE_INDEX
    picked = logits[:, :-1][keep].float()  # only target positions are upcast
    targets = labels[keep]
    loss_sum = F.cross_entropy(picked, targets, reduction="sum")
    correct = int((picked.argmax(-1) == targets).sum().item())
    return loss_sum, int(keep.sum().item()), correct


@torch.no_grad()
def evaluate(
    engine: D.TrainEngine, data: list[Encoded], pad_id: int, micro_batch: int, collate_fn=collate
) -> dict[str, float]:
    """Token-level loss / perplexity / accuracy over the whole validation set (split across ranks)."""
    module = engine.model
    module.eval()
    mine = data[D.rank() :: D.world_size()]
    loss_sum, tokens, correct = 0.0, 0, 0
    for chunk in iter_chunks(sorted(mine, key=len), micro_batch):
        s, n, c = token_loss_sums(engine.model, collate_fn(chunk, pad_id), engine.autocast())
        loss_sum, tokens, correct = loss_sum + float(s), tokens + n, correct + c
    module.train()
    loss_sum = D.all_reduce_sum(loss_sum)
    tokens = D.all_reduce_sum(float(tokens))
    correct = D.all_reduce_sum(float(correct))
    loss = loss_sum / max(tokens, 1.0)
    return {
        "loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "token_accuracy": correct / max(tokens, 1.0),
        "tokens": tokens,
    }


def train_step(
    engine: D.TrainEngine,
    data: list[Encoded],
    indices: list[int],
    lengths: list[int],
    plan: BatchPlan,
    pad_id: int,
    collate_fn=collate,
    pad_multiple: int = 1,
) -> tuple[float, float, float | None]:
    """One optimizer step over the global batch `indices` (collective: every rank calls it with the same
    indices). The loss is the token-level cross entropy of the whole step's target tokens, so any world size
    makes the same update. Returns (step loss, non-padding input tokens on all ranks, grad norm)."""
    micro = split_global_batch(
        indices, lengths, micro_batch=plan.micro_batch, world_size=D.world_size(), rank=D.rank()
    )
    step_tokens = sum(data[i].n_target for i in indices)  # same on every rank
    loss_total, seen = 0.0, 0
    for k, chunk in enumerate(micro):
        boundary = k == len(micro) - 1
        if chunk:
            batch = collate_fn([data[i] for i in chunk], pad_id, pad_multiple)
            loss_sum, _, _ = token_loss_sums(engine.model, batch, engine.autocast())
            seen += int(batch["attention_mask"].sum())
        else:  # a short last batch: keep the collectives in step with a zero-loss pass
            batch = collate_fn([data[indices[0]]], pad_id, pad_multiple)
            loss_sum = token_loss_sums(engine.model, batch, engine.autocast())[0] * 0.0
        loss = loss_sum / max(step_tokens, 1)
        engine.backward(loss, boundary=boundary)
        loss_total += float(loss.detach())
    grad_norm = engine.step()
    return D.all_reduce_sum(loss_total), D.all_reduce_sum(float(seen)), grad_norm


def _is_text_only(model) -> bool:
    from posttrain_trainer.modeling import is_vision_model

    return not is_vision_model(D.unwrap(model).config)


def train(job: JobFile) -> dict[str, Any]:
    """Run the SFT job; returns the final metrics (rank 0 also uploads artifacts and reports the result)."""
    from posttrain_trainer.artifacts import finalize, reported_artifacts
    from posttrain_trainer.modeling import load_dtype, load_model_and_tokenizer, load_processor

    D.init_distributed()
    cfg = parse_sft_config(job.config)
    reporter = Reporter(job, enabled=D.is_main())
    workdir = Path(job.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    precision = D.announce_precision(cfg.parallel)

    model, tokenizer = load_model_and_tokenizer(
        job.model_path,
        trainer_mode=cfg.trainer_mode,
        lora=cfg.lora,
        storage=job.storage,
        dtype=load_dtype(precision, cfg.trainer_mode),
        gradient_checkpointing=cfg.parallel.activation_checkpointing,
        seed=cfg.seed,
    )
    text_only = _is_text_only(model)
    processor = None if text_only else load_processor(job.model_path, storage=job.storage)
    collate_fn = collate if text_only else collate_vision

    def encode(path: str) -> tuple[list[Encoded], int]:
        if processor is None:
            return encode_all(
                tokenizer,
                parse_jsonl(path),
                max_length=cfg.sequence_length,
                text_only=True,
                source=Path(path).name,
            )
        data, dropped, trimmed = encode_all_vision(
            processor,
            parse_jsonl(path),
            max_length=cfg.sequence_length,
            max_images_per_message=cfg.max_images_per_message,
            source=Path(path).name,
            base_dir=Path(path).parent,
        )
        if trimmed:
            reporter.event("images_trimmed", count=trimmed, max_images_per_message=cfg.max_images_per_message)
        return list(data), dropped

    train_path = _local_path(job.dataset.train, job, "train.jsonl")
    if not train_path:
        raise DataError("the job file has no dataset.train")
    val_path = _local_path(job.dataset.validation or cfg.validation_path, job, "validation.jsonl")
    train_data, dropped = encode(train_path)
    val_data: list[Encoded] = []
    if val_path:
        val_data, _ = encode(val_path)
    do_eval = (
        bool(val_data) and cfg.validation.strategy != "no" and (cfg.validation.enabled or bool(val_path))
    )
    if dropped:
        reason = "no assistant token within sequence_length"
        if processor is not None:
            reason += ", or an image cut by sequence_length"
        reporter.event("examples_dropped", count=dropped, reason=reason)

    plan = BatchPlan.from_hyperparameters(cfg.hyperparameters, D.world_size())
    steps_per_epoch = len(epoch_batches(len(train_data), plan.global_batch, seed=cfg.seed, epoch=0))
    total = steps_per_epoch * cfg.n_epochs
    if cfg.max_steps:  # total_steps caps n_epochs when both are given, and replaces it otherwise
        total = min(total, cfg.max_steps) if cfg.hyperparameters.get("n_epochs") else cfg.max_steps
    optimizer = build_optimizer(model, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = build_scheduler(
        optimizer, total_steps=total, warmup_ratio=cfg.warmup_ratio, name=cfg.scheduler
    )
    if cfg.trainer_mode == "qlora" and cfg.parallel.use_deepspeed:
        if D.is_main():
            print("[posttrain] QLoRA: DeepSpeed ZeRO cannot shard 4-bit weights; using DDP", flush=True)
        cfg.parallel.use_deepspeed = False
    engine = D.build_engine(
        model,
        optimizer,
        scheduler,
        cfg.parallel,
        grad_accum=plan.grad_accum,
        micro_batch=plan.micro_batch,
        max_grad_norm=cfg.max_grad_norm,
    )
    pad_id = tokenizer.pad_token_id
    pad_multiple = 8 if torch.cuda.is_available() else 1
    lengths = [len(e) for e in train_data]

    client = s3.client_from_env(job.storage) if job.storage is not None else None
    step, epoch, batch_in_epoch = 0, 0, 0
    history: list[dict[str, Any]] = []
    best: dict[str, Any] = {"value": None, "step": None, "bad_evals": 0}
    last_checkpoint = None
    if client is not None and s3.exists(client, job.storage.bucket, job.storage.prefix + "manifest.json"):
        # This job already finished (a restarted pod after success): report the stored result, train nothing.
        manifest = s3.get_json(client, job.storage.bucket, job.storage.prefix + "manifest.json")
        reporter.event("already_complete", steps=manifest.get("steps"))
        reporter.result(
            manifest["fine_tuned_model"],
            reported_artifacts(manifest["artifacts"]),
        )
        D.barrier()
        return dict(manifest.get("metrics", {}), fine_tuned_model=manifest["fine_tuned_model"])
    if client is not None:
        latest = ckpt.find_latest(client, job.storage.bucket, job.storage.prefix)
        if latest is not None:
            state = ckpt.load_checkpoint(
                engine,
                client=client,
                bucket=job.storage.bucket,
                prefix=job.storage.prefix,
                step=latest,
                workdir=workdir,
            )
            step = int(state["step"])
            epoch, batch_in_epoch = int(state["data"]["epoch"]), int(state["data"]["next_batch"])
            history = list(state.get("history", []))
            best = dict(state.get("best", best))
            last_checkpoint = s3.s3_uri(job.storage.bucket, ckpt.step_prefix(job.storage.prefix, latest))
            reporter.event(
                "resumed",
                step=step,
                checkpoint=last_checkpoint,
                optimizer_fingerprint=state["resumed_optimizer_fingerprint"],
                saved_optimizer_fingerprint=state.get("optimizer_fingerprint"),
            )
    best_weights: dict[str, torch.Tensor] | None = None

    def run_eval(at_step: int) -> bool:
        """Evaluate, track the best, return True when early stopping says stop."""
        nonlocal best_weights
        metrics = evaluate(engine, val_data, pad_id, plan.micro_batch, collate_fn)
        value = _metric_value(metrics, cfg.validation.metric)
        better = best["value"] is None or (
            value > best["value"] + cfg.validation.threshold
            if cfg.validation.greater_is_better
            else value < best["value"] - cfg.validation.threshold
        )
        if better:
            best.update(value=value, step=at_step, bad_evals=0)
            # best weights are kept in memory, except under ZeRO-3 (partitioned): there the last weights are saved
            if cfg.validation.save_best_model_at_end and D.zero_stage(engine) < 3:
                best_weights = ckpt.trainable_state_dict(engine.module)
        else:
            best["bad_evals"] += 1
        line = {
            "step": at_step,
            "eval_loss": metrics["loss"],
            "eval_perplexity": metrics["perplexity"],
            "eval_token_accuracy": metrics["token_accuracy"],
        }
        history.append(line)
        reporter.event("evaluation", **line, metric=cfg.validation.metric, best_step=best["step"])
        reporter.progress(step=at_step, total=total, eval_score=value, last_checkpoint=last_checkpoint)
        return cfg.validation.patience is not None and best["bad_evals"] >= cfg.validation.patience

    if do_eval and step == 0:
        run_eval(0)

    debug_sleep = float(
        os.environ.get("POSTTRAIN_DEBUG_STEP_SLEEP", "0") or 0
    )  # tests: widen the kill window
    stopped_early = False
    engine.model.train()
    # total_steps without n_epochs: as many epochs as the steps need; with both, whichever ends first
    epoch_limit = cfg.n_epochs if (cfg.hyperparameters.get("n_epochs") or not cfg.max_steps) else 10**9
    while step < total and epoch < epoch_limit:
        batches = epoch_batches(len(train_data), plan.global_batch, seed=cfg.seed, epoch=epoch)
        while batch_in_epoch < len(batches) and step < total:
            started = time.perf_counter()
            indices = batches[batch_in_epoch]
            step_tokens = sum(train_data[i].n_target for i in indices)  # same on every rank
            step_loss, seen_global, grad_norm = train_step(
                engine, train_data, indices, lengths, plan, pad_id, collate_fn, pad_multiple
            )
            step += 1
            batch_in_epoch += 1
            if debug_sleep:
                time.sleep(debug_sleep)
            elapsed = time.perf_counter() - started
            tokens_per_s = seen_global / max(elapsed, 1e-9)
            record = {
                "step": step,
                "epoch": epoch,
                "loss": step_loss,
                "lr": engine.current_lr(),
                "grad_norm": grad_norm,
                "tokens_per_second": tokens_per_s,
                "target_tokens": step_tokens,
                "seen_tokens": int(seen_global),
                "step_seconds": elapsed,
            }
            history.append(record)
            reporter.progress(
                step=step,
                total=total,
                loss=step_loss,
                tokens_per_second=tokens_per_s,
                last_checkpoint=last_checkpoint,
            )
            should_stop = False
            evals_now = do_eval and (
                (
                    cfg.validation.strategy == "steps"
                    and cfg.validation.eval_steps
                    and step % cfg.validation.eval_steps == 0
                )
                or (cfg.validation.strategy == "epoch" and batch_in_epoch == len(batches))
            )
            if evals_now:
                should_stop = run_eval(step)
            if (
                client is not None
                and job.checkpoint_every
                and step % job.checkpoint_every == 0
                and step < total
            ):
                last_checkpoint = ckpt.save_checkpoint(
                    engine,
                    client=client,
                    bucket=job.storage.bucket,
                    prefix=job.storage.prefix,
                    step=step,
                    workdir=workdir,
                    data_state={"epoch": epoch, "next_batch": batch_in_epoch},
                    extra={"history": history, "best": best},
                    keep=ckpt.keep_checkpoints(job.config),
                )
                reporter.event("checkpoint", step=step, uri=last_checkpoint)
            if should_stop:
                stopped_early = True
                reporter.event("early_stop", step=step, best_step=best["step"], best_value=best["value"])
                break
        if stopped_early:
            break
        if batch_in_epoch >= len(batches):
            epoch, batch_in_epoch = epoch + 1, 0

    if best_weights is not None and best["step"] is not None:
        engine.module.load_state_dict(best_weights, strict=False)  # save_best_model_at_end
    final_eval = evaluate(engine, val_data, pad_id, plan.micro_batch, collate_fn) if do_eval else None
    train_losses = [h["loss"] for h in history if "loss" in h]
    evals = [h for h in history if "eval_loss" in h]
    metrics = {
        "steps": step,
        "total_steps": total,
        "final_train_loss": train_losses[-1] if train_losses else None,
        "first_eval_loss": evals[0]["eval_loss"] if evals else None,
        "final_eval_loss": final_eval["loss"] if final_eval else (evals[-1]["eval_loss"] if evals else None),
        "best_eval": best,
        "stopped_early": stopped_early,
        "train_examples": len(train_data),
        "validation_examples": len(val_data),
        "global_batch": plan.global_batch,
        "world_size": D.world_size(),
        "engine": engine.kind,
        "trainer_mode": cfg.trainer_mode,
    }
    with D.gathered_parameters(engine):  # ZeRO-3: full weights on every rank while rank 0 saves
        saved = (
            finalize(
                job,
                engine.module,
                processor if processor is not None else tokenizer,  # a VL model keeps its processor
                metrics=metrics,
                steps=step,
                metrics_lines=history,
                extra_files=_curve(history, workdir, job.job.name),
                client=client,
            )
            if D.is_main()
            else None
        )
    if D.is_main():
        model_id, artifacts = saved
        reporter.progress(
            step=step,
            total=total,
            loss=metrics["final_train_loss"],
            eval_score=metrics["final_eval_loss"],
            last_checkpoint=last_checkpoint,
        )
        reporter.result(model_id, artifacts)
        metrics["fine_tuned_model"] = model_id
        metrics["artifacts"] = artifacts
    D.barrier()
    return metrics


def _curve(history: list[dict[str, Any]], workdir: Path, name: str) -> dict[str, Path] | None:
    """The loss curve (training and held-out loss), stored as the job's reward_curve.png artifact: every
    job has one curve under one name; an SFT job's shows loss."""
    path = plot_curves(history, workdir / "reward_curve.png", title=f"SFT: {name} (loss)")
    return {"reward_curve": path} if path else None


def _termination_message(text: str, path: str = "/dev/termination-log") -> None:
    """Kubernetes shows this file's content as the container's termination message (kubectl describe)."""
    if not os.path.exists(path):  # only where the kubelet provides it (never create files in /dev)
        return
    try:
        with open(path, "w") as handle:
            handle.write(text[:4000])
    except OSError:
        pass


def main(job: JobFile) -> int:
    try:
        train(job)
    except DataError as err:
        if D.is_main():
            print(f"error: {err}", flush=True)
            _termination_message(f"dataset error: {err}")
        D.shutdown()
        return EXIT_DATA_ERROR
    D.shutdown()
    return 0
