"""Shared-prefix packing: the samples of a group share their prompt, so the prompt runs once per micro-batch.

GRPO/GSPO sample a group of completions per prompt, and the update scores every one of them. Run as plain
right-padded rows, each completion carries its own copy of the prompt through the forward and the backward
pass: with the demo's 46-token prompts and ~12-token answers three quarters of the work is the same prompt
eight times. Packed, consecutive rows that share a prefix become one row, [prefix, rest of row 1, rest of
row 2, ...]: every rest attends to the prefix and to itself (a 4-D attention mask), its position ids go on
from the prefix's end, and the logits of the prefix's positions serve every row that shares them. The same
function of the weights, so the same values and gradients (float32: within 1e-5, tests/unit/
test_prefix_packing.py; bf16: the rounding of differently shaped matmuls, as large as any batch change's).

Pure planning (`plan`) over token lists; `mask_4d` for the attention implementations that take a custom 4-D
mask (sdpa, eager); `unsupported_reason` names why a model keeps the plain rows. Rows that save too little
stay rows of their own, so a batch of unrelated prompts packs into nothing and takes the plain path."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Architectures whose packed values and gradients tests/unit/test_prefix_packing.py checks against the plain
# rows (rotary position ids and transformers' create_causal_mask, which passes a 4-D mask through as it is).
VERIFIED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
MASKED_ATTENTION = ("sdpa", "eager")
MIN_SAVING = 0.25  # a row joins a packed row only if the packed row is at least a quarter shorter
# the 4-D mask grows with the square of a packed row (sdpa may widen it to a float bias): 16 MiB of booleans
# per packed row at most, and rows this long rarely share enough of themselves to pass MIN_SAVING anyway
MAX_PACKED_TOKENS = 4096


@dataclass
class PackedBatch:
    """Packed rows and where each completion target of the plain [B, T - 1] layout is read from.

    input_ids/position_ids/segments: [R, Tp] (segment 0: the shared prefix, k > 0: the rest of one plain
    row, -1: padding). Target i: plain row out_row[i], column out_col[i] (it predicts input_ids[b, t + 1]),
    read from the packed row source_row[i] at position source_pos[i], target token target_ids[i]."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    source_row: torch.Tensor
    source_pos: torch.Tensor
    target_ids: torch.Tensor
    out_row: torch.Tensor
    out_col: torch.Tensor
    plain_tokens: int
    packed_tokens: int


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def clusters(
    rows: Sequence[Sequence[int]],
    prompt_lengths: Sequence[int] | None = None,
    *,
    min_saving: float = MIN_SAVING,
    max_tokens: int = MAX_PACKED_TOKENS,
) -> list[tuple[list[int], int]]:
    """Consecutive rows that share a prefix, as (row indices, shared prefix length); a row alone shares its
    whole length. A row joins the open cluster while the packed row stays at least `min_saving` shorter than
    the plain rows it replaces and within `max_tokens`, and: when it has the cluster's prompt (the first
    `prompt_lengths` tokens, where given), always; otherwise only when joining is shorter than starting a
    row of its own and the next row does not share more with it than the cluster does (the first row of the
    next group starts that group's own packed row)."""
    out: list[tuple[list[int], int]] = []
    members: list[int] = []
    shared = 0
    for index, row in enumerate(rows):
        if members:
            head = members[0]
            candidate = min(shared, _common_prefix(rows[head], row))
            lengths = [len(rows[m]) for m in members] + [len(row)]
            packed = candidate + sum(n - candidate for n in lengths)
            fits = candidate > 0 and packed <= (1 - min_saving) * sum(lengths) and packed <= max_tokens
            same_prompt = prompt_lengths is not None and (
                prompt_lengths[index] == prompt_lengths[head] and candidate >= prompt_lengths[index]
            )
            current = shared + sum(n - shared for n in lengths[:-1])
            next_shares_more = (
                candidate < shared and index + 1 < len(rows) and _common_prefix(row, rows[index + 1]) > candidate
            )
            if fits and (same_prompt or (packed < current + len(row) and not next_shares_more)):
                members.append(index)
                shared = candidate
                continue
            out.append((members, shared))
        members, shared = [index], len(row)
    if members:
        out.append((members, shared))
    return out


def plan(
    rows: Sequence[Sequence[int]],
    completion_starts: Sequence[int],
    pad_id: int,
    *,
    min_saving: float = MIN_SAVING,
    max_tokens: int = MAX_PACKED_TOKENS,
    window: int | None = None,
) -> PackedBatch | None:
    """The packed form of plain rows (prompt + completion token ids, prompts at least one token), reading
    the completion targets of each row (columns completion_start - 1 .. len - 2). None when no two rows pack
    (the plain rows are as cheap) or when a row is longer than a sliding attention `window` (the custom mask
    would let it see past the window)."""
    if window is not None and any(len(r) > window for r in rows):
        return None
    groups = clusters(rows, completion_starts, min_saving=min_saving, max_tokens=max_tokens)
    if all(len(members) == 1 for members, _ in groups):
        return None
    packed_rows: list[list[int]] = []
    positions: list[list[int]] = []
    segments: list[list[int]] = []
    source_row: list[int] = []
    source_pos: list[int] = []
    targets: list[int] = []
    out_row: list[int] = []
    out_col: list[int] = []
    for r, (members, shared) in enumerate(groups):
        head = rows[members[0]]
        ids, pos, seg = list(head[:shared]), list(range(shared)), [0] * shared
        for k, b in enumerate(members, 1):
            row = rows[b]
            offset = len(ids)  # where row[shared:] starts in the packed row
            ids += row[shared:]
            pos += range(shared, len(row))
            seg += [k] * (len(row) - shared)
            for t in range(max(0, completion_starts[b] - 1), len(row) - 1):
                source_row.append(r)
                source_pos.append(t if t < shared else offset + t - shared)
                targets.append(row[t + 1])
                out_row.append(b)
                out_col.append(t)
        packed_rows.append(ids)
        positions.append(pos)
        segments.append(seg)
    width = max(len(ids) for ids in packed_rows)
    input_ids = torch.full((len(packed_rows), width), pad_id, dtype=torch.long)
    position_ids = torch.zeros((len(packed_rows), width), dtype=torch.long)
    segment_ids = torch.full((len(packed_rows), width), -1, dtype=torch.long)
    for r, (ids, pos, seg) in enumerate(zip(packed_rows, positions, segments, strict=True)):
        input_ids[r, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        position_ids[r, : len(pos)] = torch.tensor(pos, dtype=torch.long)
        segment_ids[r, : len(seg)] = torch.tensor(seg, dtype=torch.long)

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long)

    return PackedBatch(
        input_ids, position_ids, segment_ids, tensor(source_row), tensor(source_pos), tensor(targets),
        tensor(out_row), tensor(out_col), plain_tokens=sum(len(r) for r in rows),
        packed_tokens=sum(len(ids) for ids in packed_rows),
    )  # fmt: skip


def allowed(segments: torch.Tensor) -> torch.Tensor:
    """[R, 1, Tp, Tp] booleans, True where query q may attend key k: k at or before q, and k in the shared
    prefix or in q's own segment. Padding attends to itself alone (a fully masked row would be NaN)."""
    width = segments.shape[1]
    causal = torch.ones((width, width), dtype=torch.bool, device=segments.device).tril()
    query, key = segments.unsqueeze(2), segments.unsqueeze(1)
    same = (query == key) | ((key == 0) & (query >= 0))
    diagonal = torch.eye(width, dtype=torch.bool, device=segments.device)
    return ((causal & same & (query >= 0) & (key >= 0)) | diagonal).unsqueeze(1)


def mask_4d(segments: torch.Tensor, implementation: str) -> torch.Tensor:
    """The attention mask in the form the implementation takes: booleans for sdpa, additive float32 for
    eager (0 where allowed, the most negative float elsewhere)."""
    ok = allowed(segments)
    if implementation == "sdpa":
        return ok
    return torch.zeros(ok.shape, dtype=torch.float32, device=ok.device).masked_fill(
        ~ok, torch.finfo(torch.float32).min
    )


def _config(model: torch.nn.Module):
    from posttrain_trainer.distributed import unwrap

    return getattr(unwrap(model), "config", None)


def attention_implementation(model: torch.nn.Module) -> str | None:
    config = _config(model)
    return getattr(config, "_attn_implementation", None) if config is not None else None


def sliding_window(model: torch.nn.Module) -> int | None:
    """The model's sliding attention window where some layer uses one (a packed row's custom mask does not
    apply it, so only rows within the window pack); None without one."""
    config = _config(model)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def unsupported_reason(model: torch.nn.Module, *, vision: bool = False) -> str | None:
    """Why this policy keeps plain rows (None: it packs)."""
    from posttrain_trainer.logprobs import output_layer

    if vision:
        return "a vision policy (its image tokens are placed by row)"
    config = _config(model)
    model_type = getattr(config, "model_type", None)
    if model_type not in VERIFIED_MODEL_TYPES:
        return f"model type {model_type!r} is not among those verified ({', '.join(VERIFIED_MODEL_TYPES)})"
    implementation = attention_implementation(model)
    if implementation not in MASKED_ATTENTION:
        return f"attention implementation {implementation!r} takes no custom 4-D mask (sdpa and eager do)"
    if output_layer(model) is None:
        return "the model's head transforms its logits after the output layer"
    return None


@dataclass(frozen=True)
class PackPolicy:
    """The policy packs its rows by shared prefix (unsupported_reason found no reason not to); window: its
    sliding attention window (longer rows stay plain), None without one."""

    window: int | None = None


def pack_policy(model: torch.nn.Module, vision: bool) -> tuple[PackPolicy | None, str]:
    """Whether the update packs the policy's rows, and the line that says so in the trainer's log."""
    reason = unsupported_reason(model, vision=vision)
    if reason is not None:
        return None, f"shared-prefix packing: off ({reason})"
    return PackPolicy(sliding_window(model)), (
        "shared-prefix packing: on (the samples of a group share one forward pass of their prompt)"
    )
