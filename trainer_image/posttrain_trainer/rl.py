"""GSPO reinforcement learning against a synth task app, with synth's RL config semantics.

Loop: iterations = training.num_epochs x training.iterations_per_epoch. Each iteration:
  1. seeds: batch_size seeds (data.seed_start + iteration * batch_size + j, so a resumed run continues with
     new seeds), group_size rollouts each, through the task app's /rollout (rank 0, asyncio, capped by
     max_concurrent_rollouts / async_semaphore_max; rollouts.py); exact sampled tokens from the rollout
     server's captures; reward = blended episode return / judge scores; error budget.
  2. group advantages (gspo.group_advantages, over the surviving members of each group); with beta = 0 the
     zero-advantage sequences (uniform groups) are dropped: they carry no gradient. With step rewards on
     (training.step_rewards_enabled, mode decision_stepwise; step_rewards.py) each decision's reward becomes
     group-standardised return-to-go credit, added to the episode's advantage on the tokens that decision
     sampled; such per-token advantages train with GSPO-token.
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
  With training.async_depth N > 0 (pipeline.py), step 1 of iterations k+1 .. k+N runs on rank 0 in a
  background thread while steps 2-5 of iteration k run: a batch is sampled by weights up to N versions
  behind, rollouts further behind are dropped and counted, and the sampler's logprobs are the behaviour
  policy (old_logprobs = "sampler", truncated importance sampling; the settings force or require it). Each
  iteration reports the version lag (staleness_mean, staleness_max), stale_dropped, the seconds the trainer
  waited for its batch, and the idle share of the trainer and of the rollout servers (utilisation.py).
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
micro-batch count varies), and weight sync and the final save gather ZeRO-3's partitioned weights. FSDP2
(`parallelism.fsdp`, fsdp.py) shards full fine-tuning too; a beta > 0 frozen reference is sharded alike, and
the full state dict is gathered onto rank 0 for weight sync, the final save and checkpoints. Under either,
every rank runs every forward pass together (an empty micro-batch runs a discarded one)."""

from __future__ import annotations

import contextlib
import copy
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from posttrain import hardware
from posttrain.api import traces
from posttrain.api.exitcodes import EXIT_CONFIG_ERROR, EXIT_RETRYABLE
from posttrain.api.jobfile import JobFile
from posttrain.plotting import plot_curves

from posttrain_trainer import distributed as D
from posttrain_trainer import (
    gspo,
    offpolicy,
    preemption,
    prefix_packing,
    replicas,
    rl_vision,
    step_rewards,
    utilisation,
)
from posttrain_trainer.judging import EpisodeJudge
from posttrain_trainer.modeling import train_without_dropout
from posttrain_trainer.online import (
    iteration_seeds,
    mean,
    require_rollout_endpoints,
    run_evaluation,
    std,
    wait_until_serving,
)
from posttrain_trainer.pipeline import RolloutPipeline, SampledBatch, requested_window
from posttrain_trainer.report import Reporter
from posttrain_trainer.resume import CheckpointStore
from posttrain_trainer.rl_config import (
    DEFAULT_OVERLONG_PENALTY,
    RLConfigError,
    RLTrainerConfig,
    rl_settings,
)
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    RolloutClient,
    RolloutLoop,
    RolloutResult,
    api_headers,
    plan_rollouts,
    run_tag,
)
from posttrain_trainer.task_rubric import judge_rubrics

# The per-iteration "iteration" event: why the reward moves (or does not): how many groups carried signal,
# what the update did, where the time went.
ITERATION_EVENT_FIELDS = (
    "step", "rollouts", "failed_rollouts", "mixed_groups", "train_sequences", "grad_norm", "clip_fraction",
    "rollout_seconds", "update_seconds", "weight_sync_seconds", "iteration_seconds", "judged", "judge_failed",
    "truncated", "empty_responses", "sampler_mismatch", "sampler_kl", "sampler_max_abs_delta", "max_staleness",
    "unexpected_versions", "media_tokens_sampled", "mean_turns", "decision_rewards_nonzero", "decision_reward_sum",
    "staleness_mean", "staleness_max", "stale_dropped", "rollout_wait_seconds", "trainer_idle_share",
    "rollout_idle_share", "weight_sync_stale_seconds", "forward_positions", "padded_positions",
    "sampling_rounds", "groups_sampled",
)  # fmt: skip


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
    token_advantages: list[float] | None = None  # per completion token (per-decision credit), else None
    images: list[str] = field(default_factory=list)  # image URLs of the prompt's placeholders (vision)

    @property
    def tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def sequences_from_results(
    results: list[RolloutResult],
    *,
    skip_zero_advantage: bool = True,
    overlong: str = "keep",
    overlong_penalty: float = DEFAULT_OVERLONG_PENALTY,
    max_tokens: int = 0,
    overlong_ramp: int = 0,
) -> tuple[list[TrainSeq], dict[str, Any]]:
    """Successful rollouts -> training sequences with group advantages (over the surviving members).

    Truncated rollouts (a response cut at max_tokens) are treated by `overlong` (OVERLONG_TREATMENTS). The
    default is "keep": the task app's reward already judges what the policy produced, and for short-answer
    tasks a cut-off ramble is exactly what the reward should push down (SmolLM2-135M-Instruct on the demo's
    math task at max_tokens 48: 21 of 64 samples stop at the limit; masking would discard a third of the
    batch, most of it the negative examples). "mask" suits long chain-of-thought tasks whose truncated
    answers may be sound but unfinished (DAPO, Yu et al. 2025, section 3.4: overlong filtering stabilises
    training). An empty response is scored and stays in its group; it has no token to train. The reported
    rewards stay the task's; a penalty only moves the advantages. "shaped" is DAPO's soft punishment
    (gspo.overlong_shaping): the penalty ramps up over the last `overlong_ramp` tokens before `max_tokens`."""
    ok = [r for r in results if r.ok]
    shaped = [
        r.reward + _overlong_reward(r, overlong, overlong_penalty, max_tokens, overlong_ramp) for r in ok
    ]
    advantages = gspo.ragged_group_advantages(shaped, [r.spec.group for r in ok])
    credits = decision_credits(ok)
    seqs = []
    for r, adv, credit in zip(ok, advantages, credits, strict=True):
        if skip_zero_advantage and adv == 0.0 and not any(credit):
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
                    step_rewards.token_advantages(adv, credit, s.call_index) if any(credit) else None,
                    list(s.images),
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
        "mean_turns": mean([float(r.turns) for r in ok]),
        "decision_rewards_nonzero": sum(1 for r in ok for d in r.decision_rewards if d),
        "decision_reward_sum": sum(sum(r.decision_rewards) for r in ok),
    }
    return seqs, stats


def _overlong_reward(r: RolloutResult, overlong: str, penalty: float, max_tokens: int, ramp: int) -> float:
    if overlong == "penalty":
        return penalty if r.truncated else 0.0
    if overlong == "shaped":  # the longest call's response (each call is cut at max_tokens)
        length = max((sum(s.completion_mask) for s in r.sequences), default=0)
        return gspo.overlong_shaping(length, max_tokens, ramp, penalty)
    return 0.0


def groups_with_signal(results: list[RolloutResult]) -> list[list[RolloutResult]]:
    """The groups (in order) whose successful members' rewards are not all equal: the others have advantage 0
    everywhere and carry no gradient."""
    groups: dict[int, list[RolloutResult]] = {}
    for r in results:
        groups.setdefault(r.spec.group, []).append(r)
    return [g for g in groups.values() if len({r.reward for r in g if r.ok}) > 1]


def refill_groups(missing: int, kept: int, sampled: int, batch_size: int) -> int:
    """How many groups a further round of dynamic sampling rolls out for `missing` groups with signal: as
    many as the signal rate seen so far (kept of sampled) says it takes, at most batch_size; a full batch
    while no group has had signal. One group short late in training costs two groups, not a whole batch."""
    if kept <= 0:
        return batch_size
    return max(1, min(batch_size, math.ceil(missing * sampled / kept)))


def sample_with_signal(
    sample: Any, batch_size: int, max_rounds: int
) -> tuple[list[RolloutResult], list[RolloutResult], dict[str, Any]]:
    """DAPO's dynamic sampling: `sample(round, groups)` rolls out that many groups (round 0: the iteration's
    own batch_size prompts); groups without reward variance are dropped and further rounds sampled until
    batch_size groups carry signal or max_rounds were sampled, each round only as many groups as
    refill_groups expects to fill the batch. Returns the kept groups' results (group ids made unique across
    rounds; at most batch_size groups), every result sampled (the error budget counts them all) and the
    counts."""
    kept: list[list[RolloutResult]] = []
    everything: list[RolloutResult] = []
    rounds = sampled = 0
    while rounds < max_rounds and len(kept) < batch_size:
        groups = (
            batch_size
            if rounds == 0
            else refill_groups(batch_size - len(kept), len(kept), sampled, batch_size)
        )
        results = sample(rounds, groups)
        for r in results:
            r.spec.group += rounds * batch_size
        everything += results
        kept += groups_with_signal(results)
        sampled += groups
        rounds += 1
    kept = kept[:batch_size]
    stats = {"sampling_rounds": rounds, "groups_sampled": len({r.spec.group for r in everything}),
             "groups_kept": len(kept)}  # fmt: skip
    return [r for g in kept for r in g], everything, stats


def call_versions(result: RolloutResult) -> list[Any]:
    """The weight version of each captured policy call of a rollout (the rollout server's captures)."""
    versions = result.trace.get("weight_versions")
    if versions is None:
        versions = [v for s in result.sequences for v in s.weight_versions]
    return list(versions)


def decision_credits(ok: list[RolloutResult]) -> list[list[float]]:
    """Per rollout, each decision's credit (step_rewards.group_decision_credit over its group); empty lists
    when step rewards are off."""
    togo = [step_rewards.returns_to_go(r.decision_rewards) for r in ok]
    out: list[list[float]] = [[] for _ in ok]
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(ok):
        groups.setdefault(r.spec.group, []).append(i)
    for members in groups.values():
        for i, credit in zip(
            members, step_rewards.group_decision_credit([togo[i] for i in members]), strict=True
        ):
            out[i] = credit
    return out


# -- the update -----------------------------------------------------------------------------------------


def _micro_plan(minibatch: list[TrainSeq], micro: int, contiguous: bool = False) -> list[list[TrainSeq]]:
    """This rank's share of a mini-batch in micro-batches; every rank gets the same number of micro-batches
    (an empty one becomes a zero-loss pass, so DDP's collectives stay in step). The share is every world-th
    row (a length-sorted mini-batch: similar work per rank), or with `contiguous` a run of rows (a
    prompt-sorted one: a prompt's samples stay on one rank, where they pack)."""
    world, rank = D.world_size(), D.rank()
    per_rank = math.ceil(len(minibatch) / world)
    mine = minibatch[rank * per_rank : (rank + 1) * per_rank] if contiguous else minibatch[rank::world]
    count = max(1, math.ceil(per_rank / micro))
    return [mine[i * micro : (i + 1) * micro] for i in range(count)]


def _collate(
    seqs: list[TrainSeq], pad_id: int, processor: Any = None, pack: prefix_packing.PackPolicy | None = None
) -> gspo.TokenBatch:
    """Right-padded ids; with a vision policy's processor, the pixel values of the rows' images too; with a
    pack policy, the rows packed by shared prefix where that saves work (prefix_packing)."""
    batch = gspo.collate_sequences(
        [s.prompt_ids for s in seqs],
        [s.completion_ids for s in seqs],
        [s.completion_mask for s in seqs],
        pad_id,
    )
    if pack is not None and len(seqs) > 1:
        batch.packed = prefix_packing.plan(
            [list(s.prompt_ids) + list(s.completion_ids) for s in seqs], batch.completion_start, pad_id,
            window=pack.window,
        )  # fmt: skip
    if any(s.images for s in seqs):
        if processor is None:
            raise rl_vision.VisionInputError(
                "a rollout's prompt holds images, but the policy is text-only (no vision_config)"
            )
        batch.model_inputs = rl_vision.image_inputs(processor, [s.images for s in seqs], batch.input_ids)
    return batch


RefFn = Any  # callable(list[TrainSeq], TokenBatch) -> Tensor [B, T-1] of reference logprobs


@dataclass
class PreparedMicro:
    """One micro-batch of this rank, ready for the update: old logprobs (None: the pre-update weights are
    the current ones, see _prepare) and reference logprobs (beta > 0) computed before any optimizer step."""

    batch: gspo.TokenBatch
    old: torch.Tensor | None
    ref: torch.Tensor | None
    seqs: list[TrainSeq]


@dataclass
class UpdateTotals:
    """Sums over this rank's micro-batches (all ranks after all_ranks())."""

    loss: float = 0.0
    clipped: float = 0.0
    ratio: float = 0.0
    kl: float = 0.0
    counted: float = 0
    policy_tokens: float = 0
    tokens: float = 0
    positions: float = 0  # what the forward passes ran over: padded rows, or packed rows where they packed
    plain_positions: float = 0  # the padded rows' positions, packed or not
    mismatch: offpolicy.MismatchMeter = field(default_factory=offpolicy.MismatchMeter)

    def add(self, terms: Any, micro: PreparedMicro, mask: torch.Tensor) -> None:
        self.loss += float(terms.loss.detach())
        self.clipped += float(terms.clipped.float().sum())
        self.ratio += float(terms.ratio.sum())
        if terms.kl is not None:
            self.kl += float(terms.kl.sum())
        self.counted += len(micro.seqs)
        self.policy_tokens += int(mask.sum())
        self.tokens += int(micro.batch.attention_mask.sum())
        packed = micro.batch.packed
        self.plain_positions += micro.batch.input_ids.numel()
        self.positions += packed.input_ids.numel() if packed is not None else micro.batch.input_ids.numel()

    def all_ranks(self) -> tuple[UpdateTotals, dict[str, Any]]:
        """The sums over all ranks, and the sampler-mismatch metrics over all ranks."""
        values = [self.loss, self.clipped, self.ratio, self.kl, self.counted, self.policy_tokens, self.tokens,
                  self.positions, self.plain_positions]  # fmt: skip
        totals = D.all_reduce_sum(
            torch.tensor([*values, *self.mismatch.as_list()], dtype=torch.float64)
        ).tolist()
        metrics = offpolicy.MismatchMeter.metrics(totals[len(values) :])
        if metrics["sampler_mismatch"] is not None:
            metrics["sampler_max_abs_delta"] = max(D.gather_objects(self.mismatch.max_abs))
        return UpdateTotals(*totals[: len(values)]), metrics


def _shuffled_minibatches(
    seqs: list[TrainSeq], cfg: RLTrainerConfig, iteration: int, by_prompt: bool = False
) -> list[list[TrainSeq]]:
    order = list(range(len(seqs)))
    random.Random(cfg.seed * 1_000_003 + iteration).shuffle(order)
    shuffled = [seqs[i] for i in order]

    # Within a mini-batch the order changes no gradient (the loss sums over its sequences): by length, so
    # that micro-batches hold sequences of similar length (less padding) and ranks get similar work; when
    # rows pack by shared prefix, by prompt first, so that a group's samples share micro-batches.
    def key(s: TrainSeq) -> Any:
        return (s.prompt_ids, s.tokens) if by_prompt else s.tokens

    return [sorted(mb, key=key) for mb in gspo.split_minibatches(shuffled, cfg.num_minibatches)]


def _logprobs(module: torch.nn.Module, engine: D.TrainEngine, batch: gspo.TokenBatch, temperature: float):
    dev = D.device()
    return gspo.token_logprobs(
        module,
        batch.input_ids.to(dev),
        batch.attention_mask.to(dev),
        temperature=temperature,
        autocast=engine.autocast(),
        first_target=batch.first_target,
        model_inputs=_on_device(batch.model_inputs),
        packed=batch.packed,
    )


def _on_device(inputs: dict[str, Any]) -> dict[str, Any]:
    dev = D.device()
    return {k: v.to(dev) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


@torch.no_grad()
def _prepare(
    engine: D.TrainEngine,
    minibatches: list[list[TrainSeq]],
    cfg: RLTrainerConfig,
    pad_id: int,
    ref_fn: RefFn | None,
    processor: Any = None,
    pack: prefix_packing.PackPolicy | None = None,
) -> list[list[PreparedMicro | None]]:
    """Old (and reference) logprobs with the pre-update weights, same micro-batch composition as the update.
    The first mini-batch runs on the pre-update weights, so its old logprobs are its own logprobs, detached
    (ratio exactly 1): no extra forward pass for it; with one mini-batch per iteration (on-policy GSPO)
    that is the whole batch. Where the weights are sharded, a rank with an empty micro-batch runs the same
    forward passes on a stand-in sequence and drops them: the others wait for its share of each gather."""
    prepared: list[list[PreparedMicro | None]] = []
    for index, minibatch in enumerate(minibatches):
        row: list[PreparedMicro | None] = []
        for micro in _micro_plan(minibatch, cfg.micro_batch, contiguous=pack is not None):
            if not micro:
                row.append(None)
                if D.shards_parameters(engine):
                    stand_in = _collate(minibatch[:1], pad_id, processor)
                    if index > 0:
                        _logprobs(engine.module, engine, stand_in, cfg.temperature)
                    if ref_fn is not None and cfg.beta and getattr(ref_fn, "collective", False):
                        ref_fn(minibatch[:1], stand_in)
                continue
            batch = _collate(micro, pad_id, processor, pack)
            old = _logprobs(engine.module, engine, batch, cfg.temperature) if index > 0 else None
            ref = ref_fn(micro, batch).to(D.device()) if (ref_fn is not None and cfg.beta) else None
            row.append(PreparedMicro(batch, old, ref, micro))
        prepared.append(row)
    return prepared


def _micro_step(
    engine: D.TrainEngine,
    item: PreparedMicro | None,
    minibatch: list[TrainSeq],
    cfg: RLTrainerConfig,
    pad_id: int,
    *,
    boundary: bool,
    totals: UpdateTotals,
    processor: Any = None,
) -> None:
    """Forward and backward of one micro-batch (the GSPO loss normalised by the mini-batch's size)."""
    if item is None:  # this rank has nothing here: a zero-loss pass keeps DDP in step
        lp = _logprobs(engine.model, engine, _collate(minibatch[:1], pad_id, processor), cfg.temperature)
        engine.backward(lp.sum() * 0.0, boundary=boundary)
        return
    dev = D.device()
    mask = item.batch.loss_mask.to(dev)
    lp = _logprobs(engine.model, engine, item.batch, cfg.temperature)
    variant = cfg.gspo_variant
    if any(s.token_advantages is not None for s in item.seqs):  # per-decision credit: GSPO-token
        per_token = [
            s.token_advantages if s.token_advantages is not None else [s.advantage] * len(s.completion_ids)
            for s in item.seqs
        ]
        adv = item.batch.completion_values(per_token).to(dev)
        variant = "token" if variant == "sequence" else variant
    else:
        adv = torch.tensor([s.advantage for s in item.seqs], dtype=torch.float32, device=dev)
    old = lp.detach() if item.old is None else item.old
    captured = [s.logprobs_captured for s in item.seqs]
    sampler = offpolicy.behaviour_logprobs(
        [s.sampling_logprobs for s in item.seqs], captured, item.batch, old
    )
    totals.mismatch.add(old, sampler, mask, captured)
    terms = gspo.gspo_terms(
        lp,
        old,
        adv,
        mask,
        cfg.eps_low,
        cfg.eps_high,
        ref_logprobs=item.ref,
        beta=cfg.beta,
        num_sequences=len(minibatch),
        variant=variant,
        behavior_logprobs=sampler if cfg.old_logprobs == "sampler" else None,
        tis_cap=cfg.tis_cap,
        num_tokens=sum(sum(s.completion_mask) for s in minibatch),  # DAPO's token-level normaliser
    )
    engine.backward(terms.loss, boundary=boundary)
    totals.add(terms, item, mask)


def gspo_update(
    engine: D.TrainEngine,
    seqs: list[TrainSeq],
    cfg: RLTrainerConfig,
    pad_id: int,
    *,
    iteration: int = 0,
    ref_fn: RefFn | None = None,
    processor: Any = None,
    pack: prefix_packing.PackPolicy | None = None,
) -> dict[str, Any]:
    """The GSPO update for one rollout batch (collective: every rank calls it with the same seqs); pack:
    rows packed by shared prefix (prefix_packing.pack_policy).

    Returns loss (sum over mini-batches of the mean loss), optimizer steps, clip fraction, ratio mean, kl,
    trained policy tokens (all ranks) and seconds."""
    started = time.perf_counter()
    if not seqs:
        return {"loss": 0.0, "optimizer_steps": 0, "policy_tokens": 0, "tokens": 0, "seconds": 0.0}
    minibatches = _shuffled_minibatches(seqs, cfg, iteration, by_prompt=pack is not None)
    train_without_dropout(engine.module)  # train(): activation checkpointing recomputes; no dropout
    prepared = _prepare(engine, minibatches, cfg, pad_id, ref_fn, processor, pack)
    totals, grad_norms = UpdateTotals(), []
    for mb, row in zip(minibatches, prepared, strict=True):
        for k, item in enumerate(row):
            _micro_step(
                engine, item, mb, cfg, pad_id, boundary=k == len(row) - 1, totals=totals, processor=processor
            )
        grad_norms.append(engine.step())
    seconds = time.perf_counter() - started
    all_totals, mismatch_metrics = totals.all_ranks()
    return {
        **_update_metrics(all_totals, grad_norms, len(minibatches), seconds, cfg.beta),
        **mismatch_metrics,
    }


def _update_metrics(
    totals: UpdateTotals, grad_norms: list[float | None], steps: int, seconds: float, beta: float
) -> dict[str, Any]:
    counted = max(totals.counted, 1.0)
    norms = [g for g in grad_norms if g is not None]
    return {
        "loss": totals.loss,
        "optimizer_steps": steps,
        "clip_fraction": totals.clipped / counted,
        "ratio_mean": totals.ratio / counted,
        "kl": totals.kl / counted if beta else None,
        "policy_tokens": int(totals.policy_tokens),
        "tokens": int(totals.tokens),
        "forward_positions": int(totals.positions),
        "padded_positions": int(totals.plain_positions),
        "grad_norm": sum(norms) / len(norms) if norms else None,
        "seconds": seconds,
        "tokens_per_second": totals.tokens / max(seconds, 1e-9),
    }


# -- reference logprobs ---------------------------------------------------------------------------------


def endpoint_reference_fn(
    url: str, timeout_s: float = 600.0, temperature: float = 1.0, vocab_size: int | None = None
) -> RefFn:
    """Reference logprobs from a reference rollout server: POST /v1/score, at the sampling temperature (the
    distribution the policy's logprobs are computed in)."""
    import httpx

    def score(micro: list[TrainSeq], batch: gspo.TokenBatch) -> torch.Tensor:
        if batch.model_inputs:  # /v1/score sends token ids alone: the images would be missing
            raise RLConfigError(
                "a reference rollout server cannot score image prompts: use a local reference"
            )
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
    (the adapter disabled). It runs under the policy's autocast (FSDP2: the copy is sharded with the
    policy's mixed precision), so that identical weights give identical logprobs (KL exactly 0 at step 0).
    `score.collective`: its forward gathers sharded weights, so every rank must call it together."""

    def score(micro: list[TrainSeq], batch: gspo.TokenBatch) -> torch.Tensor:
        dev = D.device()
        with torch.no_grad():
            ids, mask, first = batch.input_ids.to(dev), batch.attention_mask.to(dev), batch.first_target
            kwargs = {"temperature": temperature, "first_target": first, "autocast": engine.autocast(),
                      "model_inputs": _on_device(batch.model_inputs), "packed": batch.packed}  # fmt: skip
            if frozen is not None:
                return gspo.token_logprobs(frozen, ids, mask, **kwargs)
            module = engine.module
            with module.disable_adapter():
                return gspo.token_logprobs(module, ids, mask, **kwargs)

    score.collective = engine.kind == "fsdp" if frozen is not None else D.shards_parameters(engine)
    return score


# -- the job --------------------------------------------------------------------------------------------


def build_policy(
    job: JobFile, cfg: RLTrainerConfig, precision: Any
) -> tuple[D.TrainEngine, Any, torch.nn.Module | None]:
    """The policy's engine (collective), its tokenizer, and a frozen copy of the initial weights where the
    KL term needs a local full-model reference."""
    from posttrain_trainer.modeling import is_peft, load_for_training
    from posttrain_trainer.optim import build_optimizer, build_scheduler

    model, tokenizer = load_for_training(job, cfg, precision)
    frozen = None
    if cfg.beta and not job.endpoints.reference and not is_peft(model):
        frozen = copy.deepcopy(model).eval().to(D.device())  # before the policy is sharded
        for p in frozen.parameters():
            p.requires_grad_(False)
    optimizer = build_optimizer(model, lr=cfg.learning_rate)
    scheduler = build_scheduler(
        optimizer,
        total_steps=cfg.iterations * cfg.num_minibatches,
        warmup_ratio=cfg.warmup_ratio,
        name=cfg.lr_scheduler,
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
    return engine, tokenizer, D.shard_frozen(engine, frozen)


def iteration_record(
    step: int, total: int, update: dict[str, Any], stats: dict[str, Any], lr: float, seconds: float
) -> dict[str, Any]:
    """One iteration's line of metrics.jsonl (sync metrics are added by the caller)."""
    return {
        "step": step,
        "total": total,
        "loss": update["loss"],
        "mean_return": stats["mean_return"],
        "return_std": stats.get("return_std"),
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
        "lr": lr,
        "policy_tokens": update["policy_tokens"],
        "update_seconds": update["seconds"],
        "tokens_per_second": update.get("tokens_per_second", 0.0),
        "forward_positions": update.get("forward_positions"),
        "padded_positions": update.get("padded_positions"),
        "sampler_mismatch": update.get("sampler_mismatch"),
        "sampler_kl": update.get("sampler_kl"),
        "sampler_max_abs_delta": update.get("sampler_max_abs_delta"),
        "sampler_logprobs_missing": update.get("sampler_logprobs_missing"),
        **{k: stats.get(k) for k in ("max_staleness", "unexpected_versions")},
        **{k: stats.get(k) for k in ("staleness_mean", "staleness_max", "stale_dropped")},
        "rollout_seconds": stats["rollout_seconds"],
        "rollout_wait_seconds": stats.get("rollout_wait_seconds"),
        "iteration_seconds": seconds,
        **{k: stats.get(k) for k in ("mean_turns", "decision_rewards_nonzero", "decision_reward_sum")},
        **{k: stats[k] for k in ("judged", "judge_failed", "media_tokens_sampled") if k in stats},
        # dynamic sampling: how many groups it took to find the batch's groups with signal, in how many rounds
        **{k: stats[k] for k in ("sampling_rounds", "groups_sampled", "groups_kept") if k in stats},
    }


class RLRun:
    """One GSPO job on this rank. Rank 0 collects and scores the rollouts and talks to the rollout servers;
    every rank updates (collectives). run() = resume, then per iteration collect -> score -> update ->
    sync -> evaluate -> checkpoint -> report, then finish."""

    def __init__(self, job: JobFile, loop: RolloutLoop):
        D.init_distributed()
        self.cfg = cfg = rl_settings(job)
        require_rollout_endpoints(job, RLConfigError, "an RL")
        self.job, self.loop = job, loop
        self.reporter = Reporter(job, enabled=D.is_main())
        self.workdir = Path(job.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        self.precision = D.announce_precision(
            cfg.parallel, lora_policy=hardware.is_lora_mode(cfg.trainer_mode)
        )
        self.engine, self.tokenizer, frozen = build_policy(job, cfg, self.precision)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.processor = self._vision_processor(job)
        self.pack, pack_line = prefix_packing.pack_policy(
            self.engine.module, vision=self.processor is not None
        )
        if D.is_main():
            print(pack_line, flush=True)
        self.ref_fn: RefFn | None = None
        if cfg.beta:
            self.ref_fn = (
                endpoint_reference_fn(
                    job.endpoints.reference,
                    temperature=cfg.temperature,
                    vocab_size=getattr(self.engine.module.config, "vocab_size", None),
                )
                if job.endpoints.reference
                else local_reference_fn(self.engine, frozen, cfg.temperature)
            )
        self.store = CheckpointStore(job, self.reporter)
        self.iteration = 0
        self.history: list[dict[str, Any]] = []
        self.synced_at = 0  # the policy servers hold the weights of this iteration
        self.last_eval: float | None = None
        self.run_tag = run_tag(job.job.name, job.job.uid)
        self.traces = traces.JobTraces(job, self.store.client) if D.is_main() else None
        self.pipeline: RolloutPipeline | None = None  # rank 0, async_depth > 0: the background sampler
        self.clocks: utilisation.ServerClocks | None = None  # rank 0: the rollout servers' busy seconds

    @property
    def total(self) -> int:
        return self.cfg.iterations

    def _vision_processor(self, job: JobFile) -> Any:
        """A vision-language policy's processor (the images of its rollouts become pixel values), else None."""
        from posttrain_trainer.modeling import is_vision_model, load_processor

        if not is_vision_model(D.unwrap(self.engine.module).config):
            return None
        if self.cfg.beta and job.endpoints.reference:
            raise RLConfigError(
                "a vision policy with beta > 0 needs a local reference: the reference rollout server scores "
                'token ids alone, without the images (set reference.placement = "shared", or beta = 0)'
            )
        return load_processor(job.model_path, storage=job.storage)

    @property
    def saved_tokenizer(self) -> Any:
        """What is saved beside the weights: a vision policy's processor (tokenizer + image processor)."""
        return self.processor if self.processor is not None else self.tokenizer

    def run(self) -> dict[str, Any]:
        done = self.store.completed_result()
        if done is not None:
            return done
        self.resume()
        self.connect()
        if self.iteration > 0:  # resumed: the rollout servers restarted from the base weights, or hold newer
            self.sync(self.iteration)
        first_eval = self.evaluate(self.iteration) if (self.cfg.eval_every and self.iteration == 0) else None
        self.last_eval = first_eval
        try:
            while self.iteration < self.total:
                self.step()
        except BaseException:
            # a failed or stopped job keeps the traces of what it ran (best effort: S3 may be what failed)
            with contextlib.suppress(Exception):
                self.upload_traces(force=True)
            raise
        finally:
            self.close()
        return self.finish(first_eval)

    def close(self) -> None:
        """Ends the background sampler (waits for a batch in flight); idempotent."""
        if self.pipeline is not None:
            pipeline, self.pipeline = self.pipeline, None
            pipeline.close()

    def resume(self) -> None:
        state = self.store.resume(self.engine)
        if state is None:
            return
        self.iteration = int(state["data"].get("iteration", state["step"]))
        self.history = list(state.get("history", []))
        self.store.report_resumed(self.iteration, state)
        self.engine.module.eval()
        self.synced_at = self.iteration

    def connect(self) -> None:
        """The task app client (with the judge, if any), the error budget and rank 0's weight syncer."""
        from posttrain.hardware import torch_dtype

        from posttrain_trainer.modeling import is_peft
        from posttrain_trainer.weightsync import WeightSyncer, sync_format

        job = self.job
        wait_until_serving(job)
        self.judge = self.make_judge() if D.is_main() else None  # rank 0 collects and scores rollouts
        self.rollouts = RolloutClient(
            task_url=job.task_app.url,
            settings=self.cfg.rollout,
            model=job.base_model,
            api_key_env=job.task_app.api_key_env,
            weights=self.cfg.judge.blend(),
            judge=self.judge,
        )
        self.budget = ErrorBudget.from_settings(self.cfg.rollout)
        self.syncer = (
            WeightSyncer(job, client=self.store.client, dtype=torch_dtype(self.precision.sync))
            if D.is_main()
            else None
        )
        self.sync_format = sync_format(self.cfg.weight_sync_format, is_peft(self.engine.module))
        if D.is_main():
            self.clocks = utilisation.ServerClocks(job.endpoints.policy)
            if self.cfg.async_depth > 0:
                self.pipeline = RolloutPipeline(self.sample_batch)

    def make_judge(self) -> EpisodeJudge | None:
        """The judge the job's settings call (None: no judge is called), with each judged score's rubric:
        its rubric_overrides, else the task app's /task_info rubric (task_rubric.py); the rubric used goes
        to the trace store now and to the manifest at the end."""
        settings, job = self.cfg.judge, self.job
        if not settings.enabled:
            return None
        rubrics = judge_rubrics(
            settings,
            task_url=job.task_app.url if job.task_app else None,
            headers=api_headers(os.environ.get(job.task_app.api_key_env)) if job.task_app else {},
            seed=self.cfg.seed_start,
        )
        judge = EpisodeJudge.from_settings(settings, job.endpoints.judges, rubrics=rubrics)
        assert judge is not None
        print(f"[posttrain] {judge.describe()}", flush=True)
        if rubrics.note:
            print(f"[posttrain] judge rubric: {rubrics.note}; it scores with its generic prompt", flush=True)
        if self.traces is not None:
            self.traces.metadata["judge_rubric"] = rubrics.record()
        return judge

    def step(self) -> None:
        """One iteration."""
        started = time.perf_counter()
        seqs, stats = self.collect(started)
        update = gspo_update(
            self.engine,
            seqs,
            self.cfg,
            self.pad_id,
            iteration=self.iteration,
            ref_fn=self.ref_fn,
            processor=self.processor,
            pack=self.pack,
        )
        self.iteration += 1
        sync_metrics: dict[str, Any] = {}
        if self.iteration % max(1, self.cfg.weight_sync_interval) == 0 and self.iteration < self.total:
            sync_metrics = self.sync(self.iteration)
        eval_score = None
        if self.cfg.eval_every and self.iteration % self.cfg.eval_every == 0 and self.iteration < self.total:
            eval_score = self.last_eval = self.evaluate(self.iteration)
        elapsed = time.perf_counter() - started
        record = iteration_record(
            self.iteration, self.total, update, stats, self.engine.current_lr(), elapsed
        )
        record.update(sync_metrics)
        record["trainer_idle_share"] = utilisation.idle_share(
            utilisation.trainer_busy_seconds(update, sync_metrics), elapsed
        )
        record["rollout_idle_share"] = self.clocks.idle_share() if self.clocks is not None else None
        self.history.append(record)
        self.reporter.record(record, self.history)
        self.reporter.event(
            "iteration", **{k: record.get(k) for k in ITERATION_EVENT_FIELDS}, groups=stats["groups"]
        )
        saved = self.checkpoint()
        self.upload_traces(force=saved)  # beside a checkpoint: a resumed trainer continues that store
        self.reporter.progress(
            step=self.iteration,
            total=self.total,
            loss=update["loss"],
            mean_return=stats["mean_return"],
            judge_scores=stats["judge_scores"] or None,
            judge_failed=stats.get("judge_failed"),
            truncated=stats["truncated"],
            tokens_per_second=update.get("tokens_per_second"),
            sampler_mismatch=update.get("sampler_mismatch"),
            sampler_kl=update.get("sampler_kl"),
            sampler_max_abs_delta=update.get("sampler_max_abs_delta"),
            eval_score=eval_score if eval_score is not None else self.last_eval,
            last_checkpoint=self.store.last_uri,
        )
        preemption.stop_if_asked(self.store, self.iteration, lambda: self.checkpoint(force=True))

    def collect(self, started: float) -> tuple[list[TrainSeq], dict[str, Any]]:
        """This iteration's training sequences and rollout statistics, collected and scored on rank 0 and
        given to every rank (collective). Raises RolloutBudgetExceeded on every rank."""
        payload: Any = None
        if D.is_main():
            batch, waited = self.take_batch()
            results, dropped = batch.results, 0
            if self.cfg.async_depth > 0:
                results, dropped = offpolicy.fresh_rollouts(
                    results, self.iteration, self.cfg.async_depth, call_versions
                )
            self.trace(batch.sampled, "train", self.iteration)
            try:
                payload = self.score(results, started, batch.sampled)
                payload["stats"].update(batch.stats)
                payload["stats"].update(rollout_seconds=batch.seconds, rollout_wait_seconds=waited,
                                        stale_dropped=dropped)  # fmt: skip
            except RolloutBudgetExceeded as err:
                payload = {"error": str(err)}
        payload = D.broadcast_object(payload)
        if "error" in payload:
            raise RolloutBudgetExceeded(payload["error"])
        return payload["seqs"], payload["stats"]

    def take_batch(self) -> tuple[SampledBatch, float]:
        """Rank 0: this iteration's batch and the seconds waited for it: sampled now (async_depth 0), or
        taken from the background sampler after requesting the batches up to async_depth iterations ahead."""
        if self.pipeline is None:
            batch = self.sample_batch(self.iteration, self.loop)
            return batch, batch.seconds
        self.pipeline.ensure(requested_window(self.iteration, self.cfg.async_depth, self.total))
        return self.pipeline.take(self.iteration)

    def sample_batch(self, iteration: int, loop: RolloutLoop) -> SampledBatch:
        """Iteration `iteration`'s rollouts, sampled on `loop` (with dynamic sampling, its rounds)."""
        cfg = self.cfg
        started = time.perf_counter()
        sampling: dict[str, Any] = {}
        if cfg.dynamic_sampling:
            results, sampled, sampling = sample_with_signal(
                lambda k, groups: self.sample_round(k, iteration, loop, groups),
                cfg.batch_size,
                cfg.max_sampling_rounds,
            )
        else:
            results = sampled = self.sample_round(0, iteration, loop)
        return SampledBatch(iteration, results, sampled, sampling, time.perf_counter() - started)

    def sample_round(
        self, k: int, iteration: int | None = None, loop: RolloutLoop | None = None, groups: int | None = None
    ) -> list[RolloutResult]:
        """One batch of groups (the first `groups` of it, default all): round 0 the iteration's own seeds; a
        further round of dynamic sampling seeds past every iteration's (seed_start + (total + iteration x
        rounds + k - 1) x batch_size + j), so a resumed run samples the same prompts."""
        cfg = self.cfg
        iteration = self.iteration if iteration is None else iteration
        at = iteration if k == 0 else self.total + iteration * cfg.max_sampling_rounds + k - 1
        seeds = iteration_seeds(at, cfg.batch_size, cfg.seed_start)[:groups]
        # the policy servers' replicas, resolved again for every round: each rollout's calls and its capture
        # name one replica (replicas.py)
        policy = replicas.expand(self.job.endpoints.policy)
        if self.syncer is not None:  # a replica that replaced a pod gets the current weights first
            self.syncer.bring_up_to_date(policy)
        specs = plan_rollouts(self.run_tag, at, seeds, cfg.group_size, policy)
        return (loop or self.loop).collect(self.rollouts, specs)

    def score(
        self, results: list[RolloutResult], started: float, sampled: list[RolloutResult] | None = None
    ) -> dict[str, Any]:
        """Rollouts -> {"seqs", "stats"}: the error budget (over every rollout `sampled`, by default
        `results`), group advantages, returns and judge scores."""
        cfg = self.cfg
        sampled = results if sampled is None else sampled
        errors = [r.error for r in sampled if not r.ok]
        self.budget.check(len(sampled), errors)
        seqs, stats = sequences_from_results(
            results,
            skip_zero_advantage=cfg.skip_zero_advantage and not cfg.beta,
            overlong=cfg.overlong,
            overlong_penalty=cfg.overlong_penalty,
            max_tokens=cfg.max_response_tokens,
            overlong_ramp=cfg.overlong_ramp,
        )
        if self.processor is not None:
            seqs, stats["media_tokens_sampled"] = rl_vision.drop_sampled_media_tokens(
                seqs, rl_vision.media_token_ids(self.processor)
            )
            stats["train_sequences"] = len(seqs)
        ok = [r for r in results if r.ok]
        # the policy's returns over every rollout sampled: dynamic sampling keeps only groups with mixed
        # rewards, whose mean says nothing of the policy (early it drops the all-wrong groups, late the all-right)
        policy = [r for r in sampled if r.ok]
        outcome = [r.outcome_score for r in policy if r.outcome_score is not None]
        events = [r.events_score for r in policy if r.events_score is not None]
        stats.update(
            mean_return=mean([r.reward for r in policy]),
            return_std=std([r.reward for r in policy]),
            mean_env_return=mean([r.env_return for r in policy]),
            judge_scores={
                k: v for k, v in (("outcome", mean(outcome)), ("events", mean(events))) if v is not None
            },
            sampled_tokens=sum(sum(s.completion_mask) for r in policy for s in r.sequences),
            rollout_seconds=time.perf_counter() - started,
            errors=sorted(set(errors))[:3],
            **offpolicy.staleness(
                [s.weight_versions for r in ok for s in r.sequences],
                self.synced_at,
                self.iteration,
                self.cfg.async_depth,
            ),
            **offpolicy.lag_stats([call_versions(r) for r in ok], self.iteration),
        )
        if self.judge is not None:
            stats["judged"] = len(ok)
        else:
            stats.pop("judge_failed")
        return {"seqs": seqs, "stats": stats}

    def trace(self, results: list[RolloutResult], kind: str, iteration: int) -> None:
        """Rank 0: the rollouts into the job's trace store (traces.JobTraces)."""
        if self.traces is not None:
            self.traces.add(results, kind=kind, iteration=iteration)

    def upload_traces(self, force: bool = False) -> None:
        """Rank 0: the trace store to the job's S3 folder, during the run (a job with storage): at a
        checkpoint (force), else at most every traces.UPLOAD_INTERVAL_S; the final model's upload has it all."""
        if self.traces is not None:
            self.traces.upload(force=force)

    def sync(self, version: int) -> dict[str, Any]:
        """Push the weights to the rollout servers (collective); returns rank 0's sync metrics."""
        out: dict[str, Any] = {}
        with D.full_weights(self.engine) as state:  # sharded engines: gathered while rank 0 writes
            if D.is_main():
                result = self.syncer.sync(
                    self.engine.module, self.saved_tokenizer, version, self.sync_format, state
                )
                out = result.as_metrics()
                self.reporter.event(
                    "weight_sync", **out, path=result.path, format=self.sync_format, pruned=result.pruned
                )
        D.barrier()
        self.synced_at = version
        return out

    def evaluate(self, at: int) -> float | None:
        """Mean reward on evaluation.seeds with the weights of iteration `at` (collective)."""
        cfg = self.cfg
        if not cfg.eval_seeds:
            return None
        if self.synced_at != at:
            self.sync(at)
        score = None
        if D.is_main():
            seeds = list(cfg.eval_seeds)
            if cfg.eval_temperature > 0 and (cfg.eval_instances or 0) > len(seeds):
                seeds = [seeds[i % len(seeds)] for i in range(cfg.eval_instances)]
            policy = replicas.expand(self.job.endpoints.policy)
            if self.syncer is not None:
                self.syncer.bring_up_to_date(policy)
            specs = plan_rollouts(self.run_tag, at, seeds, 1, policy, kind="ev")
            if len(set(seeds)) < len(seeds):  # repeated seeds (sampled eval): keep the cids unique
                for n, spec in enumerate(specs):
                    spec.cid = f"{spec.cid}-{n}"
            line = run_evaluation(
                self.loop,
                self.rollouts,
                specs,
                at,
                cfg.eval_temperature,
                on_results=lambda results: self.trace(results, "eval", at),
            )
            self.upload_traces()
            score = line["eval_score"]
            self.history.append(line)
            self.reporter.record(line, self.history)
            self.reporter.event("evaluation", **line)
        return D.broadcast_object(score)

    def checkpoint(self, force: bool = False) -> bool:
        """Saves a checkpoint when one is due (or forced); whether it did."""
        if not (force or self.store.due(self.iteration, self.total)):
            return False
        self.store.save(
            self.engine,
            self.iteration,
            data_state={"iteration": self.iteration},
            extra={"history": self.history, "weight_version": self.synced_at},
        )
        return True

    def finish(self, first_eval: float | None) -> dict[str, Any]:
        """Final evaluation, metrics, and on rank 0 the final model, curve and result (collective)."""
        from posttrain_trainer.artifacts import finalize

        final_eval = self.evaluate(self.iteration) if self.cfg.eval_seeds else None
        returns = [
            h["mean_return"]
            for h in self.history
            if h.get("mean_return") is not None and "eval_score" not in h
        ]
        metrics = {
            "iterations": self.iteration,
            "total_iterations": self.total,
            "first_mean_return": returns[0] if returns else None,
            "final_mean_return": returns[-1] if returns else None,
            "first_eval_score": first_eval,
            "final_eval_score": final_eval,
            "world_size": D.world_size(),
            "engine": self.engine.kind,
            "trainer_mode": self.cfg.trainer_mode,
            "group_size": self.cfg.group_size,
            "batch_size": self.cfg.batch_size,
            # the rubric each judged score was scored against and its source (overrides | task_info | none)
            **({"judge_rubric": self.judge.rubrics.record()} if self.judge is not None else {}),
        }
        saved = None
        with D.full_weights(self.engine) as state:  # sharded engines: gathered while rank 0 saves
            if D.is_main():
                job = self.job
                curve = plot_curves(
                    self.history, self.workdir / "reward_curve.png", title=f"GSPO: {job.job.name}"
                )
                saved = finalize(
                    job,
                    self.engine.module,
                    self.saved_tokenizer,
                    metrics=metrics,
                    steps=self.iteration,
                    metrics_lines=self.history,
                    extra_files={
                        **({"reward_curve": curve} if curve else {}),
                        **({"traces": self.traces.path} if self.traces and self.traces.store else {}),
                    },
                    client=self.store.client,
                    state=state,
                )
        if D.is_main():
            final = self.reporter.final(
                *saved,
                step=self.iteration,
                total=self.total,
                mean_return=metrics["final_mean_return"],
                eval_score=final_eval,
                last_checkpoint=self.store.last_uri,
            )
            metrics.update(final)
        D.barrier()
        return metrics


def train(job: JobFile) -> dict[str, Any]:
    # one event loop for every rollout of the job (rollouts.RolloutLoop: the judge client outlives iterations)
    with RolloutLoop() as loop:
        return RLRun(job, loop).run()


def main(job: JobFile) -> int:
    try:
        train(job)
    except (RLConfigError, RolloutBudgetExceeded, rl_vision.VisionInputError) as err:
        if D.is_main():
            print(f"error: {err}", flush=True)
        D.shutdown()
        # images the policy cannot take (a text-only model) or cannot be rebuilt: retrying changes nothing
        return EXIT_RETRYABLE if isinstance(err, RolloutBudgetExceeded) else EXIT_CONFIG_ERROR
    D.shutdown()
    return 0
