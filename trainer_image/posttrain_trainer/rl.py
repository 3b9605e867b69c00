"""GSPO reinforcement learning against a synth task app, with synth's RL config semantics.

Loop: iterations = training.num_epochs x training.iterations_per_epoch. Each iteration:
  1. seeds: batch_size seeds (data.seed_start + iteration * batch_size + j, so a resumed run continues with
     new seeds), group_size rollouts each, through the task app's /rollout (rank 0, asyncio, capped by
     max_concurrent_rollouts / async_semaphore_max; rollouts.py); exact sampled tokens from the rollout
     server's captures; reward = blended episode return / judge scores; error budget.
  2. group advantages (gspo.group_advantages, over the surviving members of each group); with beta = 0 the
     zero-advantage sequences (uniform groups) are dropped: they carry no gradient.
  3. the sequences are shuffled (seeded), split into training.num_minibatches mini-batches (default 4), and
     each mini-batch is split across ranks (DDP averages gradients); old logprobs are recomputed by the
     trainer, never taken from the sampler (vLLM's bf16 sampling logprobs differ by ~0.04, docs/vllm-cpu.md):
     the first mini-batch runs on the pre-update weights, so its old logprobs are its own, detached (ratio
     exactly 1, no extra forward pass); later mini-batches get theirs before the first update, with the same
     micro-batch composition as the update. Logits are computed only from the first completion token on.
     Optional reference logprobs (beta > 0): endpoints.reference POST /v1/score, else a frozen local copy
     (LoRA: the base model under disable_adapter; full: a frozen copy of the initial weights).
  4. one optimizer step per mini-batch (gspo.gspo_loss, clip eps_low/eps_high).
  5. weight sync every training.weight_sync_interval iterations (weightsync.py), timed.
  6. evaluation every evaluation.every_n_iters on evaluation.seeds (mode eval, temperature
     evaluation.temperature, default 0 = greedy), plus once before training and once at the end.
  7. progress (step = iteration, total, loss, mean_return, judge scores, judge failures, tokens/s) via report.py;
     checkpoint every job.checkpoint_every iterations (checkpoint.py) and resume from the latest.
End: final model via artifacts.finalize (fine_tuned_model `rl:...`), metrics.jsonl and reward_curve.png.

Config keys beyond synth's typed schema (all optional, read from [training] then [algorithm]):
num_minibatches (4), eps_low (3e-4), eps_high (4e-4), beta / kl_beta (0), micro_batch (4 sequences per
forward), max_grad_norm (1.0), warmup_ratio (0), lr_scheduler ("constant_with_warmup"),
skip_zero_advantage (true), seed (0), overlong ("keep" | "mask" | "penalty", see sequences_from_results),
overlong_penalty (-1.0); rollout.error_budget (0.25); evaluation.temperature (0.0).
Dropout is off during RL: with a clip band of 4e-4, dropout noise alone would push most ratios out of it. The
update runs in train mode with every dropout disabled (modeling.train_without_dropout), so that activation
checkpointing recomputes (it does nothing in eval mode). DeepSpeed (ZeRO 1-3, `parallelism.use_deepspeed`,
`deepspeed_stage`) shards full fine-tuning; each optimizer step's boundary is set by the update (its
micro-batch count varies), and weight sync and the final save gather ZeRO-3's partitioned weights."""

from __future__ import annotations

import copy
import math
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
from posttrain_trainer import gspo, offpolicy
from posttrain_trainer import storage as s3
from posttrain_trainer.judging import EpisodeJudge
from posttrain_trainer.modeling import train_without_dropout
from posttrain_trainer.report import Reporter
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    RolloutClient,
    RolloutLoop,
    RolloutResult,
    plan_rollouts,
    rubric_weights,
    run_tag,
    section,
)

# The per-iteration "iteration" event: why the reward moves (or does not): how many groups carried signal,
# what the update did, where the time went.
ITERATION_EVENT_FIELDS = (
    "step", "rollouts", "failed_rollouts", "mixed_groups", "train_sequences", "grad_norm", "clip_fraction",
    "rollout_seconds", "update_seconds", "weight_sync_seconds", "iteration_seconds", "judged", "judge_failed",
    "truncated", "empty_responses", "sampler_mismatch", "sampler_kl", "max_staleness", "unexpected_versions",
)  # fmt: skip


class RLConfigError(ValueError):
    pass


# [training].overlong: what happens to a rollout whose response stopped at max_tokens (finish_reason "length").
#   keep    - trained like any other on the task's reward (the default: see sequences_from_results)
#   mask    - its reward still counts in its group's advantages, its tokens carry no loss (DAPO's overlong
#             filtering)
#   penalty - [training].overlong_penalty is added to its reward before the group advantages (DAPO's overlong
#             punishment, as a constant rather than DAPO's length ramp)
OVERLONG_TREATMENTS = ("keep", "mask", "penalty")
DEFAULT_OVERLONG_PENALTY = -1.0


@dataclass
class RLConfig:
    num_epochs: int = 1
    iterations_per_epoch: int = 1
    batch_size: int = 1
    group_size: int = 2
    learning_rate: float = 1e-5
    num_minibatches: int = 4
    eps_low: float = gspo.EPS_LOW
    eps_high: float = gspo.EPS_HIGH
    beta: float = 0.0
    micro_batch: int = 4
    max_grad_norm: float | None = 1.0
    warmup_ratio: float = 0.0
    lr_scheduler: str = "constant_with_warmup"
    weight_sync_interval: int = 1
    skip_zero_advantage: bool = True
    temperature: float = 1.0
    seed: int = 0
    seed_start: int = 0
    eval_every: int = 0
    eval_seeds: list[int] = field(default_factory=list)
    eval_instances: int = 0
    eval_temperature: float = 0.0
    overlong: str = "keep"
    overlong_penalty: float = DEFAULT_OVERLONG_PENALTY
    old_logprobs: str = "trainer"  # offpolicy.OLD_LOGPROBS
    tis_cap: float = gspo.DEFAULT_TIS_CAP
    gspo_variant: str = "sequence"  # gspo.GSPO_VARIANTS
    trainer_mode: str = "full"
    lora: dict[str, Any] = field(default_factory=dict)
    parallel: D.ParallelConfig = field(default_factory=D.ParallelConfig)

    @property
    def iterations(self) -> int:
        return self.num_epochs * self.iterations_per_epoch


def _first(*values: Any, default: Any = None) -> Any:
    for value in values:
        if value is not None:
            return value
    return default


def parse_rl_config(config: dict[str, Any]) -> RLConfig:
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
    seeds = evaluation.get("seeds") or []
    if isinstance(seeds, str):  # "100-199"
        lo, _, hi = seeds.partition("-")
        seeds = list(range(int(lo), int(hi or lo) + 1))
    cfg = RLConfig(
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
        eval_seeds=[int(s) for s in seeds],
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
    if cfg.gspo_variant not in gspo.GSPO_VARIANTS:
        raise RLConfigError(
            f"training.gspo_variant = {cfg.gspo_variant!r}: use one of {', '.join(gspo.GSPO_VARIANTS)}"
        )
    return cfg


def iteration_seeds(iteration: int, batch_size: int, seed_start: int = 0) -> list[int]:
    return [seed_start + iteration * batch_size + j for j in range(batch_size)]


# -- training sequences ---------------------------------------------------------------------------------


@dataclass
class TrainSeq:
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_mask: list[int]
    advantage: float
    reward: float = 0.0
    group: int = 0
    sampling_logprobs: list[float] = field(default_factory=list)  # the sampler's, per completion token
    weight_versions: list[Any] = field(default_factory=list)  # the weights that sampled it, per call
    logprobs_captured: bool = False

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def sequences_from_results(
    results: list[RolloutResult],
    *,
    skip_zero_advantage: bool = True,
    overlong: str = "keep",
    overlong_penalty: float = DEFAULT_OVERLONG_PENALTY,
) -> tuple[list[TrainSeq], dict[str, Any]]:
    """Successful rollouts -> training sequences with group advantages (over the surviving members).

    Truncated rollouts (a response cut at max_tokens) are treated by `overlong` (OVERLONG_TREATMENTS). The
    default is "keep": the task app's reward already judges what the policy produced, and for short-answer
    tasks a cut-off ramble is exactly what the reward should push down (SmolLM2-135M-Instruct on the demo's
    math task at max_tokens 48: 21 of 64 samples stop at the limit; masking would discard a third of the
    batch, most of it the negative examples). "mask" suits long chain-of-thought tasks whose truncated
    answers may be sound but unfinished (DAPO, Yu et al. 2025, section 3.4: overlong filtering stabilises
    training). An empty response is scored and stays in its group; it has no token to train. The reported
    rewards stay the task's; a penalty only moves the advantages."""
    ok = [r for r in results if r.ok]
    shaped = [r.reward + (overlong_penalty if overlong == "penalty" and r.truncated else 0.0) for r in ok]
    advantages = gspo.ragged_group_advantages(shaped, [r.spec.group for r in ok])
    seqs = []
    for r, adv in zip(ok, advantages, strict=True):
        if skip_zero_advantage and adv == 0.0:
            continue
        if overlong == "mask" and r.truncated:
            continue
        for s in r.sequences:
            seqs.append(
                TrainSeq(
                    s.prompt_ids,
                    s.completion_ids,
                    s.completion_mask,
                    adv,
                    r.reward,
                    r.spec.group,
                    s.sampling_logprobs,
                    s.weight_versions,
                    s.logprobs_captured,
                )
            )
    groups: dict[int, list[float]] = {}
    for r, reward in zip(ok, shaped, strict=True):
        groups.setdefault(r.spec.group, []).append(reward)
    stats = {
        "rollouts": len(results),
        "failed": len(results) - len(ok),
        "judge_failed": sum(1 for r in results if r.judge_failed),
        "truncated": sum(1 for r in ok if r.truncated),
        "empty_responses": sum(1 for r in ok if r.empty),
        "mixed_groups": sum(1 for g in groups.values() if len(set(g)) > 1),
        "groups": len(groups),
        "train_sequences": len(seqs),
    }
    return seqs, stats


# -- the update -----------------------------------------------------------------------------------------


def _micro_plan(minibatch: list[TrainSeq], micro: int) -> list[list[TrainSeq]]:
    """This rank's share of a mini-batch in micro-batches; every rank gets the same number of micro-batches
    (an empty one becomes a zero-loss pass, so DDP's collectives stay in step)."""
    world, rank = D.world_size(), D.rank()
    mine = minibatch[rank::world]
    per_rank = math.ceil(len(minibatch) / world)
    count = max(1, math.ceil(per_rank / micro))
    return [mine[i * micro : (i + 1) * micro] for i in range(count)]


def _collate(seqs: list[TrainSeq], pad_id: int) -> gspo.TokenBatch:
    return gspo.collate_sequences(
        [s.prompt_ids for s in seqs],
        [s.completion_ids for s in seqs],
        [s.completion_mask for s in seqs],
        pad_id,
    )


RefFn = Any  # callable(list[TrainSeq], TokenBatch) -> Tensor [B, T-1] of reference logprobs


def gspo_update(
    engine: D.TrainEngine,
    seqs: list[TrainSeq],
    cfg: RLConfig,
    pad_id: int,
    *,
    iteration: int = 0,
    ref_fn: RefFn | None = None,
) -> dict[str, Any]:
    """The GSPO update for one rollout batch (collective: every rank calls it with the same seqs).

    Returns loss (sum over mini-batches of the mean loss), optimizer steps, clip fraction, ratio mean, kl,
    trained policy tokens (all ranks) and seconds."""
    started = time.perf_counter()
    if not seqs:
        return {"loss": 0.0, "optimizer_steps": 0, "policy_tokens": 0, "tokens": 0, "seconds": 0.0}
    order = list(range(len(seqs)))
    random.Random(cfg.seed * 1_000_003 + iteration).shuffle(order)
    shuffled = [seqs[i] for i in order]
    # Within a mini-batch the order changes no gradient (the loss sums over its sequences): by length, so
    # that micro-batches hold sequences of similar length (less padding) and ranks get similar work.
    minibatches = [
        sorted(mb, key=lambda s: s.tokens) for mb in gspo.split_minibatches(shuffled, cfg.num_minibatches)
    ]
    plans = [_micro_plan(mb, cfg.micro_batch) for mb in minibatches]
    model = engine.model
    train_without_dropout(engine.module)  # train(): activation checkpointing recomputes; no dropout
    temperature = cfg.temperature

    # Old (and reference) logprobs with the pre-update weights, same micro-batch composition as the update.
    # The first mini-batch runs on the pre-update weights, so its old logprobs are its own logprobs,
    # detached (ratio exactly 1): no extra forward pass for it; with one mini-batch per iteration (on-policy
    # GSPO) that is the whole batch.
    prepared: list[
        list[tuple[gspo.TokenBatch, torch.Tensor | None, torch.Tensor | None, list[TrainSeq]] | None]
    ] = []
    dev = D.device()
    with torch.no_grad():
        for index, plan in enumerate(plans):
            row = []
            for micro in plan:
                if not micro:
                    row.append(None)
                    continue
                batch = _collate(micro, pad_id)
                old = None
                if index > 0:
                    old = gspo.token_logprobs(
                        engine.module,
                        batch.input_ids.to(dev),
                        batch.attention_mask.to(dev),
                        temperature=temperature,
                        autocast=engine.autocast(),
                        first_target=batch.first_target,
                    )
                ref = ref_fn(micro, batch).to(dev) if (ref_fn is not None and cfg.beta) else None
                row.append((batch, old, ref, micro))
            prepared.append(row)

    loss_total, steps, clip_sum, ratio_sum, kl_sum, counted, policy_tokens, tokens = (
        0.0,
        0,
        0.0,
        0.0,
        0.0,
        0,
        0,
        0,
    )
    grad_norms = []
    mismatch = offpolicy.MismatchMeter()
    for mb, row in zip(minibatches, prepared, strict=True):
        n = len(mb)
        for k, item in enumerate(row):
            boundary = k == len(row) - 1
            if item is None:  # this rank has nothing here: a zero-loss pass keeps DDP in step
                batch = _collate(mb[:1], pad_id)
                lp = gspo.token_logprobs(
                    model,
                    batch.input_ids.to(dev),
                    batch.attention_mask.to(dev),
                    temperature=temperature,
                    autocast=engine.autocast(),
                    first_target=batch.first_target,
                )
                engine.backward(lp.sum() * 0.0, boundary=boundary)
                continue
            batch, old, ref, micro = item
            mask = batch.loss_mask.to(dev)
            lp = gspo.token_logprobs(
                model,
                batch.input_ids.to(dev),
                batch.attention_mask.to(dev),
                temperature=temperature,
                autocast=engine.autocast(),
                first_target=batch.first_target,
            )
            adv = torch.tensor([s.advantage for s in micro], dtype=torch.float32, device=dev)
            old = lp.detach() if old is None else old
            captured = [s.logprobs_captured for s in micro]
            sampler = offpolicy.behaviour_logprobs([s.sampling_logprobs for s in micro], captured, batch, old)
            mismatch.add(old, sampler, mask, captured)
            terms = gspo.gspo_terms(
                lp,
                old,
                adv,
                mask,
                cfg.eps_low,
                cfg.eps_high,
                ref_logprobs=ref,
                beta=cfg.beta,
                num_sequences=n,
                variant=cfg.gspo_variant,
                behavior_logprobs=sampler if cfg.old_logprobs == "sampler" else None,
                tis_cap=cfg.tis_cap,
            )
            engine.backward(terms.loss, boundary=boundary)
            loss_total += float(terms.loss.detach())
            clip_sum += float(terms.clipped.float().sum())
            ratio_sum += float(terms.ratio.sum())
            if terms.kl is not None:
                kl_sum += float(terms.kl.sum())
            counted += len(micro)
            policy_tokens += int(mask.sum())
            tokens += int(batch.attention_mask.sum())
        grad_norms.append(engine.step())
        steps += 1
    seconds = time.perf_counter() - started
    totals = D.all_reduce_sum(
        torch.tensor(
            [loss_total, clip_sum, ratio_sum, kl_sum, counted, policy_tokens, tokens, *mismatch.as_list()],
            dtype=torch.float64,
        )
    )
    loss_total, clip_sum, ratio_sum, kl_sum, counted, policy_tokens, tokens = totals.tolist()[:7]
    mismatch_metrics = offpolicy.MismatchMeter.metrics(totals.tolist()[7:])
    counted = max(counted, 1.0)
    norms = [g for g in grad_norms if g is not None]
    return {
        "loss": loss_total,
        "optimizer_steps": steps,
        "clip_fraction": clip_sum / counted,
        "ratio_mean": ratio_sum / counted,
        "kl": kl_sum / counted if cfg.beta else None,
        "policy_tokens": int(policy_tokens),
        "tokens": int(tokens),
        "grad_norm": sum(norms) / len(norms) if norms else None,
        "seconds": seconds,
        "tokens_per_second": tokens / max(seconds, 1e-9),
        **mismatch_metrics,
    }


# -- reference logprobs ---------------------------------------------------------------------------------


def endpoint_reference_fn(
    url: str, timeout_s: float = 600.0, temperature: float = 1.0, vocab_size: int | None = None
) -> RefFn:
    """Reference logprobs from a reference rollout server: POST /v1/score, at the sampling temperature (the
    distribution the policy's logprobs are computed in)."""
    import httpx

    def score(micro: list[TrainSeq], batch: gspo.TokenBatch) -> torch.Tensor:
        body = {
            "sequences": [
                {"prompt_token_ids": s.prompt_ids, "completion_token_ids": s.completion_ids} for s in micro
            ],
            "temperature": temperature,
            "vocab_size": vocab_size,
        }
        response = httpx.post(f"{url.rstrip('/')}/v1/score", json=body, timeout=timeout_s)
        response.raise_for_status()
        values = response.json()["logprobs"]
        if len(values) != len(micro) or any(
            len(v) != len(s.completion_ids) for v, s in zip(values, micro, strict=True)
        ):
            raise RuntimeError("reference /v1/score returned logprobs that do not match the completions")
        return batch.completion_values([[float(x or 0.0) for x in v] for v in values])

    return score


def local_reference_fn(engine: D.TrainEngine, frozen: torch.nn.Module | None, temperature: float) -> RefFn:
    """A frozen local reference: `frozen` (a copy of the initial full model), or for LoRA the base model
    (the adapter disabled). It runs under the policy's autocast, so that identical weights give identical
    logprobs (KL exactly 0 at step 0)."""

    def score(micro: list[TrainSeq], batch: gspo.TokenBatch) -> torch.Tensor:
        dev = D.device()
        with torch.no_grad():
            ids, mask, first = batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.first_target
            kwargs = {"temperature": temperature, "first_target": first, "autocast": engine.autocast()}
            if frozen is not None:
                return gspo.token_logprobs(frozen, ids, mask, **kwargs)
            module = engine.module
            with module.disable_adapter():
                return gspo.token_logprobs(module, ids, mask, **kwargs)

    return score


# -- the job --------------------------------------------------------------------------------------------


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def train(job: JobFile) -> dict[str, Any]:
    # one event loop for every rollout of the job (rollouts.RolloutLoop: the judge client outlives iterations)
    with RolloutLoop() as loop:
        return _train(job, loop)


def _train(job: JobFile, loop: RolloutLoop) -> dict[str, Any]:
    from posttrain.hardware import torch_dtype

    from posttrain_trainer.artifacts import finalize, reported_artifacts
    from posttrain_trainer.modeling import is_peft, load_dtype, load_model_and_tokenizer
    from posttrain_trainer.optim import build_optimizer, build_scheduler
    from posttrain_trainer.weightsync import WeightSyncer, sync_format

    D.init_distributed()
    cfg = parse_rl_config(job.config)
    if job.task_app is None:
        raise RLConfigError("an RL job file needs task_app.url")
    if not job.endpoints.policy:
        raise RLConfigError("an RL job file needs endpoints.policy (the rollout servers)")
    reporter = Reporter(job, enabled=D.is_main())
    workdir = Path(job.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
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
    frozen = None
    if cfg.beta and not job.endpoints.reference and not is_peft(model):
        frozen = copy.deepcopy(model).eval().to(D.device())
        for p in frozen.parameters():
            p.requires_grad_(False)
    total_steps = cfg.iterations * cfg.num_minibatches
    optimizer = build_optimizer(model, lr=cfg.learning_rate)
    scheduler = build_scheduler(
        optimizer, total_steps=total_steps, warmup_ratio=cfg.warmup_ratio, name=cfg.lr_scheduler
    )
    engine = D.build_engine(
        model,
        optimizer,
        scheduler,
        cfg.parallel,
        max_grad_norm=cfg.max_grad_norm,
        micro_batch=cfg.micro_batch,
    )
    engine.module.eval()  # dropout off (see the module docstring); gradients still flow
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    if cfg.beta:
        ref_fn = (
            endpoint_reference_fn(
                job.endpoints.reference,
                temperature=cfg.temperature,
                vocab_size=getattr(engine.module.config, "vocab_size", None),
            )
            if job.endpoints.reference
            else local_reference_fn(engine, frozen, cfg.temperature)
        )
    else:
        ref_fn = None

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

    iteration, history, last_checkpoint = 0, [], None
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
            iteration = int(state["data"].get("iteration", state["step"]))
            history = list(state.get("history", []))
            last_checkpoint = s3.s3_uri(job.storage.bucket, ckpt.step_prefix(job.storage.prefix, latest))
            reporter.event(
                "resumed",
                step=iteration,
                checkpoint=last_checkpoint,
                optimizer_fingerprint=state["resumed_optimizer_fingerprint"],
                saved_optimizer_fingerprint=state.get("optimizer_fingerprint"),
            )
            engine.module.eval()

    judge = EpisodeJudge.from_config(job.config, rubric_weights(job.config), job.endpoints.judges)
    if judge is not None and D.is_main():
        print(
            f"[posttrain] judge {judge.options['provider']}/{judge.options['model']} at {judge.client.base_url} "
            f"scores {'outcome ' if judge.options['outcome'] else ''}{'events' if judge.options['event'] else ''}",
            flush=True,
        )
    rollout_client = RolloutClient(
        task_url=job.task_app.url,
        config=job.config,
        model=job.base_model,
        api_key_env=job.task_app.api_key_env,
        judge=judge,
    )
    budget = ErrorBudget.from_config(job.config)
    syncer = WeightSyncer(job, client=client, dtype=torch_dtype(precision.sync)) if D.is_main() else None
    fmt = sync_format(job.config, is_peft(engine.module))
    run = run_tag(job.job.name, job.job.uid)
    synced_at = iteration  # the policy server holds the weights of this iteration

    def sync(version: int) -> dict[str, Any]:
        nonlocal synced_at
        out: dict[str, Any] = {}
        with D.gathered_parameters(engine):  # ZeRO-3: the full weights on every rank while rank 0 writes
            if D.is_main():
                result = syncer.sync(engine.module, tokenizer, version, fmt)
                out = result.as_metrics()
                reporter.event("weight_sync", **out, path=result.path, format=fmt, pruned=result.pruned)
        D.barrier()
        synced_at = version
        return out

    def evaluate(at: int) -> float | None:
        if not cfg.eval_seeds:
            return None
        if synced_at != at:
            sync(at)
        score = None
        if D.is_main():
            seeds = list(cfg.eval_seeds)
            if cfg.eval_temperature > 0 and cfg.eval_instances > len(seeds):
                seeds = [seeds[i % len(seeds)] for i in range(cfg.eval_instances)]
            specs = plan_rollouts(run, at, seeds, 1, job.endpoints.policy, kind="ev")
            if len(set(seeds)) < len(seeds):  # repeated seeds (sampled eval): keep the cids unique
                for n, spec in enumerate(specs):
                    spec.cid = f"{spec.cid}-{n}"
            results = loop.collect(
                rollout_client,
                specs,
                mode="eval",
                want_tokens=False,
                policy_overrides={"temperature": cfg.eval_temperature},
            )
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

    if iteration > 0:  # resumed: the rollout servers restarted from the base weights, or hold newer ones
        sync(iteration)
    first_eval = evaluate(iteration) if (cfg.eval_every and iteration == 0) else None
    last_eval = first_eval
    total = cfg.iterations
    while iteration < total:
        started = time.perf_counter()
        seeds = iteration_seeds(iteration, cfg.batch_size, cfg.seed_start)
        payload: Any = None
        if D.is_main():
            specs = plan_rollouts(run, iteration, seeds, cfg.group_size, job.endpoints.policy)
            results = loop.collect(rollout_client, specs)
            errors = [r.error for r in results if not r.ok]
            try:
                budget.check(len(results), errors)
                seqs, stats = sequences_from_results(
                    results,
                    skip_zero_advantage=cfg.skip_zero_advantage and not cfg.beta,
                    overlong=cfg.overlong,
                    overlong_penalty=cfg.overlong_penalty,
                )
                ok = [r for r in results if r.ok]
                outcome = [r.outcome_score for r in ok if r.outcome_score is not None]
                events = [r.events_score for r in ok if r.events_score is not None]
                stats.update(
                    mean_return=_mean([r.reward for r in ok]),
                    mean_env_return=_mean([r.env_return for r in ok]),
                    judge_scores={
                        k: v
                        for k, v in (("outcome", _mean(outcome)), ("events", _mean(events)))
                        if v is not None
                    },
                    sampled_tokens=sum(sum(s.completion_mask) for r in ok for s in r.sequences),
                    rollout_seconds=time.perf_counter() - started,
                    errors=sorted(set(errors))[:3],
                    **offpolicy.staleness(
                        [s.weight_versions for r in ok for s in r.sequences], synced_at, iteration
                    ),
                )
                if judge is not None:
                    stats["judged"] = len(ok)
                else:
                    stats.pop("judge_failed")
                payload = {"seqs": seqs, "stats": stats}
            except RolloutBudgetExceeded as err:
                payload = {"error": str(err)}
        payload = D.broadcast_object(payload)
        if "error" in payload:
            raise RolloutBudgetExceeded(payload["error"])
        seqs, stats = payload["seqs"], payload["stats"]
        update = gspo_update(engine, seqs, cfg, pad_id, iteration=iteration, ref_fn=ref_fn)
        iteration += 1
        sync_metrics: dict[str, Any] = {}
        if iteration % max(1, cfg.weight_sync_interval) == 0 and iteration < total:
            sync_metrics = sync(iteration)
        eval_score = None
        if cfg.eval_every and iteration % cfg.eval_every == 0 and iteration < total:
            eval_score = last_eval = evaluate(iteration)
        elapsed = time.perf_counter() - started
        record = {
            "step": iteration,
            "total": total,
            "loss": update["loss"],
            "mean_return": stats["mean_return"],
            "mean_env_return": stats["mean_env_return"],
            "judge_scores": stats["judge_scores"],
            "rollouts": stats["rollouts"],
            "failed_rollouts": stats["failed"],
            "truncated": stats["truncated"],
            "empty_responses": stats["empty_responses"],
            "mixed_groups": stats["mixed_groups"],
            "train_sequences": stats["train_sequences"],
            "optimizer_steps": update["optimizer_steps"],
            "clip_fraction": update.get("clip_fraction"),
            "ratio_mean": update.get("ratio_mean"),
            "kl": update.get("kl"),
            "grad_norm": update.get("grad_norm"),
            "lr": engine.current_lr(),
            "policy_tokens": update["policy_tokens"],
            "update_seconds": update["seconds"],
            "tokens_per_second": update.get("tokens_per_second", 0.0),
            "sampler_mismatch": update.get("sampler_mismatch"),
            "sampler_kl": update.get("sampler_kl"),
            "sampler_logprobs_missing": update.get("sampler_logprobs_missing"),
            **{k: stats.get(k) for k in ("max_staleness", "unexpected_versions")},
            "rollout_seconds": stats["rollout_seconds"],
            "iteration_seconds": elapsed,
            **{k: stats[k] for k in ("judged", "judge_failed") if k in stats},
            **sync_metrics,
        }
        history.append(record)
        reporter.event(
            "iteration", **{k: record.get(k) for k in ITERATION_EVENT_FIELDS}, groups=stats["groups"]
        )
        if (
            client is not None
            and job.checkpoint_every
            and iteration % job.checkpoint_every == 0
            and iteration < total
        ):
            last_checkpoint = ckpt.save_checkpoint(
                engine,
                client=client,
                bucket=job.storage.bucket,
                prefix=job.storage.prefix,
                step=iteration,
                workdir=workdir,
                data_state={"iteration": iteration},
                extra={"history": history, "weight_version": synced_at},
                keep=ckpt.keep_checkpoints(job.config),
            )
            reporter.event("checkpoint", step=iteration, uri=last_checkpoint)
        reporter.progress(
            step=iteration,
            total=total,
            loss=update["loss"],
            mean_return=stats["mean_return"],
            judge_scores=stats["judge_scores"] or None,
            judge_failed=stats.get("judge_failed"),
            truncated=stats["truncated"],
            tokens_per_second=update.get("tokens_per_second"),
            sampler_mismatch=update.get("sampler_mismatch"),
            sampler_kl=update.get("sampler_kl"),
            eval_score=eval_score if eval_score is not None else last_eval,
            last_checkpoint=last_checkpoint,
        )

    final_eval = evaluate(iteration) if cfg.eval_seeds else None
    returns = [
        h["mean_return"] for h in history if h.get("mean_return") is not None and "eval_score" not in h
    ]
    metrics = {
        "iterations": iteration,
        "total_iterations": total,
        "first_mean_return": returns[0] if returns else None,
        "final_mean_return": returns[-1] if returns else None,
        "first_eval_score": first_eval,
        "final_eval_score": final_eval,
        "world_size": D.world_size(),
        "engine": engine.kind,
        "trainer_mode": cfg.trainer_mode,
        "group_size": cfg.group_size,
        "batch_size": cfg.batch_size,
    }
    model_id = artifacts = None
    with D.gathered_parameters(engine):  # ZeRO-3: the full weights on every rank while rank 0 saves
        if D.is_main():
            curve = plot_curves(history, workdir / "reward_curve.png", title=f"GSPO: {job.job.name}")
            model_id, artifacts = finalize(
                job,
                engine.module,
                tokenizer,
                metrics=metrics,
                steps=iteration,
                metrics_lines=history,
                extra_files={"reward_curve": curve} if curve else None,
                client=client,
            )
    if D.is_main():
        reporter.progress(
            step=iteration,
            total=total,
            mean_return=metrics["final_mean_return"],
            eval_score=final_eval,
            last_checkpoint=last_checkpoint,
        )
        reporter.result(model_id, artifacts)
        metrics["fine_tuned_model"] = model_id
        metrics["artifacts"] = artifacts
    D.barrier()
    return metrics


def main(job: JobFile) -> int:
    try:
        train(job)
    except (RLConfigError, RolloutBudgetExceeded) as err:
        if D.is_main():
            print(f"error: {err}", flush=True)
        D.shutdown()
        return EXIT_CONFIG_ERROR if isinstance(err, RLConfigError) else EXIT_RETRYABLE
    D.shutdown()
    return 0
