"""AdamW, the learning-rate schedule (warmup_ratio), and gradient-accumulation bookkeeping."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

T = TypeVar("T")


def build_optimizer(
    model: torch.nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> torch.optim.AdamW:
    """AdamW over trainable parameters; no weight decay on biases and norms (1-d tensors)."""
    decay, no_decay = [], []
    for _, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if param.ndim < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    # foreach=False keeps per-parameter math identical across world sizes (and is what DeepSpeed wraps).
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, foreach=False)


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, total_steps: int, warmup_ratio: float = 0.0, name: str = "linear"
):
    """transformers' scheduler: linear (default), cosine, constant_with_warmup, ..."""
    from transformers import get_scheduler

    warmup = int(math.ceil(max(0.0, min(1.0, warmup_ratio)) * total_steps))
    return get_scheduler(name, optimizer, num_warmup_steps=warmup, num_training_steps=max(1, total_steps))


@dataclass(frozen=True)
class BatchPlan:
    """How a global batch splits: global = micro_batch x grad_accum x world_size."""

    micro_batch: int
    grad_accum: int
    world_size: int

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.world_size

    @classmethod
    def from_hyperparameters(cls, hp: dict[str, Any], world_size: int) -> BatchPlan:
        """synth hyperparameters: per_device_batch / batch_size / global_batch / gradient_accumulation_steps.

        global_batch wins when given (split across ranks, then accumulation); otherwise per_device_batch (or
        batch_size) x gradient_accumulation_steps per rank."""
        accum = int(hp.get("gradient_accumulation_steps") or 1)
        micro = int(hp.get("per_device_batch") or hp.get("batch_size") or 1)
        global_batch = hp.get("global_batch")
        if global_batch:
            global_batch = int(global_batch)
            per_rank = max(1, global_batch // world_size)
            if not hp.get("per_device_batch"):
                micro = max(1, per_rank // accum)
            accum = max(1, per_rank // micro)
            if micro * accum * world_size != global_batch:
                raise ValueError(
                    f"global_batch {global_batch} is not divisible into {world_size} ranks x "
                    f"micro-batches of {micro}"
                )
        return cls(micro_batch=micro, grad_accum=accum, world_size=world_size)

    def one_per_device(self) -> BatchPlan:
        """The same global batch as micro-batches of one example, the rest as gradient accumulation: synth's
        rule for vision models, whose rows carry images of different sizes (and many patch tokens)."""
        return BatchPlan(
            micro_batch=1, grad_accum=self.micro_batch * self.grad_accum, world_size=self.world_size
        )


def chunk(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def accumulation_groups(micro_batches: Iterable[T], grad_accum: int) -> Iterator[list[T]]:
    """Group micro-batches into optimizer steps (the last group may be short)."""
    group: list[T] = []
    for item in micro_batches:
        group.append(item)
        if len(group) == grad_accum:
            yield group
            group = []
    if group:
        yield group
