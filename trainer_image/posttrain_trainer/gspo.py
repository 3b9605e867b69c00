"""GSPO (Zheng et al. 2025, arXiv:2507.18071 "Group Sequence Policy Optimization") as pure functions.

- group_advantages: A_i = (r_i - mean_group(r)) / (std_group(r) + eps), with the POPULATION standard deviation
  (divide by G, not G - 1) over the group_size rollouts that share a seed, eps = 1e-6. A group whose rewards
  are all equal gets advantage 0 for every member (it carries no signal).
- gspo_loss: the negated GSPO objective. Sequence-level, length-normalised importance ratio over the policy
  tokens of each sequence: s_i = exp(mean_{t in mask_i}(log pi_theta - log pi_old)); objective
  J = (1/N) sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i), defaults eps_low = 3e-4,
  eps_high = 4e-4 (the paper's). Optional KL to a reference model with the k3 estimator per token,
  k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1, averaged over the sequence's masked tokens and over
  sequences, weighted by beta (default 0). loss = -J + beta * KL.
- split_minibatches: the rollout batch split into mini-batches (default 4), one optimizer step each.
- token_logprobs: per-token log-probabilities of given target tokens under a causal LM (prompt+completion ids).

N, the normaliser of the mean over sequences, defaults to the batch size; a caller that splits one mini-batch
over ranks / micro-batches passes the mini-batch's total so the pieces add up to the same loss."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

ADV_EPS = 1e-6
EPS_LOW = 3e-4
EPS_HIGH = 4e-4


def group_advantages(
    rewards: Sequence[float] | torch.Tensor, group_size: int, eps: float = ADV_EPS
) -> torch.Tensor:
    """rewards laid out group after group ([g0r0, g0r1, ..., g1r0, ...]) -> advantages, same shape (float32).

    Population std (unbiased=False) per group, plus eps in the denominator."""
    r = torch.as_tensor(rewards, dtype=torch.float64).flatten()
    if group_size < 1 or r.numel() % group_size != 0:
        raise ValueError(f"{r.numel()} rewards do not split into groups of {group_size}")
    groups = r.view(-1, group_size)
    mean = groups.mean(dim=1, keepdim=True)
    std = groups.std(dim=1, unbiased=False, keepdim=True)
    return ((groups - mean) / (std + eps)).flatten().to(torch.float32)


def ragged_group_advantages(
    rewards: Sequence[float], groups: Sequence[Any], eps: float = ADV_EPS
) -> list[float]:
    """Same formula where groups may have different sizes (a failed rollout leaves its group short):
    groups[i] names rollout i's group. A group of one gets advantage 0."""
    members: dict[Any, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        if len(idx) < 2:
            continue
        adv = group_advantages([rewards[i] for i in idx], len(idx), eps)
        for i, a in zip(idx, adv.tolist(), strict=True):
            out[i] = a
    return out


def masked_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row mean of values over mask (a row without tokens gives 0)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1.0)


@dataclass
class GSPOTerms:
    loss: torch.Tensor  # scalar to minimise
    ratio: torch.Tensor  # [batch] s_i (detached)
    clipped: torch.Tensor  # [batch] bool: the clipped branch was the min (no gradient from this sequence)
    kl: torch.Tensor | None = None  # [batch] k3 per sequence (detached)
    stats: dict[str, float] = field(default_factory=dict)


def gspo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    *,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    num_sequences: int | float | None = None,
) -> GSPOTerms:
    """The GSPO loss and its diagnostics. Shapes: logprobs/old_logprobs/mask/ref_logprobs [B, T], advantages [B]."""
    mask = mask.to(logprobs.dtype)
    old = old_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    log_ratio = masked_sequence_mean(logprobs - old, mask)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clipped = clipped_ratio * adv
    per_seq = torch.minimum(unclipped, clipped)
    n = float(num_sequences) if num_sequences is not None else float(logprobs.shape[0])
    n = max(n, 1.0)
    loss = -per_seq.sum() / n
    kl_seq = None
    if beta and ref_logprobs is not None:
        delta = ref_logprobs.detach().to(logprobs.dtype) - logprobs
        k3 = torch.exp(delta) - delta - 1.0
        kl_seq = masked_sequence_mean(k3, mask)
        loss = loss + beta * kl_seq.sum() / n
    was_clipped = (clipped < unclipped) & (adv != 0)
    stats = {
        "ratio_mean": float(ratio.detach().mean()) if ratio.numel() else 1.0,
        "clip_fraction": float(was_clipped.float().mean()) if ratio.numel() else 0.0,
    }
    if kl_seq is not None:
        stats["kl"] = float(kl_seq.detach().mean())
    return GSPOTerms(
        loss=loss,
        ratio=ratio.detach(),
        clipped=was_clipped,
        kl=None if kl_seq is None else kl_seq.detach(),
        stats=stats,
    )


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float = EPS_LOW,
    eps_high: float = EPS_HIGH,
    *,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    num_sequences: int | float | None = None,
) -> torch.Tensor:
    """The negated GSPO objective (scalar). See the module docstring for the formula."""
    return gspo_terms(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        eps_low,
        eps_high,
        ref_logprobs=ref_logprobs,
        beta=beta,
        num_sequences=num_sequences,
    ).loss


def split_minibatches(items: Sequence[Any], num_minibatches: int = 4) -> list[list[Any]]:
    """Split into num_minibatches contiguous, near-equal, non-empty parts (fewer when there are fewer items)."""
    items = list(items)
    k = max(1, min(int(num_minibatches or 1), len(items)))
    if not items:
        return []
    base, extra = divmod(len(items), k)
    out, start = [], 0
    for i in range(k):
        size = base + (1 if i < extra else 0)
        out.append(items[start : start + size])
        start += size
    return out


# -- sequences -> tensors -> per-token logprobs ---------------------------------------------------------


@dataclass
class TokenBatch:
    """Right-padded prompt+completion ids. target positions: logits at t predict input_ids[t + 1]; tensors
    over targets have T - 1 columns. loss_mask marks the policy's own (sampled) tokens among the targets."""

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    loss_mask: torch.Tensor  # [B, T - 1]
    completion_start: list[int]  # prompt length per row

    @property
    def targets(self) -> torch.Tensor:
        return self.input_ids[:, 1:]

    @property
    def first_target(self) -> int:
        """The first target column any row trains on (the shortest prompt's first completion token)."""
        return max(0, min(self.completion_start) - 1)

    def completion_values(self, per_token: Sequence[Sequence[float]]) -> torch.Tensor:
        """Values given per completion token (e.g. sampling or reference logprobs) -> [B, T - 1] aligned with
        the targets (zeros elsewhere)."""
        out = torch.zeros(self.loss_mask.shape, dtype=torch.float32)
        for row, (start, values) in enumerate(zip(self.completion_start, per_token, strict=True)):
            values = list(values)
            if values:
                out[row, start - 1 : start - 1 + len(values)] = torch.tensor(values, dtype=torch.float32)
        return out


def collate_sequences(
    prompts: Sequence[Sequence[int]],
    completions: Sequence[Sequence[int]],
    completion_masks: Sequence[Sequence[int]] | None,
    pad_id: int,
) -> TokenBatch:
    """Build a TokenBatch. completion_masks[i][j] = 1 when completion token j was sampled by the policy
    (0 for tool/env tokens inside a multi-turn episode); None = every completion token is the policy's."""
    rows = len(prompts)
    if rows == 0:
        raise ValueError("no sequences")
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(lengths)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, max(width - 1, 1)), dtype=torch.float32)
    starts = []
    for i, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        if not p:
            raise ValueError("a sequence needs at least one prompt token")
        ids = list(p) + list(c)
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[i, : len(ids)] = 1
        cm = [1] * len(c) if completion_masks is None else list(completion_masks[i])
        if len(cm) != len(c):
            raise ValueError(f"row {i}: completion mask has {len(cm)} entries for {len(c)} tokens")
        if c:
            loss_mask[i, len(p) - 1 : len(p) - 1 + len(c)] = torch.tensor(cm, dtype=torch.float32)
        starts.append(len(p))
    return TokenBatch(input_ids, attention, loss_mask, starts)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    autocast: contextlib.AbstractContextManager | None = None,
    first_target: int = 0,
) -> torch.Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for every t: [B, T - 1], float32.

    Logits are divided by the sampling temperature (the distribution the tokens were drawn from). Computed as
    gathered logit - logsumexp, in float32, without materialising a full log-softmax copy. Targets before
    column `first_target` (prompt tokens nobody trains on, TokenBatch.first_target) read 0: their logits
    are never computed (the model's `logits_to_keep`), which saves the vocabulary projection and its
    log-softmax on every prompt position."""
    width = input_ids.shape[1]
    first_target = max(0, min(int(first_target), width - 1))
    kwargs: dict[str, Any] = {"logits_to_keep": width - first_target} if first_target else {}
    with autocast or contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    logits = out.logits[:, -(width - first_target) :, :][:, :-1, :].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, first_target + 1 :].unsqueeze(-1)
    picked = torch.gather(logits, -1, targets).squeeze(-1)
    values = picked - torch.logsumexp(logits, dim=-1)
    if not first_target:
        return values
    full = values.new_zeros((input_ids.shape[0], width - 1))
    full[:, first_target:] = values
    return full
