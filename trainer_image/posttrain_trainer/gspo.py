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
- GSPO-token (variant "token"): the paper's token-level form, s_i,t = sg[s_i] pi(y_t) / sg[pi(y_t)]; see gspo_terms.
- DAPO (variant "dapo", Yu et al. 2025, arXiv:2503.14476): PPO's per-token ratio r_t = pi(y_t) / pi_old(y_t),
  clipped to [1 - eps_low, 1 + eps_high] with eps_high > eps_low (clip-higher), and a token-level loss:
  J = sum over every policy token t of the mini-batch of min(r_t A, clip(r_t) A) / (its token count), so that
  a long response weighs by its tokens, not as one sequence. overlong_shaping: DAPO's soft overlong
  punishment of a response near max_tokens.
- truncated_importance_weights / sampler_mismatch: the sampler's (vLLM's) logprobs as the behaviour policy,
  with truncated importance sampling, and the trainer/sampler mismatch as a metric.
- split_minibatches: the rollout batch split into mini-batches (default 4), one optimizer step each.
- token_logprobs: per-token log-probabilities of given target tokens under a causal LM (prompt+completion ids),
  in bounded memory (logprobs.py).

N, the normaliser of the mean over sequences, defaults to the batch size; a caller that splits one mini-batch
over ranks / micro-batches passes the mini-batch's total so the pieces add up to the same loss."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import torch
from posttrain.api.settings import DEFAULT_TIS_CAP, EPS_HIGH, EPS_LOW, GspoVariant

from posttrain_trainer.logprobs import token_logprobs  # noqa: F401 - part of this module's API
from posttrain_trainer.prefix_packing import PackedBatch

ADV_EPS = 1e-6
GSPO_VARIANTS: tuple[str, ...] = get_args(GspoVariant)
LOSS_VARIANTS = (*GSPO_VARIANTS, "dapo")  # "dapo": posttrain.api.settings.DAPOSettings, not a TOML spelling


def overlong_shaping(length: int, max_tokens: int, ramp: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (its eq. 13, scaled by `penalty` <= 0): 0 up to max_tokens - ramp
    tokens, then linear down to `penalty` at max_tokens (a response cut there), `penalty` beyond."""
    start = max_tokens - ramp
    if length <= start:
        return 0.0
    return penalty * min(1.0, (length - start) / max(ramp, 1))


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
    variant: str = "sequence",
    behavior_logprobs: torch.Tensor | None = None,
    tis_cap: float = DEFAULT_TIS_CAP,
    num_tokens: int | float | None = None,
) -> GSPOTerms:
    """The GSPO loss and its diagnostics. Shapes: logprobs/old_logprobs/mask/ref_logprobs/behavior_logprobs
    [B, T], advantages [B], or [B, T] per token (per-decision credit of a multi-turn episode; only with
    variant "token": sequence-level GSPO has one advantage per sequence).

    variant "sequence" is GSPO; "token" is GSPO-token (the paper's section 4.3): per-token ratios
    s_i,t = sg[s_i] * pi(y_t) / sg[pi(y_t)], clipped like s_i and averaged over the sequence's tokens. Its
    value equals GSPO's and so does its gradient while the advantage is one per sequence; it differs once
    tokens carry their own weights (token-level truncated importance weights below, or per-token
    advantages).

    behavior_logprobs: the sampler's logprobs of the same tokens (the behaviour policy). old_logprobs stay the
    anchor of the clip; the gap between the two is corrected by truncated importance sampling (TIS,
    truncated_importance_weights), per sequence for "sequence" and per token for "token".

    variant "dapo" is DAPO's token-level loss (module docstring); its normaliser is num_tokens, the policy
    tokens of the whole mini-batch (default: this batch's), as num_sequences is the others'."""
    if variant not in LOSS_VARIANTS:
        raise ValueError(f"gspo variant {variant!r}: use one of {', '.join(LOSS_VARIANTS)}")
    if variant == "dapo":
        return _dapo_terms(logprobs, old_logprobs, advantages, mask, eps_low, eps_high, ref_logprobs=ref_logprobs,
                           beta=beta, behavior_logprobs=behavior_logprobs, tis_cap=tis_cap,
                           num_tokens=num_tokens)  # fmt: skip
    mask = mask.to(logprobs.dtype)
    old = old_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    per_token_adv = adv.dim() == 2
    if per_token_adv and variant != "token":
        raise ValueError("per-token advantages need the GSPO-token variant")
    token_adv = adv if per_token_adv else adv.unsqueeze(-1)
    if per_token_adv:  # the sequence's mean advantage: its clip diagnostics
        adv = masked_sequence_mean(adv, mask)
    log_ratio = masked_sequence_mean(logprobs - old, mask)
    ratio = torch.exp(log_ratio)
    weights = None
    if behavior_logprobs is not None:
        weights = truncated_importance_weights(
            old, behavior_logprobs, mask, tis_cap, per_token=variant == "token"
        )
    if variant == "sequence":
        unclipped = ratio * adv
        clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
        per_seq = torch.minimum(unclipped, clipped)
        if weights is not None:
            per_seq = per_seq * weights
    else:
        token_ratio = torch.exp(log_ratio.detach().unsqueeze(-1) + logprobs - logprobs.detach())
        token_min = torch.minimum(
            token_ratio * token_adv, torch.clamp(token_ratio, 1.0 - eps_low, 1.0 + eps_high) * token_adv
        )
        if weights is not None:
            token_min = token_min * weights
        per_seq = masked_sequence_mean(token_min, mask)
        # every token of a sequence has the same ratio value, so the clip decision is the sequence's
        unclipped = ratio * adv
        clipped = torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
    n = float(num_sequences) if num_sequences is not None else float(logprobs.shape[0])
    n = max(n, 1.0)
    loss = -per_seq.sum() / n
    kl_seq = None
    if beta and ref_logprobs is not None:
        delta = ref_logprobs.detach().to(logprobs.dtype) - logprobs
        k3 = torch.exp(delta) - delta - 1.0
        kl_seq = masked_sequence_mean(k3, mask)
        loss = loss + beta * kl_seq.sum() / n
    was_clipped = (clipped.detach() < unclipped.detach()) & (adv != 0)
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


def _dapo_terms(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    *,
    ref_logprobs: torch.Tensor | None,
    beta: float,
    behavior_logprobs: torch.Tensor | None,
    tis_cap: float,
    num_tokens: int | float | None,
) -> GSPOTerms:
    """DAPO's token-level clipped objective (see gspo_terms); per-sequence diagnostics: the geometric-mean
    ratio and the share of the sequence's tokens whose clipped branch was the min."""
    mask = mask.to(logprobs.dtype)
    old = old_logprobs.detach().to(logprobs.dtype)
    adv = advantages.detach().to(logprobs.dtype)
    token_adv = adv if adv.dim() == 2 else adv.unsqueeze(-1)
    token_ratio = torch.exp(logprobs - old)
    unclipped = token_ratio * token_adv
    clipped = torch.clamp(token_ratio, 1.0 - eps_low, 1.0 + eps_high) * token_adv
    token_min = torch.minimum(unclipped, clipped)
    if behavior_logprobs is not None:
        token_min = token_min * truncated_importance_weights(
            old, behavior_logprobs, mask, tis_cap, per_token=True
        )
    n = max(float(num_tokens) if num_tokens is not None else float(mask.sum()), 1.0)
    loss = -(token_min * mask).sum() / n
    kl_seq = None
    if beta and ref_logprobs is not None:
        delta = ref_logprobs.detach().to(logprobs.dtype) - logprobs
        k3 = torch.exp(delta) - delta - 1.0
        loss = loss + beta * (k3 * mask).sum() / n
        kl_seq = masked_sequence_mean(k3, mask).detach()
    was_clipped = ((clipped.detach() < unclipped.detach()) & (token_adv != 0)).to(mask.dtype)
    clipped_share = masked_sequence_mean(was_clipped, mask)
    ratio = torch.exp(masked_sequence_mean(logprobs.detach() - old, mask))
    stats = {
        "ratio_mean": float(ratio.mean()) if ratio.numel() else 1.0,
        "clip_fraction": float(clipped_share.mean()) if ratio.numel() else 0.0,
    }
    if kl_seq is not None:
        stats["kl"] = float(kl_seq.mean())
    return GSPOTerms(loss=loss, ratio=ratio, clipped=clipped_share, kl=kl_seq, stats=stats)


def truncated_importance_weights(
    old_logprobs: torch.Tensor,
    behavior_logprobs: torch.Tensor,
    mask: torch.Tensor,
    cap: float = DEFAULT_TIS_CAP,
    *,
    per_token: bool = False,
) -> torch.Tensor:
    """Truncated importance sampling (TIS) weights from the sampler's (behaviour) policy to the trainer's:
    min(pi_trainer(y) / pi_sampler(y), cap), detached. Following Yao, Liu et al. 2025, "Your Efficient RL
    Framework Secretly Brings You Off-Policy RL Training" (blog post, August 2025): the inference
    engine samples from a slightly different distribution than the trainer computes (other kernels, other
    precision, stale weights), and the policy gradient is reweighted by this capped ratio.

    per_token: [B, T] weights per token (zero-masked positions get 1); else [B], one weight per sequence from
    the length-normalised (geometric mean) ratio, the same normalisation as GSPO's sequence ratio."""
    delta = (old_logprobs.detach() - behavior_logprobs.detach().to(old_logprobs.dtype)) * mask.to(
        old_logprobs.dtype
    )
    if per_token:
        return torch.clamp(torch.exp(delta), max=float(cap))
    return torch.clamp(torch.exp(masked_sequence_mean(delta, mask)), max=float(cap))


def sampler_mismatch(
    trainer_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> tuple[float, float, float]:
    """(sum of |trainer - sampler| logprob, sum of the k3 estimate of KL(sampler || trainer), tokens) over the
    masked tokens: sums, so that micro-batches and ranks add up; divide both by the token count.

    The tokens were drawn from the sampler, so with r = pi_trainer / pi_sampler the per-token
    k3 = r - 1 - log r is an unbiased, non-negative estimate of KL(sampler || trainer) (Schulman 2020)."""
    mask = mask.to(torch.float32)
    delta = (trainer_logprobs.detach().float() - sampler_logprobs.detach().float()) * mask
    k3 = (torch.exp(delta) - 1.0 - delta) * mask
    return float(delta.abs().sum()), float(k3.sum()), float(mask.sum())


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
    variant: str = "sequence",
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
        variant=variant,
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
    # extra model inputs of the batch (a vision policy's pixel_values, image_grid_thw, mm_token_type_ids)
    model_inputs: dict[str, Any] = field(default_factory=dict)
    # the rows packed by shared prefix (prefix_packing.plan), None: the model runs on the plain rows
    packed: PackedBatch | None = None

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
