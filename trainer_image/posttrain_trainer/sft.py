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
(sft_vision): the same assistant-only loss, with pixel values and image grids in every batch; as synth does, the
per-device batch is 1 and gradient accumulation makes up the same global batch (event vision_batch_clamped)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from posttrain import storage as s3
from posttrain.api.exitcodes import EXIT_DATA_ERROR
from posttrain.api.jobfile import JobFile
from posttrain.plotting import plot_curves

from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import distributed as D
from posttrain_trainer import preemption
from posttrain_trainer.optim import BatchPlan, build_optimizer, build_scheduler
from posttrain_trainer.report import Reporter
from posttrain_trainer.resume import CheckpointStore
from posttrain_trainer.sft_config import SFTTrainerConfig, metric_value, sft_settings
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


def build_engine(cfg: SFTTrainerConfig, model: torch.nn.Module, plan: BatchPlan, total: int) -> D.TrainEngine:
    """The training engine for `total` optimizer steps (collective)."""
    optimizer = build_optimizer(model, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scheduler = build_scheduler(
        optimizer, total_steps=total, warmup_ratio=cfg.warmup_ratio, name=cfg.scheduler
    )
    if cfg.trainer_mode == "qlora" and cfg.parallel.use_deepspeed:
        if D.is_main():
            print("[posttrain] QLoRA: DeepSpeed ZeRO cannot shard 4-bit weights; using DDP", flush=True)
        cfg.parallel.use_deepspeed = False
    D.drop_fsdp(cfg.parallel, "SFT")
    return D.build_engine(
        model,
        optimizer,
        scheduler,
        cfg.parallel,
        grad_accum=plan.grad_accum,
        micro_batch=plan.micro_batch,
        max_grad_norm=cfg.max_grad_norm,
    )


def total_steps(cfg: SFTTrainerConfig, steps_per_epoch: int) -> int:
    total = steps_per_epoch * cfg.n_epochs
    if cfg.max_steps:  # total_steps caps n_epochs when both are given, and replaces it otherwise
        total = min(total, cfg.max_steps) if cfg.epochs_given else cfg.max_steps
    return total


class SFTRun:
    """One SFT job on this rank: load the model and data, resume, then epochs of optimizer steps, each with
    its validation, early stopping and checkpoint, then finish (final model and result)."""

    def __init__(self, job: JobFile):
        from posttrain_trainer.modeling import load_for_training, load_processor

        D.init_distributed()
        self.job = job
        self.cfg = cfg = sft_settings(job)
        self.reporter = Reporter(job, enabled=D.is_main())
        self.workdir = Path(job.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        precision = D.announce_precision(cfg.parallel)
        model, self.tokenizer = load_for_training(job, cfg, precision)
        text_only = _is_text_only(model)
        self.processor = None if text_only else load_processor(job.model_path, storage=job.storage)
        self.collate_fn = collate if text_only else collate_vision
        self.load_data()
        self.plan = BatchPlan.from_hyperparameters(cfg.batch_keys(), D.world_size())
        if not text_only and self.plan.micro_batch > 1:
            asked = self.plan
            self.plan = asked.one_per_device()
            self.reporter.event(
                "vision_batch_clamped",
                per_device_batch=1,
                gradient_accumulation_steps=self.plan.grad_accum,
                asked_per_device_batch=asked.micro_batch,
                asked_gradient_accumulation_steps=asked.grad_accum,
            )
        self.total = total_steps(
            cfg, len(epoch_batches(len(self.train_data), self.plan.global_batch, seed=cfg.seed, epoch=0))
        )
        self.engine = build_engine(cfg, model, self.plan, self.total)
        self.pad_id = self.tokenizer.pad_token_id
        self.pad_multiple = 8 if torch.cuda.is_available() else 1
        self.lengths = [len(e) for e in self.train_data]
        self.store = CheckpointStore(job, self.reporter)
        self.step, self.epoch, self.batch_in_epoch = 0, 0, 0
        self.history: list[dict[str, Any]] = []
        self.best: dict[str, Any] = {"value": None, "step": None, "bad_evals": 0}
        self.best_weights: dict[str, torch.Tensor] | None = None
        self.stopped_early = False

    def encode(self, path: str) -> tuple[list[Encoded], int]:
        """A JSONL file -> training rows and the number of examples dropped."""
        cfg = self.cfg
        if self.processor is None:
            return encode_all(
                self.tokenizer,
                parse_jsonl(path),
                max_length=cfg.sequence_length,
                text_only=True,
                source=Path(path).name,
            )
        data, dropped, trimmed = encode_all_vision(
            self.processor,
            parse_jsonl(path),
            max_length=cfg.sequence_length,
            max_images_per_message=cfg.max_images_per_message,
            source=Path(path).name,
            base_dir=Path(path).parent,
        )
        if trimmed:
            self.reporter.event(
                "images_trimmed", count=trimmed, max_images_per_message=cfg.max_images_per_message
            )
        return list(data), dropped

    def load_data(self) -> None:
        job, cfg = self.job, self.cfg
        train_path = _local_path(job.dataset.train, job, "train.jsonl")
        if not train_path:
            raise DataError("the job file has no dataset.train")
        val_path = _local_path(job.dataset.validation or cfg.validation_path, job, "validation.jsonl")
        self.train_data, dropped = self.encode(train_path)
        self.val_data: list[Encoded] = []
        if val_path:
            self.val_data, _ = self.encode(val_path)
        self.do_eval = (
            bool(self.val_data)
            and cfg.validation.strategy != "no"
            and (cfg.validation.enabled or bool(val_path))
        )
        if dropped:
            reason = "no assistant token within sequence_length"
            if self.processor is not None:
                reason += ", or an image cut by sequence_length"
            self.reporter.event("examples_dropped", count=dropped, reason=reason)

    def run(self) -> dict[str, Any]:
        # A job that already finished (a restarted pod after success): report the stored result, train nothing.
        done = self.store.completed_result()
        if done is not None:
            return done
        self.resume()
        if self.do_eval and self.step == 0:
            self.validate(0)
        self.train_epochs()
        return self.finish()

    def resume(self) -> None:
        state = self.store.resume(self.engine)
        if state is None:
            return
        self.step = int(state["step"])
        self.epoch, self.batch_in_epoch = int(state["data"]["epoch"]), int(state["data"]["next_batch"])
        self.history = list(state.get("history", []))
        self.best = dict(state.get("best", self.best))
        self.store.report_resumed(self.step, state)

    def train_epochs(self) -> None:
        """Epochs of optimizer steps until total_steps, the epoch limit or early stopping."""
        cfg = self.cfg
        debug_sleep = float(
            os.environ.get("POSTTRAIN_DEBUG_STEP_SLEEP", "0") or 0
        )  # tests: widen the kill window
        self.engine.model.train()
        # total_steps without n_epochs: as many epochs as the steps need; with both, whichever ends first
        epoch_limit = cfg.n_epochs if (cfg.epochs_given or not cfg.max_steps) else 10**9
        while self.step < self.total and self.epoch < epoch_limit:
            batches = epoch_batches(
                len(self.train_data), self.plan.global_batch, seed=cfg.seed, epoch=self.epoch
            )
            while self.batch_in_epoch < len(batches) and self.step < self.total:
                if self.optimizer_step(batches, debug_sleep):
                    return
            if self.batch_in_epoch >= len(batches):
                self.epoch, self.batch_in_epoch = self.epoch + 1, 0

    def optimizer_step(self, batches: list[list[int]], debug_sleep: float) -> bool:
        """One optimizer step with its record, evaluation and checkpoint; True when early stopping says stop."""
        started = time.perf_counter()
        indices = batches[self.batch_in_epoch]
        step_tokens = sum(self.train_data[i].n_target for i in indices)  # same on every rank
        step_loss, seen_global, grad_norm = train_step(
            self.engine,
            self.train_data,
            indices,
            self.lengths,
            self.plan,
            self.pad_id,
            self.collate_fn,
            self.pad_multiple,
        )
        self.step += 1
        self.batch_in_epoch += 1
        if debug_sleep:
            time.sleep(debug_sleep)
        elapsed = time.perf_counter() - started
        tokens_per_s = seen_global / max(elapsed, 1e-9)
        self.history.append(
            {
                "step": self.step,
                "epoch": self.epoch,
                "loss": step_loss,
                "lr": self.engine.current_lr(),
                "grad_norm": grad_norm,
                "tokens_per_second": tokens_per_s,
                "target_tokens": step_tokens,
                "seen_tokens": int(seen_global),
                "step_seconds": elapsed,
            }
        )
        self.reporter.record(self.history[-1], self.history)
        self.reporter.progress(
            step=self.step,
            total=self.total,
            loss=step_loss,
            tokens_per_second=tokens_per_s,
            last_checkpoint=self.store.last_uri,
        )
        should_stop = self.validate(self.step) if self.eval_due(len(batches)) else False
        self.checkpoint()
        preemption.stop_if_asked(self.store, self.step, lambda: self.checkpoint(force=True))
        if should_stop:
            self.stopped_early = True
            self.reporter.event(
                "early_stop", step=self.step, best_step=self.best["step"], best_value=self.best["value"]
            )
        return should_stop

    def eval_due(self, batches_in_epoch: int) -> bool:
        validation = self.cfg.validation
        if not self.do_eval:
            return False
        if validation.strategy == "steps":
            return bool(validation.eval_steps) and self.step % validation.eval_steps == 0
        return validation.strategy == "epoch" and self.batch_in_epoch == batches_in_epoch

    def validate(self, at_step: int) -> bool:
        """Evaluate, track the best, return True when early stopping says stop (collective)."""
        validation = self.cfg.validation
        metrics = evaluate(self.engine, self.val_data, self.pad_id, self.plan.micro_batch, self.collate_fn)
        value = metric_value(metrics, validation.metric)
        best = self.best
        better = best["value"] is None or (
            value > best["value"] + validation.threshold
            if validation.greater_is_better
            else value < best["value"] - validation.threshold
        )
        if better:
            best.update(value=value, step=at_step, bad_evals=0)
            # best weights are kept in memory, except under ZeRO-3 (partitioned): there the last weights are saved
            if validation.save_best_model_at_end and D.zero_stage(self.engine) < 3:
                self.best_weights = ckpt.trainable_state_dict(self.engine.module)
        else:
            best["bad_evals"] += 1
        line = {
            "step": at_step,
            "eval_loss": metrics["loss"],
            "eval_perplexity": metrics["perplexity"],
            "eval_token_accuracy": metrics["token_accuracy"],
        }
        self.history.append(line)
        self.reporter.record(line, self.history)
        self.reporter.event("evaluation", **line, metric=validation.metric, best_step=best["step"])
        self.reporter.progress(
            step=at_step, total=self.total, eval_score=value, last_checkpoint=self.store.last_uri
        )
        return validation.patience is not None and best["bad_evals"] >= validation.patience

    def checkpoint(self, force: bool = False) -> None:
        if force or self.store.due(self.step, self.total):
            self.store.save(
                self.engine,
                self.step,
                data_state={"epoch": self.epoch, "next_batch": self.batch_in_epoch},
                extra={"history": self.history, "best": self.best},
            )

    def summary(self, final_eval: dict[str, float] | None) -> dict[str, Any]:
        train_losses = [h["loss"] for h in self.history if "loss" in h]
        evals = [h for h in self.history if "eval_loss" in h]
        return {
            "steps": self.step,
            "total_steps": self.total,
            "final_train_loss": train_losses[-1] if train_losses else None,
            "first_eval_loss": evals[0]["eval_loss"] if evals else None,
            "final_eval_loss": final_eval["loss"]
            if final_eval
            else (evals[-1]["eval_loss"] if evals else None),
            "best_eval": self.best,
            "stopped_early": self.stopped_early,
            "train_examples": len(self.train_data),
            "validation_examples": len(self.val_data),
            "global_batch": self.plan.global_batch,
            "world_size": D.world_size(),
            "engine": self.engine.kind,
            "trainer_mode": self.cfg.trainer_mode,
        }

    def finish(self) -> dict[str, Any]:
        """The best or last weights, a final evaluation, and on rank 0 the final model and result."""
        from posttrain_trainer.artifacts import finalize

        engine = self.engine
        if self.best_weights is not None and self.best["step"] is not None:
            engine.module.load_state_dict(self.best_weights, strict=False)  # save_best_model_at_end
        final_eval = (
            evaluate(engine, self.val_data, self.pad_id, self.plan.micro_batch, self.collate_fn)
            if self.do_eval
            else None
        )
        metrics = self.summary(final_eval)
        with D.gathered_parameters(engine):  # ZeRO-3: full weights on every rank while rank 0 saves
            saved = (
                finalize(
                    self.job,
                    engine.module,
                    self.processor
                    if self.processor is not None
                    else self.tokenizer,  # a VL model keeps its processor
                    metrics=metrics,
                    steps=self.step,
                    metrics_lines=self.history,
                    extra_files=_curve(self.history, self.workdir, self.job.job.name),
                    client=self.store.client,
                )
                if D.is_main()
                else None
            )
        if D.is_main():
            final = self.reporter.final(
                *saved,
                step=self.step,
                total=self.total,
                loss=metrics["final_train_loss"],
                eval_score=metrics["final_eval_loss"],
                last_checkpoint=self.store.last_uri,
            )
            metrics.update(final)
        D.barrier()
        return metrics


def train(job: JobFile) -> dict[str, Any]:
    """Run the SFT job; returns the final metrics (rank 0 also uploads artifacts and reports the result)."""
    return SFTRun(job).run()


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
