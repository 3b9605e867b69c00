"""Images of RL sequences -> the model inputs the trainer needs to recompute the sampler's logprobs.

The rollout server captures, with each call's exact token ids (vLLM's prompt_token_ids, every image
placeholder expanded into its pad tokens), the image URLs the request gave vLLM, in prompt order. vLLM ran the
model's own Hugging Face processor on those images; the trainer runs the same processor (saved with the
model) on the same images, so pixel values and grids are the same, and checks that every row holds exactly
the pad tokens its images expand to (a mismatch would silently misalign image features and text).

URLs come from the task app (untrusted): the rollout server has turned every http(s) image into a data: URI
(the bytes vLLM got), so the trainer loads data: URIs only; it never fetches a URL or reads a local path a
task app names (the trainer's files and network are not the task app's).

A policy that samples an image pad token itself (a random test model does, about 1 token in 500) makes a
sequence the model's forward cannot take: transformers puts image features at every pad token id, vLLM only
at the placeholders of the prompt. Such sequences are left out of the update and counted
(drop_sampled_media_tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

ALLOWED_SCHEMES = ("data:",)


class VisionInputError(RuntimeError):
    pass


def load_image(url: str):
    from posttrain_trainer.sft_data import DataError
    from posttrain_trainer.sft_vision import load_image_source

    if not url.startswith(ALLOWED_SCHEMES):
        shown = url if len(url) < 80 else url[:60] + "..."
        raise VisionInputError(f"image {shown!r}: the trainer loads data: URIs only")
    try:
        return load_image_source(url, "rollout image")
    except DataError as err:
        raise VisionInputError(str(err)) from None


def pad_tokens_per_image(grid: torch.Tensor, merge_size: int) -> list[int]:
    """Pad tokens each image expands to: its patches (t * h * w) over the merge window (merge_size ** 2)."""
    return [int(n) // (merge_size * merge_size) for n in grid.prod(-1).tolist()]


def image_inputs(processor: Any, images: Sequence[Sequence[str]], input_ids: torch.Tensor) -> dict[str, Any]:
    """pixel_values, image_grid_thw (all rows' images in row order) and mm_token_type_ids for a batch whose
    row i holds the placeholders of images[i]; {} when no row has an image. Raises VisionInputError when a
    row's pad tokens do not match what its images expand to."""
    if not any(images):
        return {}
    pad_id = int(processor.image_token_id)
    merge = int(getattr(processor.image_processor, "merge_size", 2) or 2)
    pixels, grids = [], []
    for row, urls in enumerate(images):
        pads = int((input_ids[row] == pad_id).sum())
        if not urls:
            if pads:
                raise VisionInputError(f"row {row}: {pads} image pad tokens but no image was captured")
            continue
        out = processor.image_processor(images=[load_image(u) for u in urls], return_tensors="pt")
        expected = sum(pad_tokens_per_image(out["image_grid_thw"], merge))
        if pads != expected:
            raise VisionInputError(
                f"row {row}: {pads} image pad tokens in vLLM's prompt, but its {len(urls)} image(s) expand to "
                f"{expected} with this processor: the trainer cannot rebuild what the sampler saw"
            )
        pixels.append(out["pixel_values"])
        grids.append(out["image_grid_thw"])
    return {
        "pixel_values": torch.cat(pixels),
        "image_grid_thw": torch.cat(grids),
        "mm_token_type_ids": (input_ids == pad_id).long(),  # 1 marks image tokens (M-RoPE positions)
    }


def media_token_ids(processor: Any) -> set[int]:
    ids = {getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None)}
    return {int(i) for i in ids if i is not None}


def drop_sampled_media_tokens(seqs: list[Any], media_ids: set[int]) -> tuple[list[Any], int]:
    """(sequences whose policy-sampled tokens hold no image/video pad token, how many were left out)."""
    kept = [
        s
        for s in seqs
        if not any(m and t in media_ids for t, m in zip(s.completion_ids, s.completion_mask, strict=True))
    ]
    return kept, len(seqs) - len(kept)
