"""Per-token log-probabilities of given target tokens under a causal LM, in bounded memory.

The vocabulary projection is the largest activation of an LM's training step: fp32 logits for a 152k
vocabulary and 4 x 4k tokens are ~10 GB per copy. So:
- only completion positions are projected (the model's `logits_to_keep` from the first trained target on);
- the projection runs inside the output layer's own call (its forward is swapped for the duration), in chunks
  of rows whose fp32 logits stay under `chunk_bytes` (default 128 MiB), temperature applied per chunk;
- under autograd each chunk is checkpointed: its logits are recomputed in the backward pass instead of being
  kept, so the saved activations are the hidden states (B x T x hidden), not B x T x vocab.
Running the projection inside the output layer's call keeps every wrapper that hooks module calls working
(DDP's forward, DeepSpeed ZeRO-3's parameter gathering, accelerate's device hooks, a LoRA on lm_head).

Models whose causal-LM head post-processes the logits after the output layer (final logit soft-capping,
logit scaling) take the plain path: full logits from the kept positions, then the same chunked log-softmax."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from posttrain_trainer.prefix_packing import PackedBatch, attention_implementation, mask_4d

DEFAULT_CHUNK_BYTES = 128 * 2**20
# config attributes of heads that transform the output layer's logits before returning them
LOGIT_POSTPROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_logits_scale")


def chunk_rows(vocab: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> int:
    """Rows per chunk so that one chunk's fp32 logits (rows x vocab x 4 bytes) fit in chunk_bytes."""
    return max(1, int(chunk_bytes) // (max(1, int(vocab)) * 4))


def _chunk_logprobs(
    project: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    logits = project(hidden).float()
    if temperature != 1.0:
        logits.div_(
            temperature
        )  # in place: no second chunk-sized copy (the projection's output is not saved)
    picked = torch.gather(logits, -1, targets.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def chunked_logprobs(
    project: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    *,
    vocab: int,
    temperature: float = 1.0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> torch.Tensor:
    """log softmax(project(hidden) / temperature)[targets], float32, shape of targets.

    hidden [..., H] (or logits already, with project = identity), targets [...] of the same leading shape.
    Rows are projected chunk by chunk; with gradients on, each chunk is recomputed in backward."""
    shape = targets.shape
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_targets = targets.reshape(-1)
    rows = chunk_rows(vocab, chunk_bytes)
    grad = torch.is_grad_enabled() and flat_hidden.requires_grad
    out = []
    for start in range(0, flat_targets.shape[0], rows):
        h, t = flat_hidden[start : start + rows], flat_targets[start : start + rows]
        if grad:
            out.append(checkpoint(_chunk_logprobs, project, h, t, temperature, use_reentrant=False))
        else:
            out.append(_chunk_logprobs(project, h, t, temperature))
    if not out:
        return flat_hidden.new_zeros(shape, dtype=torch.float32)
    # a copy (B x T floats), not a view: FSDP2 warns about a view returned from a sharded model's forward
    return torch.cat(out).view(shape).clone()


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


def output_layer(model: torch.nn.Module) -> torch.nn.Module | None:
    """The causal LM's output projection (lm_head) when the chunked path can use it, else None."""
    inner = _unwrap(model)
    getter = getattr(inner, "get_output_embeddings", None)
    if getter is None:
        return None
    try:
        head = getter()
    except (AttributeError, NotImplementedError):
        return None
    if not isinstance(head, torch.nn.Module):
        return None
    config = getattr(inner, "config", None)
    text_config = getattr(config, "text_config", None)
    for cfg in (config, text_config):
        if cfg is not None and any(getattr(cfg, key, None) for key in LOGIT_POSTPROCESSING):
            return None
    return head


def _vocab(head: torch.nn.Module, model: torch.nn.Module) -> int:
    for value in (
        getattr(head, "out_features", None),
        getattr(getattr(head, "weight", None), "ds_shape", [None])[0],
        getattr(getattr(_unwrap(model), "config", None), "vocab_size", None),
    ):
        if value:
            return int(value)
    return int(head.weight.shape[0])


def _shifted(hidden: torch.Tensor) -> torch.Tensor:
    return hidden[:, :-1, :]


@contextlib.contextmanager
def projecting_logprobs(
    head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    vocab: int,
    temperature: float,
    chunk_bytes: int,
    select: Callable[[torch.Tensor], torch.Tensor] = _shifted,
) -> Iterator[None]:
    """For the duration, the output layer returns target logprobs [B, K - 1] for hidden states [B, K, H]
    (position k predicts targets[:, k]; the last kept position predicts nothing). select: the hidden states
    that predict `targets`, of their leading shape (packed rows: the positions each target is read from)."""
    had_own = "forward" in head.__dict__
    own = head.__dict__.get("forward")
    project = head.forward  # bound: the class's forward or a wrapper installed on the instance

    def forward(hidden: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return chunked_logprobs(
            lambda h: project(h, *args, **kwargs),
            select(hidden),
            targets,
            vocab=vocab,
            temperature=temperature,
            chunk_bytes=chunk_bytes,
        )

    head.forward = forward
    try:
        yield
    finally:
        if had_own:
            head.forward = own
        else:
            del head.forward


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    autocast: contextlib.AbstractContextManager | None = None,
    first_target: int = 0,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    model_inputs: dict[str, Any] | None = None,
    packed: PackedBatch | None = None,
) -> torch.Tensor:
    """log pi(input_ids[:, t+1] | input_ids[:, :t+1]) for every t: [B, T - 1], float32.

    Logits are divided by the sampling temperature (the distribution the tokens were drawn from). Targets
    before column `first_target` (prompt tokens nobody trains on, TokenBatch.first_target) read 0: their
    logits are never computed. model_inputs go to the model as well (a vision model's pixel values and image
    grids). packed: the same rows packed by shared prefix (posttrain_trainer.prefix_packing): the model runs
    on the packed rows, and only completion targets are computed (the rest read 0). See the module
    docstring for the memory bound."""
    if packed is not None:
        return _packed_token_logprobs(
            model, input_ids.shape, input_ids.device, packed, temperature=float(temperature or 1.0),
            autocast=autocast, chunk_bytes=chunk_bytes,
        )  # fmt: skip
    width = input_ids.shape[1]
    first_target = max(0, min(int(first_target), width - 1))
    keep = width - first_target
    kwargs: dict[str, Any] = {"logits_to_keep": keep} if first_target else {}
    kwargs.update(model_inputs or {})
    targets = input_ids[:, first_target + 1 :]
    temperature = float(temperature or 1.0)
    head = output_layer(model)
    if head is not None:
        with (
            autocast or contextlib.nullcontext(),
            projecting_logprobs(
                head, targets, vocab=_vocab(head, model), temperature=temperature, chunk_bytes=chunk_bytes
            ),
        ):
            values = model(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs
            ).logits
        if tuple(values.shape) != tuple(targets.shape):
            raise RuntimeError(
                f"the model's head returned {tuple(values.shape)} for targets {tuple(targets.shape)}: it "
                "transforms the output layer's result; add its config key to LOGIT_POSTPROCESSING"
            )
    else:
        with autocast or contextlib.nullcontext():
            out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        logits = out.logits[:, -keep:, :][:, :-1, :]
        values = chunked_logprobs(
            lambda x: x,
            logits,
            targets,
            vocab=logits.shape[-1],
            temperature=temperature,
            chunk_bytes=chunk_bytes,
        )
    if not first_target:
        return values
    full = values.new_zeros((input_ids.shape[0], width - 1))
    full[:, first_target:] = values
    return full


def _packed_token_logprobs(
    model: torch.nn.Module,
    shape: torch.Size,
    device: torch.device,
    packed: PackedBatch,
    *,
    temperature: float,
    autocast: contextlib.AbstractContextManager | None,
    chunk_bytes: int,
) -> torch.Tensor:
    """token_logprobs of plain rows [B, T] (`shape`) from their packed form: completion targets only."""
    head = output_layer(model)
    if head is None:
        raise RuntimeError("packed rows need the model's output layer (prefix_packing.unsupported_reason)")
    width = packed.input_ids.shape[1]
    kept_from = int(packed.source_pos.min()) if packed.source_pos.numel() else width - 1
    keep = width - kept_from
    flat = (packed.source_row * keep + packed.source_pos - kept_from).to(device)

    def select(hidden: torch.Tensor) -> torch.Tensor:  # hidden [R, keep, H] -> [N, H]
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat)

    mask = mask_4d(packed.segments, attention_implementation(model) or "sdpa").to(device)
    with (
        autocast or contextlib.nullcontext(),
        projecting_logprobs(
            head, packed.target_ids.to(device), vocab=_vocab(head, model), temperature=temperature,
            chunk_bytes=chunk_bytes, select=select,
        ),
    ):  # fmt: skip
        values = model(
            input_ids=packed.input_ids.to(device), attention_mask=mask,
            position_ids=packed.position_ids.to(device), use_cache=False, logits_to_keep=keep,
        ).logits  # fmt: skip
    full = values.new_zeros((shape[0], shape[1] - 1))
    full[packed.out_row.to(device), packed.out_col.to(device)] = values
    return full
