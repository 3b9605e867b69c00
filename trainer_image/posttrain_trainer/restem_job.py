"""ReST-EM as a job (Singh et al. 2023, "Beyond Human Data: Scaling Self-Training for Problem-Solving with
Language Models", arXiv:2312.06585): `[algorithm] variety = "restem"` in an RL TOML, run by
`python -m posttrain_trainer rl` (the same job file, rollout server and task app as GSPO).

Each iteration k = 1..N (N = training.num_epochs x training.iterations_per_epoch):
  E-step  rank 0 samples K = training.group_size completions for each of training.batch_size prompts (task
          app seeds data.seed_start + (k-1) * batch_size + j) from the current model through the rollout
          server (POST /rollout mode rl, the exact sampled tokens from the server's captures, as GSPO does),
          and keeps those whose reward is at or above training.reward_threshold (default 1.0: the paper's
          binary reward; the same rule as `posttrain filter --min-reward`). Identical completions of a prompt
          are kept once, at most training.max_per_prompt of them (the paper caps samples per problem).
  M-step  every rank loads the BASE model again (not the previous iteration's: the paper's choice, which
          avoids drift and overfitting to the self-generated data) and fine-tunes it on the kept samples:
          token-level cross entropy on the sampled tokens only (prompt and env tokens masked),
          training.sft_epochs passes (default 2), global batch training.sft_batch_size (default 8),
          learning_rate, AdamW, linear schedule with warmup_ratio.
  sync    the new weights go to the rollout servers (weightsync.py), so the next E-step samples from them.
  eval    held-out evaluation on evaluation.seeds (mode eval, greedy unless evaluation.temperature; a sampled
          evaluation runs evaluation.instances episodes over the seeds) before the first iteration and after
          each one (every evaluation.every_n_iters).
Progress per iteration: step = k, mean_return = the E-step's mean reward, loss = the M-step's last loss,
eval_score; an "restem_iteration" event with the counts and seconds. The end: the last M-step's model is the
fine_tuned_model (`rl:<base>:...`, an RLJob's id), reward_curve.png and each iteration's kept samples
(restem-iteration-<k>.jsonl, decoded text) beside it. Checkpoints every job.checkpoint_every iterations hold
that iteration's weights; a restarted job resumes after the latest one."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from posttrain.api.exitcodes import EXIT_CONFIG_ERROR, EXIT_RETRYABLE
from posttrain.api.jobfile import JobFile
from posttrain.plotting import plot_curves

from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import distributed as D
from posttrain_trainer import storage as s3
from posttrain_trainer.report import Reporter
from posttrain_trainer.restem import VARIETY
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    RolloutClient,
    RolloutResult,
    plan_rollouts,
    run_tag,
    section,
)
from posttrain_trainer.sft_data import IGNORE_INDEX, Encoded, epoch_batches

ITERATION_EVENT = "restem_iteration"


class RestemConfigError(ValueError):
    pass


@dataclass
class RestemConfig:
    iterations: int = 1
    prompts: int = 8  # training.batch_size: prompts (seeds) per E-step
    samples_per_prompt: int = 4  # training.group_size: K
    reward_threshold: float = 1.0
    max_per_prompt: int | None = None
    learning_rate: float = 1e-5
    sft_epochs: int = 2
    sft_batch_size: int = 8
    micro_batch: int = 4
    warmup_ratio: float = 0.0
    lr_scheduler: str = "linear"
    max_grad_norm: float | None = 1.0
    seed: int = 0
    seed_start: int = 0
    eval_every: int = 1
    eval_seeds: list[int] = field(default_factory=list)
    eval_instances: int = 0
    eval_temperature: float = 0.0
    trainer_mode: str = "full"
    lora: dict[str, Any] = field(default_factory=dict)
    parallel: D.ParallelConfig = field(default_factory=D.ParallelConfig)


def parse_restem_config(config: dict[str, Any]) -> RestemConfig:
    training = section(config, "training")
    evaluation = section(config, "evaluation")
    model = section(config, "model") or section(config, "policy")
    data = section(config, "data")

    def get(key: str, default: Any) -> Any:
        value = training.get(key)
        return default if value is None else value

    seeds = evaluation.get("seeds") or []
    if isinstance(seeds, str):  # "100-199"
        lo, _, hi = seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
    lora = training.get("lora") if isinstance(training.get("lora"), dict) else section(config, "lora")
    cfg = RestemConfig(
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
        eval_seeds=[int(s) for s in seeds],
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


# -- E-step: keep the good samples (pure) -----------------------------------------------------------------


@dataclass
class KeptSample:
    seed: int
    reward: float
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]


def keep_samples(
    results: list[RolloutResult], threshold: float, max_per_prompt: int | None = None
) -> list[KeptSample]:
    """Successful rollouts with reward >= threshold, as training samples: one per captured sequence,
    identical (prompt, completion) pairs of a prompt once, at most max_per_prompt per prompt, in seed order."""
    kept: list[KeptSample] = []
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    per_prompt: dict[int, int] = {}
    for result in sorted(results, key=lambda r: (r.spec.group, r.spec.index)):
        if not result.ok or result.reward < threshold:
            continue
        for seq in result.sequences:
            key = (result.spec.seed, tuple(seq.prompt_ids), tuple(seq.completion_ids))
            if key in seen:
                continue
            if max_per_prompt is not None and per_prompt.get(result.spec.seed, 0) >= max_per_prompt:
                break
            seen.add(key)
            per_prompt[result.spec.seed] = per_prompt.get(result.spec.seed, 0) + 1
            kept.append(
                KeptSample(
                    result.spec.seed,
                    result.reward,
                    list(seq.prompt_ids),
                    list(seq.completion_ids),
                    list(seq.completion_mask),
                )
            )
    return kept


def to_encoded(samples: list[KeptSample]) -> list[Encoded]:
    """Training rows: loss only on the policy's sampled tokens (prompt and env/template glue masked)."""
    out = []
    for i, sample in enumerate(samples):
        labels = [IGNORE_INDEX] * len(sample.prompt_ids) + [
            token if mask else IGNORE_INDEX
            for token, mask in zip(sample.completion_ids, sample.completion_mask, strict=True)
        ]
        out.append(Encoded(i, sample.prompt_ids + sample.completion_ids, labels))
    return [e for e in out if e.n_target > 0]


def micro_batch_for(cfg: RestemConfig, world_size: int) -> int:
    """The largest micro-batch <= training.micro_batch that divides a rank's share of sft_batch_size."""
    if cfg.sft_batch_size % world_size:
        raise RestemConfigError(
            f"training.sft_batch_size = {cfg.sft_batch_size} does not split over {world_size} trainer processes"
        )
    per_rank = cfg.sft_batch_size // world_size
    return max(m for m in range(1, min(cfg.micro_batch, per_rank) + 1) if per_rank % m == 0)


# -- M-step -----------------------------------------------------------------------------------------------


def m_step(job: JobFile, cfg: RestemConfig, data: list[Encoded], iteration: int) -> tuple[Any, Any, dict]:
    """Fine-tune a fresh copy of the base model on `data` (collective). Returns (engine, tokenizer, stats)."""
    from posttrain_trainer.modeling import load_model_and_tokenizer
    from posttrain_trainer.optim import BatchPlan, build_optimizer, build_scheduler
    from posttrain_trainer.sft import train_step

    torch.manual_seed(cfg.seed + iteration)
    model, tokenizer = load_model_and_tokenizer(
        job.model_path, trainer_mode=cfg.trainer_mode, lora=cfg.lora, storage=job.storage, seed=cfg.seed
    )
    plan = BatchPlan.from_hyperparameters(
        {"global_batch": cfg.sft_batch_size, "per_device_batch": micro_batch_for(cfg, D.world_size())},
        D.world_size(),
    )
    batches_per_epoch = (
        len(epoch_batches(len(data), plan.global_batch, seed=cfg.seed, epoch=0)) if data else 0
    )
    total = batches_per_epoch * cfg.sft_epochs
    optimizer = build_optimizer(model, lr=cfg.learning_rate)
    scheduler = build_scheduler(
        optimizer, total_steps=max(1, total), warmup_ratio=cfg.warmup_ratio, name=cfg.lr_scheduler
    )
    engine = D.build_engine(
        model,
        optimizer,
        scheduler,
        cfg.parallel,
        grad_accum=plan.grad_accum,
        micro_batch=plan.micro_batch,
        max_grad_norm=cfg.max_grad_norm,
    )
    engine.model.train()
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    lengths = [len(e) for e in data]
    losses: list[float] = []
    for epoch in range(cfg.sft_epochs if data else 0):
        seed = cfg.seed * 1_000_003 + iteration
        for indices in epoch_batches(len(data), plan.global_batch, seed=seed, epoch=epoch):
            loss, _, _ = train_step(engine, data, indices, lengths, plan, pad_id)
            losses.append(float(loss))
    engine.model.eval()
    return engine, tokenizer, {"sft_steps": len(losses), "first_loss": losses[0] if losses else None,
                               "last_loss": losses[-1] if losses else None}  # fmt: skip


# -- the job ----------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _collect(client: RolloutClient, specs, **kwargs) -> list[RolloutResult]:
    return asyncio.run(client.collect(specs, **kwargs))


def _write_samples(path: Path, samples: list[KeptSample], tokenizer, iteration: int) -> Path:
    """The kept samples as readable JSONL (decoded text), for people: what the M-step trained on."""
    with path.open("w", encoding="utf-8") as handle:
        for s in samples:
            row = {
                "iteration": iteration,
                "seed": s.seed,
                "reward": s.reward,
                "prompt": tokenizer.decode(s.prompt_ids),
                "completion": tokenizer.decode(s.completion_ids),
            }
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    return path


def train(job: JobFile) -> dict[str, Any]:
    from posttrain_trainer.artifacts import finalize, reported_artifacts
    from posttrain_trainer.modeling import is_peft
    from posttrain_trainer.weightsync import WeightSyncer, sync_format

    D.init_distributed()
    cfg = parse_restem_config(job.config)
    if job.task_app is None:
        raise RestemConfigError("a ReST-EM job file needs task_app.url")
    if not job.endpoints.policy:
        raise RestemConfigError("a ReST-EM job file needs endpoints.policy (the rollout servers)")
    reporter = Reporter(job, enabled=D.is_main())
    workdir = Path(job.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    random.seed(cfg.seed)
    client = s3.client_from_env(job.storage) if job.storage is not None else None
    if client is not None and s3.exists(client, job.storage.bucket, job.storage.prefix + "manifest.json"):
        manifest = s3.get_json(client, job.storage.bucket, job.storage.prefix + "manifest.json")
        reporter.event("already_complete", steps=manifest.get("steps"))
        reporter.result(
            manifest["fine_tuned_model"],
            reported_artifacts(manifest["artifacts"]),
        )
        D.barrier()
        return dict(manifest.get("metrics", {}), fine_tuned_model=manifest["fine_tuned_model"])

    rollout_client = RolloutClient(
        task_url=job.task_app.url,
        config=job.config,
        model=job.base_model,
        api_key_env=job.task_app.api_key_env,
    )
    budget = ErrorBudget.from_config(job.config)
    syncer = WeightSyncer(job, client=client) if D.is_main() else None
    run = run_tag(job.job.name, job.job.uid)
    history: list[dict[str, Any]] = []
    sample_files: dict[str, Path] = {}
    engine, tokenizer = None, None
    iteration, last_checkpoint = 0, None

    latest = ckpt.find_latest(client, job.storage.bucket, job.storage.prefix) if client is not None else None
    if latest is not None:  # the weights of iteration `latest`: rebuild the engine, restore, push to vLLM
        engine, tokenizer, _ = m_step(job, cfg, [], latest)
        state = ckpt.load_checkpoint(
            engine, client=client, bucket=job.storage.bucket, prefix=job.storage.prefix, step=latest,
            workdir=workdir,
        )  # fmt: skip
        iteration = int(state["data"].get("iteration", latest))
        history = list(state.get("history", []))
        last_checkpoint = s3.s3_uri(job.storage.bucket, ckpt.step_prefix(job.storage.prefix, latest))
        reporter.event("resumed", step=iteration, checkpoint=last_checkpoint)

    def sync(version: int) -> float:
        seconds = 0.0
        if D.is_main():
            result = syncer.sync(
                engine.module, tokenizer, version, sync_format(job.config, is_peft(engine.module))
            )
            seconds = result.total_seconds
            reporter.event("weight_sync", **result.as_metrics(), path=result.path)
        D.barrier()
        return seconds

    def evaluate(at: int) -> float | None:
        score = None
        if D.is_main() and cfg.eval_seeds:
            # a sampled evaluation (evaluation.temperature > 0) runs `instances` episodes over the seeds, so
            # that each seed is scored several times (greedy answers would repeat themselves)
            repeats = max(1, -(-cfg.eval_instances // len(cfg.eval_seeds))) if cfg.eval_temperature > 0 else 1
            specs = plan_rollouts(run, at, cfg.eval_seeds, repeats, job.endpoints.policy, kind="ev")
            results = _collect(rollout_client, specs, mode="eval", want_tokens=False,
                               policy_overrides={"temperature": cfg.eval_temperature})  # fmt: skip
            ok = [r.reward for r in results if r.ok]
            score = _mean(ok)
            line = {
                "step": at,
                "eval_score": score,
                "eval_rollouts": len(results),
                "eval_failed": len(results) - len(ok),
            }
            history.append(line)
            reporter.event("evaluation", **line)
        return D.broadcast_object(score)

    if iteration > 0:
        sync(iteration)
    first_eval = evaluate(0) if iteration == 0 else None
    last_eval = first_eval
    while iteration < cfg.iterations:
        started = time.perf_counter()
        seeds = [cfg.seed_start + iteration * cfg.prompts + j for j in range(cfg.prompts)]
        payload: Any = None
        if D.is_main():
            specs = plan_rollouts(run, iteration, seeds, cfg.samples_per_prompt, job.endpoints.policy)
            results = _collect(rollout_client, specs)
            errors = [r.error for r in results if not r.ok]
            try:
                budget.check(len(results), errors)
                kept = keep_samples(results, cfg.reward_threshold, cfg.max_per_prompt)
                rewards = [r.reward for r in results if r.ok]
                payload = {
                    "data": to_encoded(kept),
                    "kept": kept,
                    "stats": {
                        "rollouts": len(results),
                        "failed_rollouts": len(errors),
                        "mean_return": _mean(rewards),
                        "kept": len(kept),
                        "prompts_with_kept": len({s.seed for s in kept}),
                        "sampling_seconds": time.perf_counter() - started,
                    },
                }
            except RolloutBudgetExceeded as err:
                payload = {"error": str(err)}
        payload = D.broadcast_object(payload)
        if "error" in payload:
            raise RolloutBudgetExceeded(payload["error"])
        stats = payload["stats"]
        iteration += 1
        del engine
        gc.collect()
        sft_started = time.perf_counter()
        engine, tokenizer, sft = m_step(job, cfg, payload["data"], iteration)
        stats.update(sft, sft_seconds=time.perf_counter() - sft_started)
        if D.is_main():
            path = workdir / f"restem-iteration-{iteration}.jsonl"
            sample_files[f"restem_iteration_{iteration}"] = _write_samples(
                path, payload["kept"], tokenizer, iteration
            )
        stats["weight_sync_seconds"] = sync(iteration)
        eval_score = None
        if cfg.eval_seeds and (iteration % cfg.eval_every == 0 or iteration == cfg.iterations):
            eval_score = last_eval = evaluate(iteration)
        record = {"step": iteration, "total": cfg.iterations, "loss": stats["last_loss"], **stats,
                  "iteration_seconds": time.perf_counter() - started}  # fmt: skip
        history.append(record)
        reporter.event(ITERATION_EVENT, **record)
        checkpoint_due = job.checkpoint_every and iteration % job.checkpoint_every == 0
        if client is not None and checkpoint_due and iteration < cfg.iterations:
            last_checkpoint = ckpt.save_checkpoint(
                engine, client=client, bucket=job.storage.bucket, prefix=job.storage.prefix,
                step=iteration, workdir=workdir, data_state={"iteration": iteration},
                extra={"history": history},
            )  # fmt: skip
            reporter.event("checkpoint", step=iteration, uri=last_checkpoint)
        reporter.progress(
            step=iteration, total=cfg.iterations, loss=stats["last_loss"], mean_return=stats["mean_return"],
            eval_score=eval_score if eval_score is not None else last_eval, last_checkpoint=last_checkpoint,
        )  # fmt: skip

    evals = [h["eval_score"] for h in history if h.get("eval_score") is not None]
    returns = [h["mean_return"] for h in history if h.get("mean_return") is not None]
    metrics = {
        "algorithm": VARIETY,
        "iterations": iteration,
        "first_mean_return": returns[0] if returns else None,
        "final_mean_return": returns[-1] if returns else None,
        "first_eval_score": evals[0] if evals else None,
        "final_eval_score": evals[-1] if evals else None,
        "eval_scores": evals,
        "kept_per_iteration": [h.get("kept") for h in history if "kept" in h],
        "world_size": D.world_size(),
        "trainer_mode": cfg.trainer_mode,
    }
    with D.gathered_parameters(engine):
        saved = None
        if D.is_main():
            curve = plot_curves(history, workdir / "reward_curve.png", title=f"ReST-EM: {job.job.name}")
            extra = dict(sample_files)
            if curve is not None:
                extra["reward_curve"] = curve
            saved = finalize(
                job, engine.module, tokenizer, metrics=metrics, steps=iteration, metrics_lines=history,
                extra_files=extra, client=client,
            )  # fmt: skip
    if D.is_main():
        model_id, artifacts = saved
        reporter.progress(step=iteration, total=cfg.iterations, mean_return=metrics["final_mean_return"],
                          eval_score=metrics["final_eval_score"], last_checkpoint=last_checkpoint)  # fmt: skip
        reporter.result(model_id, artifacts)
        metrics["fine_tuned_model"] = model_id
        metrics["artifacts"] = artifacts
    D.barrier()
    return metrics


def main(job: JobFile) -> int:
    try:
        train(job)
    except (RestemConfigError, RolloutBudgetExceeded) as err:
        if D.is_main():
            print(f"error: {err}", flush=True)
        D.shutdown()
        return EXIT_CONFIG_ERROR if isinstance(err, RestemConfigError) else EXIT_RETRYABLE
    D.shutdown()
    return 0
