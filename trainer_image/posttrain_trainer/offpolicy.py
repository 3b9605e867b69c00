"""The sampler as the behaviour policy: vLLM's captured sampling logprobs next to the trainer's, per update.

`[training] old_logprobs`:
  trainer - (default) the GSPO ratio's old policy is the trainer's own recomputation at the pre-update
            weights; the sampler's logprobs are only measured against it.
  sampler - the captured sampling logprobs are the behaviour policy: the clip stays anchored on the
            trainer's pre-update logprobs, and each sequence's (or, for GSPO-token, token's) objective is
            weighted by the truncated importance ratio min(pi_trainer_old / pi_sampler, tis_cap)
            (gspo.truncated_importance_weights; Yao, Liu et al. 2025, "Your Efficient RL Framework Secretly
            Brings You Off-Policy RL Training"). This corrects both the kernel/precision mismatch between
            vLLM and the trainer and the staleness of rollouts sampled with older weights
            (weight_sync_interval > 1).
The mismatch (mean |trainer - sampler| logprob over policy tokens, and the k3 estimate of
KL(sampler || trainer)) is measured in both modes, every iteration, from the pre-update logprobs the update
computes anyway (no extra forward pass).

Staleness: every capture carries the weight_version the rollout server served it with. The trainer knows
which version it last synced; `staleness` compares the two (iterations between the sampling weights and the
trainer's weights at the update). Under [training] async_depth N (pipeline.py) rollouts are sampled up to N
versions behind by design: `fresh_rollouts` drops those further behind (counted), and `lag_stats` gives the
mean and max lag over the policy calls of a batch."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch


def behaviour_logprobs(
    sampling_logprobs: Sequence[Sequence[float]], captured: Sequence[bool], batch: Any, old: torch.Tensor
) -> torch.Tensor:
    """The sampler's logprobs laid out like the targets of `batch` (gspo.TokenBatch), on old's device. A row
    whose logprobs were not captured takes the trainer's old logprobs (importance weight 1)."""
    values = batch.completion_values(
        [list(v) if ok else [] for v, ok in zip(sampling_logprobs, captured, strict=True)]
    ).to(old.device)
    missing = torch.tensor([not ok for ok in captured], dtype=torch.bool, device=old.device)
    return torch.where(missing.unsqueeze(-1), old.detach().to(values.dtype), values)


@dataclass
class MismatchMeter:
    """Sums over an update (micro-batches, then ranks): |delta| and k3 over policy tokens with captured
    logprobs, their token count, and sequences without captured logprobs; max_abs: the largest |delta| of a
    token on this rank (ranks combine it with a max, not a sum)."""

    abs_sum: float = 0.0
    k3_sum: float = 0.0
    tokens: float = 0.0
    missing: float = 0.0
    max_abs: float = 0.0

    def add(
        self,
        trainer: torch.Tensor,
        sampler: torch.Tensor,
        mask: torch.Tensor,
        captured: Sequence[bool],
    ) -> None:
        from posttrain_trainer.gspo import sampler_mismatch

        rows = torch.tensor(list(captured), dtype=mask.dtype, device=mask.device).unsqueeze(-1)
        counted = mask * rows
        abs_sum, k3_sum, tokens = sampler_mismatch(trainer, sampler, counted)
        if tokens:
            delta = (trainer.detach().float() - sampler.detach().float()).abs() * counted.to(torch.float32)
            self.max_abs = max(self.max_abs, float(delta.max()))
        self.abs_sum += abs_sum
        self.k3_sum += k3_sum
        self.tokens += tokens
        self.missing += float(len(captured) - sum(bool(c) for c in captured))

    def as_list(self) -> list[float]:
        return [self.abs_sum, self.k3_sum, self.tokens, self.missing]

    @staticmethod
    def metrics(totals: Sequence[float]) -> dict[str, Any]:
        abs_sum, k3_sum, tokens, missing = totals
        if tokens <= 0:
            return {"sampler_mismatch": None, "sampler_kl": None, "sampler_logprobs_missing": int(missing)}
        return {
            "sampler_mismatch": abs_sum / tokens,
            "sampler_kl": k3_sum / tokens,
            "sampler_logprobs_missing": int(missing),
        }


def _version(value: Any) -> int | None:
    """A captured weight_version as an int (the server reports ints; a header may carry "3"), else None."""
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value


def call_lags(versions: Sequence[Any], iteration: int) -> list[int]:
    """Per policy call with a known version: how many versions it lags the trainer's weights `iteration`."""
    return [iteration - v for v in (_version(x) for x in versions) if v is not None]


def rollout_lag(versions: Sequence[Any], iteration: int) -> int | None:
    """A rollout's lag: that of its oldest call (None: no version known)."""
    lags = call_lags(versions, iteration)
    return max(lags) if lags else None


def fresh_rollouts(
    results: Sequence[Any], iteration: int, depth: int, versions: Callable[[Any], Sequence[Any]]
) -> tuple[list[Any], int]:
    """The rollouts whose oldest call lags at most `depth` versions behind `iteration` (a rollout without a
    known version is kept: nothing says it is stale), and how many were dropped. `versions(r)`: the weight
    versions of r's policy calls."""
    kept, dropped = [], 0
    for r in results:
        lag = rollout_lag(versions(r), iteration)
        if lag is not None and lag > depth:
            dropped += 1
        else:
            kept.append(r)
    return kept, dropped


def lag_stats(weight_versions: Sequence[Sequence[Any]], iteration: int) -> dict[str, Any]:
    """Mean and max lag over every policy call with a known version (None without one)."""
    lags = [lag for versions in weight_versions for lag in call_lags(versions, iteration)]
    return {
        "staleness_mean": sum(lags) / len(lags) if lags else None,
        "staleness_max": max(lags) if lags else None,
    }


def staleness(
    weight_versions: Sequence[Sequence[Any]], synced: int, iteration: int, depth: int = 0
) -> dict[str, Any]:
    """Per batch: how far behind the trainer the sampling weights were, from the captured versions.

    synced: the version the trainer last pushed (what every rollout should have been served with, or under
    async_depth `depth` one of the `depth` versions before it); iteration: the trainer's weights at the
    update. Returns max_staleness (iteration - oldest captured version; None when no version was captured),
    unexpected_versions (captures whose version is none of those: a server that missed a sync, or restarted
    on older weights) and unknown_versions."""
    known, unexpected, unknown = [], 0, 0
    for versions in weight_versions:
        for raw in versions:
            v = _version(raw)
            if v is None:
                unknown += 1
                continue
            known.append(v)
            if not synced - depth <= v <= synced:
                unexpected += 1
    return {
        "max_staleness": (iteration - min(known)) if known else None,
        "unexpected_versions": unexpected,
        "unknown_versions": unknown,
    }
