"""SFT data: JSONL chat rows -> token ids with loss only on assistant tokens -> padding-aware batches.

Rows follow synth's rules (learning/sft/data.py): {"messages": [...]} with >= 2 messages; content is a string,
a list of OpenAI parts ({"type": "text"}, {"type": "image_url"}, {"type": "image"}), or null with tool_calls.
Text-only models refuse image parts with an error naming the file and line.

Assistant masking renders the chat template on growing prefixes of the conversation: the characters that the
i-th assistant message adds after `render(messages[:i], add_generation_prompt=True)` (its content and the
end-of-turn token) are the trained ones; tokens are mapped through the fast tokenizer's offsets. Templates
that rewrite earlier turns (e.g. drop old reasoning) fall back to locating each assistant text in order."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IGNORE_INDEX = -100
IMAGE_PART_TYPES = {"image_url", "image", "input_image"}  # as posttrain.api.dataset


class DataError(ValueError):
    """A problem in the user's dataset; the message names the file and line."""


@dataclass
class Example:
    line: int
    messages: list[dict[str, Any]]
    extra: dict[str, Any]


@dataclass
class Encoded:
    line: int
    input_ids: list[int]
    labels: list[int]

    @property
    def n_target(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE_INDEX)

    def __len__(self) -> int:
        return len(self.input_ids)


def has_images(messages: list[dict[str, Any]]) -> bool:
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(p, dict) and p.get("type") in IMAGE_PART_TYPES for p in content
        ):
            return True
    return False


def parse_jsonl(path: str | Path) -> list[Example]:
    """Read and check a chat JSONL file with the rules `posttrain validate` applies (posttrain.api.dataset,
    one home for both). Raises DataError naming file:line for the first bad row."""
    from posttrain.api.dataset import check_row, parse_line, read_lines
    from posttrain.errors import UserError

    path = Path(path)
    try:
        lines = read_lines(path)
    except UserError as err:
        raise DataError(str(err.problems[0])) from None
    examples: list[Example] = []
    for number, raw in lines:
        where = f"{path.name}:{number}"
        row, error = parse_line(raw)
        if error:
            raise DataError(f"{where}: {error}")
        check = check_row(row, base_dir=path.parent)
        if check.problems:
            message, fix = check.problems[0]
            raise DataError(f"{where}: {message}" + (f" (fix: {fix})" if fix else ""))
        examples.append(Example(number, row["messages"], {k: v for k, v in row.items() if k != "messages"}))
    if not examples:
        raise DataError(f"{path}: file contains no SFT examples")
    return examples


def text_only_messages(messages: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Flatten text parts into strings (most templates expect string content); image parts are an error."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if isinstance(content, dict):
            content = [content]
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") in IMAGE_PART_TYPES:
                    raise DataError(
                        f"{where}: image content, but the model is text-only "
                        "(use a vision model such as Qwen3-VL, or remove image parts)"
                    )
                if part.get("type") in ("text", "input_text", "output_text"):
                    texts.append(str(part.get("text", "")))
            content = "".join(texts)
        if content is None:
            content = ""
        message["content"] = content
        out.append(message)
    return out


def _render(tokenizer, messages, add_generation_prompt: bool, tools=None) -> str:
    kwargs = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


def assistant_char_spans(
    tokenizer, messages: list[dict[str, Any]], tools=None
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans of every assistant turn to train on."""
    full = _render(tokenizer, messages, False, tools)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        try:
            before = _render(tokenizer, messages[:i], True, tools) if i else ""
            upto = _render(tokenizer, messages[: i + 1], False, tools)
        except Exception:
            before, upto = "", ""
        if i and upto and full.startswith(upto) and upto.startswith(before) and len(before) >= cursor:
            spans.append((len(before), len(upto)))
            cursor = len(upto)
            continue
        # Fallback: find this assistant text after the previous span, and keep the end-of-turn marker after it.
        text = message.get("content") or ""
        start = full.find(text, cursor) if text else -1
        if start < 0:
            continue
        end = start + len(text)
        eos = getattr(getattr(tokenizer, "tokenizer", tokenizer), "eos_token", None) or ""  # or a processor's
        if eos and full.startswith(eos, end):
            end += len(eos)
        spans.append((start, end))
        cursor = end
    return full, spans


def encode_example(
    tokenizer, example: Example, *, max_length: int, text_only: bool = True, source: str = ""
) -> Encoded:
    where = f"{source}:{example.line}" if source else f"line {example.line}"
    messages = text_only_messages(example.messages, where) if text_only else example.messages
    full, spans = assistant_char_spans(tokenizer, messages, example.extra.get("tools"))
    enc = tokenizer(full, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    labels = [IGNORE_INDEX] * len(ids)
    for index, (start, end) in enumerate(enc["offset_mapping"]):
        if end <= start:
            continue
        if any(s <= start < e for s, e in spans):
            labels[index] = ids[index]
    ids, labels = ids[:max_length], labels[:max_length]
    return Encoded(example.line, ids, labels)


def encode_all(
    tokenizer,
    examples: list[Example],
    *,
    max_length: int,
    text_only: bool,
    source: str = "",
) -> tuple[list[Encoded], int]:
    """Encoded examples with at least one target token, and how many were dropped (all-masked after truncation)."""
    kept, dropped = [], 0
    for example in examples:
        encoded = encode_example(
            tokenizer, example, max_length=max_length, text_only=text_only, source=source
        )
        if encoded.n_target == 0:
            dropped += 1
            continue
        kept.append(encoded)
    return kept, dropped


# -- batching --------------------------------------------------------------------------------------------


def epoch_batches(
    n_examples: int, global_batch: int, *, seed: int, epoch: int, shuffle: bool = True
) -> list[list[int]]:
    """The epoch's optimizer steps as lists of example indices (the same on every rank). An incomplete last
    batch is dropped (unless it is the only one), so that every rank always has work."""
    order = list(range(n_examples))
    if shuffle:
        random.Random(seed * 1_000_003 + epoch).shuffle(order)
    batches = [order[i : i + global_batch] for i in range(0, n_examples, global_batch)]
    if len(batches) > 1 and len(batches[-1]) < global_batch:
        batches.pop()
    return batches


def split_global_batch(
    indices: list[int], lengths: list[int], *, micro_batch: int, world_size: int, rank: int
) -> list[list[int]]:
    """Padding-aware split of one optimizer step: sort by length so each micro-batch holds similar lengths,
    cut into micro-batches, deal them round-robin to ranks. Returns this rank's micro-batches (accumulation
    order). Every rank gets the same count (empty lists when the batch is short)."""
    ordered = sorted(indices, key=lambda i: (lengths[i], i))
    micro = [ordered[i : i + micro_batch] for i in range(0, len(ordered), micro_batch)]
    per_rank = -(-len(micro) // world_size)
    micro += [[] for _ in range(per_rank * world_size - len(micro))]
    return [micro[j] for j in range(rank, len(micro), world_size)]


def collate(encoded: list[Encoded], pad_id: int, pad_to_multiple: int = 1) -> dict[str, Any]:
    """Right-padded tensors for one micro-batch."""
    import torch

    longest = max(len(e) for e in encoded)
    if pad_to_multiple > 1:
        longest = -(-longest // pad_to_multiple) * pad_to_multiple
    ids = torch.full((len(encoded), longest), pad_id, dtype=torch.long)
    labels = torch.full((len(encoded), longest), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(encoded), longest), dtype=torch.long)
    for row, e in enumerate(encoded):
        n = len(e)
        ids[row, :n] = torch.tensor(e.input_ids)
        labels[row, :n] = torch.tensor(e.labels)
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def iter_chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
