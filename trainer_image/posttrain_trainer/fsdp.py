"""Sharded full fine-tuning with torch's FSDP2 (`fully_shard`), and the full state dicts it gathers.

Each transformer block the model names in `_no_split_modules` (Qwen2DecoderLayer, ...) becomes its own FSDP
unit, then the whole model (embeddings, final norm and a tied output layer share the root unit): parameters,
gradients and AdamW state are split over the ranks; a block's weights are all-gathered just for its forward
and backward. Mixed precision follows posttrain.hardware: where bf16 is on, weights are gathered and computed
in bf16 and gradients reduced in fp32 onto fp32 master shards (MixedPrecisionPolicy); no autocast.

Weights leave the shards only through torch.distributed.checkpoint's state-dict API: the full state dict,
gathered onto rank 0's CPU one tensor at a time (cpu_offload), for weight sync, the final save and
checkpoints. A checkpoint holds the full model and optimizer state (the same model.safetensors / optimizer.* files
as a single-process run, optimizer state keyed by parameter name), so a job resumes on any number of ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)


def mixed_precision(bf16: bool) -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def block_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the model's transformer blocks (transformers' `_no_split_modules`)."""
    return set(getattr(model, "_no_split_modules", None) or [])


def shard(model: torch.nn.Module, mesh: Any, bf16: bool) -> torch.nn.Module:
    """fully_shard every block, then the model (in place; parameters become DTensor shards)."""
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision(bf16)
    blocks = block_classes(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def repoint_optimizer(
    optimizer: torch.optim.Optimizer, names: dict[int, str], model: torch.nn.Module
) -> None:
    """Point an optimizer built before sharding at the sharded parameters (fully_shard registers new
    Parameter objects). `names`: id(parameter before sharding) -> its name. The optimizer has not stepped
    yet (no state), and the scheduler keeps working on the same optimizer object."""
    if optimizer.state:
        raise RuntimeError("the optimizer must be repointed before its first step")
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[names[id(p)]] for p in group["params"]]


def mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    from posttrain_trainer import distributed as D

    return init_device_mesh(D.device().type, (D.world_size(),))


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Collective: the full weights on rank 0's CPU (parameter names as in the unsharded model); {} on the
    other ranks."""
    return get_model_state_dict(model, options=_TO_RANK0)


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Collective: the full optimizer state on rank 0's CPU, keyed by parameter name; {} elsewhere."""
    return get_optimizer_state_dict(model, optimizer, options=_TO_RANK0)


def load_full_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, Any], optim: dict[str, Any]
) -> None:
    """Collective: every rank passes the full state dicts (as full_model_state / full_optimizer_state
    wrote them) and keeps its own shards."""
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, optim, options=options)
