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

import gc
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from posttrain.api.exitcodes import EXIT_CONFIG_ERROR, EXIT_RETRYABLE
from posttrain.api.jobfile import JobFile
from posttrain.api.restem import VARIETY
from posttrain.plotting import plot_curves

from posttrain_trainer import distributed as D
from posttrain_trainer import preemption, replicas
from posttrain_trainer.online import (
    iteration_seeds,
    mean,
    require_rollout_endpoints,
    run_evaluation,
    wait_until_serving,
)
from posttrain_trainer.report import Reporter
from posttrain_trainer.restem_config import RestemConfigError, RestemTrainerConfig, restem_settings
from posttrain_trainer.resume import CheckpointStore
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    RolloutClient,
    RolloutLoop,
    RolloutResult,
    plan_rollouts,
    run_tag,
)
from posttrain_trainer.sft_data import IGNORE_INDEX, Encoded, epoch_batches

ITERATION_EVENT = "restem_iteration"


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


def micro_batch_for(cfg: RestemTrainerConfig, world_size: int) -> int:
    """The largest micro-batch <= training.micro_batch that divides a rank's share of sft_batch_size."""
    if cfg.sft_batch_size % world_size:
        raise RestemConfigError(
            f"training.sft_batch_size = {cfg.sft_batch_size} does not split over {world_size} trainer processes"
        )
    per_rank = cfg.sft_batch_size // world_size
    return max(m for m in range(1, min(cfg.micro_batch, per_rank) + 1) if per_rank % m == 0)


# -- M-step -----------------------------------------------------------------------------------------------


def m_step(
    job: JobFile, cfg: RestemTrainerConfig, data: list[Encoded], iteration: int
) -> tuple[Any, Any, dict]:
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
    D.drop_fsdp(cfg.parallel, "ReST-EM")
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


class RestemRun:
    """One ReST-EM job on this rank: resume, then per iteration e_step (rank 0 samples and keeps) ->
    m_step (every rank fine-tunes the base model) -> sync -> evaluate -> checkpoint -> report, then finish."""

    def __init__(self, job: JobFile, loop: RolloutLoop):
        D.init_distributed()
        self.cfg = restem_settings(job)
        require_rollout_endpoints(job, RestemConfigError, "a ReST-EM")
        self.job, self.loop = job, loop
        self.reporter = Reporter(job, enabled=D.is_main())
        self.workdir = Path(job.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        random.seed(self.cfg.seed)
        self.store = CheckpointStore(job, self.reporter)
        self.run_tag = run_tag(job.job.name, job.job.uid)
        self.history: list[dict[str, Any]] = []
        self.sample_files: dict[str, Path] = {}
        self.engine: Any = None
        self.tokenizer: Any = None
        self.iteration = 0
        self.last_eval: float | None = None

    def run(self) -> dict[str, Any]:
        done = self.store.completed_result()
        if done is not None:
            return done
        self.connect()
        self.resume()
        if self.iteration > 0:
            self.sync(self.iteration)
        first_eval = self.evaluate(0) if self.iteration == 0 else None
        self.last_eval = first_eval
        while self.iteration < self.cfg.iterations:
            self.step()
        return self.finish()

    def connect(self) -> None:
        from posttrain_trainer.weightsync import WeightSyncer

        job = self.job
        wait_until_serving(job)
        self.rollouts = RolloutClient(
            task_url=job.task_app.url,
            settings=self.cfg.rollout,
            model=job.base_model,
            api_key_env=job.task_app.api_key_env,
        )
        self.budget = ErrorBudget.from_settings(self.cfg.rollout)
        self.syncer = WeightSyncer(job, client=self.store.client) if D.is_main() else None

    def resume(self) -> None:
        """The weights of the latest checkpointed iteration: rebuild the engine and restore them."""
        latest = self.store.latest()
        if latest is None:
            return
        self.engine, self.tokenizer, _ = m_step(self.job, self.cfg, [], latest)
        state = self.store.restore(self.engine, latest)
        self.iteration = int(state["data"].get("iteration", latest))
        self.history = list(state.get("history", []))
        self.reporter.event("resumed", step=self.iteration, checkpoint=self.store.last_uri)

    def step(self) -> None:
        """One iteration."""
        cfg = self.cfg
        started = time.perf_counter()
        payload = self.e_step(started)
        stats = payload["stats"]
        self.iteration += 1
        self.engine = None  # free the previous model before loading the next
        gc.collect()
        sft_started = time.perf_counter()
        self.engine, self.tokenizer, sft = m_step(self.job, cfg, payload["data"], self.iteration)
        stats.update(sft, sft_seconds=time.perf_counter() - sft_started)
        if D.is_main():
            path = self.workdir / f"restem-iteration-{self.iteration}.jsonl"
            self.sample_files[f"restem_iteration_{self.iteration}"] = _write_samples(
                path, payload["kept"], self.tokenizer, self.iteration
            )
        stats["weight_sync_seconds"] = self.sync(self.iteration)
        eval_score = None
        if cfg.eval_seeds and (self.iteration % cfg.eval_every == 0 or self.iteration == cfg.iterations):
            eval_score = self.last_eval = self.evaluate(self.iteration)
        record = {
            "step": self.iteration,
            "total": cfg.iterations,
            "loss": stats["last_loss"],
            **stats,
            "iteration_seconds": time.perf_counter() - started,
        }
        self.history.append(record)
        self.reporter.record(record, self.history)
        self.reporter.event(ITERATION_EVENT, **record)
        if self.store.due(self.iteration, cfg.iterations):
            self.save()
        self.reporter.progress(
            step=self.iteration,
            total=cfg.iterations,
            loss=stats["last_loss"],
            mean_return=stats["mean_return"],
            eval_score=eval_score if eval_score is not None else self.last_eval,
            last_checkpoint=self.store.last_uri,
        )
        preemption.stop_if_asked(self.store, self.iteration, self.save)

    def save(self) -> None:
        self.store.save(
            self.engine,
            self.iteration,
            data_state={"iteration": self.iteration},
            extra={"history": self.history},
        )

    def e_step(self, started: float) -> dict[str, Any]:
        """Rank 0 samples and keeps the good samples; every rank gets {"data", "kept", "stats"} (collective).
        Raises RolloutBudgetExceeded on every rank."""
        cfg = self.cfg
        payload: Any = None
        if D.is_main():
            seeds = iteration_seeds(self.iteration, cfg.prompts, cfg.seed_start)
            policy = replicas.expand(self.job.endpoints.policy)  # every replica, resolved again
            if self.syncer is not None:  # a replica that replaced a pod gets the current weights first
                self.syncer.bring_up_to_date(policy)
            specs = plan_rollouts(self.run_tag, self.iteration, seeds, cfg.samples_per_prompt, policy)
            results = self.loop.collect(self.rollouts, specs)
            errors = [r.error for r in results if not r.ok]
            try:
                self.budget.check(len(results), errors)
                kept = keep_samples(results, cfg.reward_threshold, cfg.max_per_prompt)
                payload = {
                    "data": to_encoded(kept),
                    "kept": kept,
                    "stats": {
                        "rollouts": len(results),
                        "failed_rollouts": len(errors),
                        "mean_return": mean([r.reward for r in results if r.ok]),
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
        return payload

    def sync(self, version: int) -> float:
        """Push the current weights to the rollout servers (collective); returns rank 0's seconds."""
        from posttrain_trainer.modeling import is_peft
        from posttrain_trainer.weightsync import sync_format

        seconds = 0.0
        if D.is_main():
            module = self.engine.module
            result = self.syncer.sync(
                module, self.tokenizer, version, sync_format(self.cfg.weight_sync_format, is_peft(module))
            )
            seconds = result.total_seconds
            self.reporter.event("weight_sync", **result.as_metrics(), path=result.path)
        D.barrier()
        return seconds

    def evaluate(self, at: int) -> float | None:
        """Mean reward on evaluation.seeds with the served weights (collective)."""
        cfg = self.cfg
        score = None
        if D.is_main() and cfg.eval_seeds:
            # a sampled evaluation (evaluation.temperature > 0) runs `instances` episodes over the seeds, so
            # that each seed is scored several times (greedy answers would repeat themselves)
            repeats = max(1, -(-(cfg.eval_instances or 0) // len(cfg.eval_seeds))) if cfg.eval_temperature > 0 else 1
            policy = replicas.expand(self.job.endpoints.policy)
            if self.syncer is not None:
                self.syncer.bring_up_to_date(policy)
            specs = plan_rollouts(self.run_tag, at, cfg.eval_seeds, repeats, policy, kind="ev")
            line = run_evaluation(self.loop, self.rollouts, specs, at, cfg.eval_temperature)
            score = line["eval_score"]
            self.history.append(line)
            self.reporter.record(line, self.history)
            self.reporter.event("evaluation", **line)
        return D.broadcast_object(score)

    def summary(self) -> dict[str, Any]:
        evals = [h["eval_score"] for h in self.history if h.get("eval_score") is not None]
        returns = [h["mean_return"] for h in self.history if h.get("mean_return") is not None]
        return {
            "algorithm": VARIETY,
            "iterations": self.iteration,
            "first_mean_return": returns[0] if returns else None,
            "final_mean_return": returns[-1] if returns else None,
            "first_eval_score": evals[0] if evals else None,
            "final_eval_score": evals[-1] if evals else None,
            "eval_scores": evals,
            "kept_per_iteration": [h.get("kept") for h in self.history if "kept" in h],
            "world_size": D.world_size(),
            "trainer_mode": self.cfg.trainer_mode,
        }

    def finish(self) -> dict[str, Any]:
        """On rank 0: the last M-step's model, the curve and the kept samples as artifacts; the result."""
        from posttrain_trainer.artifacts import finalize

        metrics = self.summary()
        with D.gathered_parameters(self.engine):
            saved = None
            if D.is_main():
                curve = plot_curves(
                    self.history, self.workdir / "reward_curve.png", title=f"ReST-EM: {self.job.job.name}"
                )
                extra = dict(self.sample_files)
                if curve is not None:
                    extra["reward_curve"] = curve
                saved = finalize(
                    self.job,
                    self.engine.module,
                    self.tokenizer,
                    metrics=metrics,
                    steps=self.iteration,
                    metrics_lines=self.history,
                    extra_files=extra,
                    client=self.store.client,
                )
        if D.is_main():
            final = self.reporter.final(
                *saved,
                step=self.iteration,
                total=self.cfg.iterations,
                mean_return=metrics["final_mean_return"],
                eval_score=metrics["final_eval_score"],
                last_checkpoint=self.store.last_uri,
            )
            metrics.update(final)
        D.barrier()
        return metrics


def train(job: JobFile) -> dict[str, Any]:
    with RolloutLoop() as loop:  # one event loop for every rollout of the job, as in rl.train
        return RestemRun(job, loop).run()


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
