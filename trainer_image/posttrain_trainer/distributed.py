"""torch.distributed from the torchrun environment, and the training engine (DDP, DeepSpeed ZeRO or FSDP2).

What runs where (measured, see docs/deepspeed-cpu.md and tests/integration/test_trainer_*):
- CPU (gloo): single process, DDP over N processes, DeepSpeed ZeRO 0-3 (fp32, and bf16 at stage >= 1;
  bf16 at stage 0 drifts, so bf16 is forced to stage >= 1 here), FSDP2 (fsdp.py). The DeepSpeed
  shared-memory comm op is disabled on CPU (its JIT compile takes ~85 s and changes nothing).
- GPU only: NCCL, DeepSpeed fused optimizers (we always pass a torch AdamW, so no op is JIT-compiled on either).
- Precision on both: posttrain.hardware decides from the device's native bf16 and parallelism.bf16 /
  parallelism.force_bf16 (bf16 autocast with fp32 master weights where bf16 is native, fp32 elsewhere).

Loss convention for every engine: the caller passes a loss already normalised for the whole optimizer step
(all ranks, all accumulation micro-batches), as if computed in one process. DDP averages gradients over
ranks, so the engine multiplies by world_size (DDP and FSDP2); DeepSpeed is told not to rescale by its
accumulation count."""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from posttrain import hardware
from posttrain.api.settings import ParallelSettings


def backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_distributed() else int(os.environ.get("RANK", 0))


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else int(os.environ.get("WORLD_SIZE", 1))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", 0))


def is_main() -> bool:
    return rank() == 0


def device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank())
    return torch.device("cpu")


def init_distributed(timeout_s: float = 1800) -> None:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, MASTER_ADDR, ...). A plain `python -m`
    run (no WORLD_SIZE) stays a single process without a group."""
    if is_distributed():
        return
    if "WORLD_SIZE" not in os.environ or "MASTER_ADDR" not in os.environ:
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank())
    dist.init_process_group(backend=backend(), timeout=datetime.timedelta(seconds=timeout_s))


def shutdown() -> None:
    if is_distributed():
        dist.barrier()
        dist.destroy_process_group()


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(value: float | torch.Tensor) -> float | torch.Tensor:
    """Sum over ranks; returns the same kind it got (float or tensor)."""
    if not is_distributed():
        return value
    as_float = not isinstance(value, torch.Tensor)
    tensor = torch.tensor(float(value), dtype=torch.float64) if as_float else value.detach().clone()
    tensor = tensor.to(device() if backend() == "nccl" else "cpu")
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return float(tensor.item()) if as_float else tensor


def all_reduce_mean(value: float | torch.Tensor) -> float | torch.Tensor:
    total = all_reduce_sum(value)
    return total / world_size()


def broadcast_object(obj: Any, src: int = 0) -> Any:
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's obj, in rank order, on every rank."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module under a DDP / DeepSpeed wrapper."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    return model


# hyperparameters.parallelism (synth): use_deepspeed, deepspeed_stage, fsdp, bf16, force_bf16,
# activation_checkpointing; typed in posttrain.api.settings with the rest of the trainer's settings.
ParallelConfig = ParallelSettings


def drop_fsdp(parallel: ParallelConfig, trainer: str) -> None:
    """FSDP2 shards RL's full fine-tuning only: `trainer` (SFT, ReST-EM) trains under DDP or DeepSpeed and
    says so."""
    if parallel.fsdp:
        if is_main():
            print(f"[posttrain] {trainer}: fsdp is for RL full fine-tuning; training under DDP or DeepSpeed",
                  flush=True)  # fmt: skip
        parallel.fsdp = False


def use_bf16(cfg: ParallelConfig) -> bool:
    return cfg.precision().bf16


def announce_precision(cfg: ParallelConfig, lora_policy: bool = False) -> hardware.Precision:
    """The capability and the dtypes chosen, printed once (rank 0), with the warning when a bf16 request
    was turned down; returns the decision. `lora_policy`: an RL LoRA policy that vLLM serves merged."""
    precision = cfg.precision(lora_policy)
    if is_main():
        print(f"[posttrain] {hardware.probe().describe()}", flush=True)
        print(f"[posttrain] {precision.describe()}", flush=True)
        if precision.warning:
            print(f"[posttrain] warning: {precision.warning}", flush=True)
    return precision


def deepspeed_available() -> tuple[bool, str]:
    """Whether DeepSpeed can run here, and why not. Needs a process group (torchrun) on every machine."""
    try:
        import deepspeed  # noqa: F401
    except Exception as err:  # pragma: no cover - image without deepspeed
        return False, f"deepspeed not importable: {err}"
    if not is_distributed():
        return False, "not launched under torchrun (no process group)"
    return True, ""


def _prepare_deepspeed_cpu() -> None:
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.ops

        # The shared-memory comm op JIT-compiles for ~85 s on CPU and changes no number.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


class TrainEngine:
    """One interface over single-process, DDP, DeepSpeed and FSDP2 training.

    Use: `out = engine.model(**batch)`; `engine.backward(loss, boundary=last_micro_batch)`; after the boundary
    backward, `engine.step()` (clips, steps optimizer + scheduler, zeroes grads; returns the grad norm)."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        kind: str,
        grad_accum: int = 1,
        max_grad_norm: float | None = 1.0,
        autocast_dtype: torch.dtype | None = None,
    ):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.kind = kind  # "single" | "ddp" | "deepspeed" | "fsdp"
        self.grad_accum = grad_accum
        self.max_grad_norm = max_grad_norm
        self.autocast_dtype = autocast_dtype  # FSDP2: the dtype its mixed precision computes in
        self.mesh: Any = None  # FSDP2: the device mesh the weights are sharded over

    @property
    def module(self) -> torch.nn.Module:
        return unwrap(self.model)

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None or self.kind in ("deepspeed", "fsdp"):  # they cast the weights
            return contextlib.nullcontext()
        return torch.autocast(device_type=device().type, dtype=self.autocast_dtype)

    def backward(self, loss: torch.Tensor, *, boundary: bool = True) -> None:
        if self.kind == "deepspeed":
            # Gradients are already normalised for the step; DeepSpeed averages over ranks itself. The caller
            # says where the step is (RL's micro-batch count varies from step to step), not the config's
            # gradient_accumulation_steps.
            self.model.set_gradient_accumulation_boundary(boundary)
            self.model.backward(loss * world_size(), scale_wrt_gas=False)
            self.model.step()
            return
        # FSDP2 reduce-scatters every micro-batch's gradients onto the shards (no no_sync: the sharded
        # gradients accumulate, the full ones are never kept)
        scaled = loss * world_size() if self.kind in ("ddp", "fsdp") else loss
        if self.kind == "ddp" and not boundary:
            with self.model.no_sync():
                scaled.backward()
        else:
            scaled.backward()

    def step(self) -> float | None:
        if self.kind == "deepspeed":
            norm = self.model.get_global_grad_norm()
            return None if norm is None else float(norm)
        norm = None
        if self.max_grad_norm:
            total = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.max_grad_norm)
            full = getattr(total, "full_tensor", None)  # FSDP2: a DTensor over the sharded gradients
            norm = float(full() if full is not None else total)
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


def zero_stage(engine: TrainEngine) -> int:
    if engine.kind != "deepspeed":
        return 0
    return int(engine.model.zero_optimization_stage())


def shards_parameters(engine: TrainEngine) -> bool:
    """Whether every rank must run each forward pass together (the weights are gathered in it)."""
    return engine.kind == "fsdp" or zero_stage(engine) >= 3


@contextlib.contextmanager
def full_weights(engine: TrainEngine) -> Iterator[dict[str, torch.Tensor] | None]:
    """Collective (every rank enters it): the full weights for rank 0 to save or sync. Under FSDP2 it
    yields the full state dict on rank 0's CPU ({} elsewhere); under ZeRO-3 it gathers the parameters into
    the module for the duration and yields None (read the module), as every other engine does."""
    if engine.kind == "fsdp":
        from posttrain_trainer.fsdp import full_model_state

        yield full_model_state(engine.model)
        return
    with gathered_parameters(engine):
        yield None


def shard_frozen(engine: TrainEngine, module: torch.nn.Module | None) -> torch.nn.Module | None:
    """A frozen copy (the KL reference) sharded as the policy is under FSDP2, with its mixed precision, so
    that identical weights give identical logprobs; under DeepSpeed, in the dtype DeepSpeed holds the
    policy's weights in (bf16 mode casts the module itself, there is no autocast to share); unchanged under
    every other engine."""
    if module is None:
        return module
    if engine.kind == "deepspeed":
        return module.to(next(engine.module.parameters()).dtype)
    if engine.kind != "fsdp":
        return module
    from posttrain_trainer import fsdp

    return fsdp.shard(module, engine.mesh, engine.autocast_dtype == torch.bfloat16)


def gathered_parameters(engine: TrainEngine) -> contextlib.AbstractContextManager:
    """Collective (every rank enters it): under ZeRO-3 the full parameters are gathered on every rank for
    the duration (to save or merge weights); a no-op for every other engine."""
    if zero_stage(engine) < 3:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None)


def build_engine(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    parallel: ParallelConfig,
    *,
    grad_accum: int = 1,
    micro_batch: int = 1,
    max_grad_norm: float | None = 1.0,
) -> TrainEngine:
    """DeepSpeed ZeRO when parallel.use_deepspeed and it can run here, FSDP2 when parallel.fsdp under
    torchrun, else DDP (world > 1) or plain."""
    bf16 = use_bf16(parallel)
    if parallel.fsdp:
        if is_distributed():
            return _fsdp_engine(model, optimizer, scheduler, bf16, grad_accum, max_grad_norm)
        if is_main():
            print("[posttrain] FSDP requested but not launched under torchrun; training unsharded", flush=True)
    if parallel.use_deepspeed:
        ok, why = deepspeed_available()
        if ok:
            return _deepspeed_engine(
                model, optimizer, scheduler, parallel, bf16, grad_accum, micro_batch, max_grad_norm
            )
        if is_main():
            print(f"[posttrain] DeepSpeed requested but unavailable ({why}); using DDP", flush=True)
    model.to(device())
    autocast = torch.bfloat16 if bf16 else None
    if is_distributed() and world_size() > 1:
        from torch.nn.parallel import DistributedDataParallel

        kwargs = {"device_ids": [local_rank()]} if torch.cuda.is_available() else {}
        wrapped = DistributedDataParallel(model, **kwargs)
        return TrainEngine(
            wrapped,
            optimizer,
            scheduler,
            kind="ddp",
            grad_accum=grad_accum,
            max_grad_norm=max_grad_norm,
            autocast_dtype=autocast,
        )
    return TrainEngine(
        model,
        optimizer,
        scheduler,
        kind="single",
        grad_accum=grad_accum,
        max_grad_norm=max_grad_norm,
        autocast_dtype=autocast,
    )


def _deepspeed_engine(model, optimizer, scheduler, parallel, bf16, grad_accum, micro_batch, max_grad_norm):
    _prepare_deepspeed_cpu()
    import deepspeed

    stage = parallel.deepspeed_stage
    if bf16 and stage == 0:
        stage = 1  # bf16 gradients at stage 0 drift (docs/deepspeed-cpu.md)
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": bool(bf16)},
        "gradient_clipping": float(max_grad_norm or 0.0),
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
    config.update(parallel.deepspeed_config)
    model.to(device())
    engine, opt, _, sched = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=config, dist_init_required=False
    )
    return TrainEngine(
        engine, opt, sched, kind="deepspeed", grad_accum=grad_accum, max_grad_norm=max_grad_norm
    )


def _fsdp_engine(model, optimizer, scheduler, bf16, grad_accum, max_grad_norm):
    from posttrain_trainer import fsdp

    names = {id(p): name for name, p in model.named_parameters()}
    mesh = fsdp.mesh()
    fsdp.shard(model, mesh, bf16)
    fsdp.repoint_optimizer(optimizer, names, model)
    engine = TrainEngine(
        model,
        optimizer,
        scheduler,
        kind="fsdp",
        grad_accum=grad_accum,
        max_grad_norm=max_grad_norm,
        autocast_dtype=torch.bfloat16 if bf16 else None,
    )
    engine.mesh = mesh
    return engine
