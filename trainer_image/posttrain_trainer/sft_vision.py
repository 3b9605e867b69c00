"""Vision SFT data: chat rows with image parts -> the model's processor -> token ids with loss only on
assistant tokens, plus pixel values and image grids -> padded batches.

Image parts are OpenAI's {"type": "image_url", "image_url": {"url": ...}} (also "image" / "input_image"); the URL
is a data: URI, an http(s) URL or a local path (relative paths are taken from the dataset's folder). Images are
loaded with transformers' load_image (PIL; httpx for URLs). Each message keeps its first max_images_per_message
images; extra ones are trimmed (synth's rule) and counted.

Masking is the text path's (sft_data.assistant_char_spans) applied to the processor's chat template: the
characters each assistant turn adds are the targets. The processor then expands every image placeholder into
one pad token per merged patch; its text_replacement_offsets move the spans to the expanded text, and the
tokenizer's offsets map them to tokens. Image and video pad tokens are never targets. A row whose images would
be cut by sequence_length is dropped (the model needs every pad token of an image it is given)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain_trainer.sft_data import (
    IGNORE_INDEX,
    IMAGE_PART_TYPES,
    DataError,
    Encoded,
    Example,
    assistant_char_spans,
    collate,
)

TEXT_PART_TYPES = ("text", "input_text", "output_text")


@dataclass
class VisionEncoded(Encoded):
    mm_token_type_ids: list[int] = field(default_factory=list)
    pixel_values: torch.Tensor | None = None  # (patches, channels * temporal * patch * patch)
    image_grid_thw: torch.Tensor | None = None  # (images, 3)


@dataclass
class VisionMessages:
    messages: list[dict[str, Any]]  # Hugging Face form: string content, or text parts and {"type": "image"}
    images: list[Any]  # PIL images in the order of the image parts
    trimmed: int = 0  # image parts dropped by max_images_per_message


def image_source(part: dict[str, Any]) -> str:
    """The URL, data: URI or path of an image part (checked non-empty by sft_data.parse_jsonl)."""
    value = part.get("image_url") or part.get("image") or part.get("url") or part.get("path")
    if isinstance(value, dict):
        value = value.get("url")
    return str(value or "")


def load_image_source(source: str, where: str, base_dir: Path | None = None):
    """A PIL RGB image from a data: URI, an http(s) URL or a local path; errors name the row."""
    from transformers.image_utils import load_image

    if base_dir is not None and not source.startswith(("http://", "https://", "data:")):
        candidate = base_dir / source
        if not Path(source).is_absolute() and candidate.is_file():
            source = str(candidate)
    try:
        return load_image(source, timeout=30.0)
    except Exception as err:
        shown = source if len(source) < 80 else source[:60] + "..."
        raise DataError(f"{where}: cannot load image {shown!r} ({type(err).__name__})") from None


def vision_messages(
    messages: list[dict[str, Any]],
    where: str,
    *,
    max_images_per_message: int | None = None,
    base_dir: Path | None = None,
) -> VisionMessages:
    """Messages in the form the processor's chat template expects, and their images, loaded."""
    out: list[dict[str, Any]] = []
    images: list[Any] = []
    trimmed = 0
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, dict):
            content = [content]
        if isinstance(content, list):
            parts: list[dict[str, Any]] = []
            kept = 0
            for part in content:
                kind = part.get("type")
                if kind in IMAGE_PART_TYPES:
                    if max_images_per_message is not None and kept >= max_images_per_message:
                        trimmed += 1
                        continue
                    images.append(load_image_source(image_source(part), where, base_dir))
                    parts.append({"type": "image"})
                    kept += 1
                elif kind in TEXT_PART_TYPES:
                    parts.append({"type": "text", "text": str(part.get("text", ""))})
            # text-only content as a string: every template takes it, and masking can fall back to a search
            content = parts if kept else "".join(p["text"] for p in parts)
        message["content"] = "" if content is None else content
        out.append(message)
    return VisionMessages(out, images, trimmed)


def _expanded(char: int, placeholder_ends: list[int], gained: list[int]) -> int:
    """A character position of the rendered text, moved past the image placeholders expanded before it."""
    return char + gained[bisect.bisect_right(placeholder_ends, char)]


def encode_vision_example(
    processor,
    example: Example,
    *,
    max_length: int,
    max_images_per_message: int | None = None,
    source: str = "",
    base_dir: Path | None = None,
) -> tuple[VisionEncoded | None, int]:
    """(encoded row, images trimmed); the row is None when sequence_length would cut one of its images."""
    where = f"{source}:{example.line}" if source else f"line {example.line}"
    vm = vision_messages(
        example.messages, where, max_images_per_message=max_images_per_message, base_dir=base_dir
    )
    full, spans = assistant_char_spans(processor, vm.messages, example.extra.get("tools"))
    enc = processor(
        text=[full],
        images=vm.images or None,
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_text_replacement_offsets=True,
        return_mm_token_type_ids=True,
    )
    ids: list[int] = list(enc["input_ids"][0])
    offsets = enc["offset_mapping"][0]
    replacements = (enc.get("text_replacement_offsets") or [[]])[0]
    placeholder_ends = [r["span"][1] for r in replacements]
    gained = [0] + [r["new_span"][1] - r["span"][1] for r in replacements]
    spans = [
        (_expanded(s, placeholder_ends, gained), _expanded(e, placeholder_ends, gained)) for s, e in spans
    ]
    media_ids = {processor.image_token_id, getattr(processor, "video_token_id", None)}
    labels = [IGNORE_INDEX] * len(ids)
    for index, (start, end) in enumerate(offsets):
        if end <= start or ids[index] in media_ids:
            continue
        if any(s <= start < e for s, e in spans):
            labels[index] = ids[index]
    mm_types = list(enc.get("mm_token_type_ids", [[0] * len(ids)])[0])
    if len(ids) > max_length:
        if any(mm_types[max_length:]) or any(i in media_ids for i in ids[max_length:]):
            return None, vm.trimmed
        ids, labels, mm_types = ids[:max_length], labels[:max_length], mm_types[:max_length]
    pixel_values = grid = None
    if vm.images:
        pixel_values = torch.as_tensor(enc["pixel_values"])
        grid = torch.as_tensor(enc["image_grid_thw"])
    return VisionEncoded(example.line, ids, labels, mm_types, pixel_values, grid), vm.trimmed


def encode_all_vision(
    processor,
    examples: list[Example],
    *,
    max_length: int,
    max_images_per_message: int | None = None,
    source: str = "",
    base_dir: Path | None = None,
) -> tuple[list[VisionEncoded], int, int]:
    """(rows with at least one target token, rows dropped, image parts trimmed)."""
    kept: list[VisionEncoded] = []
    dropped = trimmed = 0
    for example in examples:
        encoded, cut = encode_vision_example(
            processor,
            example,
            max_length=max_length,
            max_images_per_message=max_images_per_message,
            source=source,
            base_dir=base_dir,
        )
        trimmed += cut
        if encoded is None or encoded.n_target == 0:
            dropped += 1
            continue
        kept.append(encoded)
    return kept, dropped, trimmed


def collate_vision(encoded: list[Encoded], pad_id: int, pad_to_multiple: int = 1) -> dict[str, Any]:
    """The text batch (right-padded ids, labels, mask) plus mm_token_type_ids, and the images of all rows in
    row order: pixel_values concatenated over patches, image_grid_thw over images."""
    batch = collate(encoded, pad_id, pad_to_multiple)
    types = torch.zeros_like(batch["input_ids"])
    for row, e in enumerate(encoded):
        if isinstance(e, VisionEncoded) and e.mm_token_type_ids:
            types[row, : len(e.mm_token_type_ids)] = torch.tensor(e.mm_token_type_ids)
    batch["mm_token_type_ids"] = types
    with_images = [e for e in encoded if isinstance(e, VisionEncoded) and e.pixel_values is not None]
    if with_images:
        batch["pixel_values"] = torch.cat([e.pixel_values for e in with_images])
        batch["image_grid_thw"] = torch.cat([e.image_grid_thw for e in with_images])
    return batch
