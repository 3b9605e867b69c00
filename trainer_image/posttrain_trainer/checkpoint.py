"""Checkpoints in S3 under <prefix>checkpoints/step-N/ and resume from the latest one.

A checkpoint holds the trainable weights (full model, or only the LoRA adapter), optimizer and scheduler state,
the RNG states of every rank, the data position and the step. trainer_state.json is written last: a
checkpoint without it is incomplete (the job died while saving) and is ignored on resume.

DeepSpeed: every rank saves its own ZeRO shards with engine.save_checkpoint into a rank-local folder and
uploads them under step-N/deepspeed/; rank 0 adds the common files. FSDP2: the full model and optimizer
state are gathered onto rank 0, which writes them as model.safetensors / optimizer.* (optimizer state keyed
by parameter name); on resume every rank reads them and keeps its shards (fsdp.py).

Nothing is unpickled on resume (safe_state.py): weights are safetensors, optimizer / scheduler / RNG state
is safetensors plus JSON, and checksums.json (sha256 of every file, written before trainer_state.json) is
checked before any file is read. A checkpoint whose files differ from it fails the resume with
CheckpointIntegrityError. DeepSpeed's own shard files are torch.save archives: they are checked against
the same manifest and read with torch.load(weights_only=True) (tensors and plain data only).

Retention: [training] keep_checkpoints (job.settings.keep_checkpoints, default 3; 0 keeps every one). After a
checkpoint is complete, rank 0 deletes the complete checkpoints older than the newest `keep`, and the
incomplete ones older than the newest complete checkpoint (left by a job that died while saving). The newest
complete checkpoint, the one a resume reads, is never deleted. Local copies are removed right after upload."""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from posttrain import storage as s3
from safetensors.torch import load_file

from posttrain_trainer import distributed as D
from posttrain_trainer.safe_state import (
    MANIFEST_FILE,
    CheckpointIntegrityError,
    file_manifest,
    load_state,
    save_state,
    save_tensors,
    sha256_file,
    verify_files,
)

STATE_FILE = "trainer_state.json"
MODEL_FILE = "model.safetensors"
_STEP_RE = re.compile(r"checkpoints/step-(\d+)/")


def checkpoints_prefix(prefix: str) -> str:
    return f"{prefix}checkpoints/"


def step_prefix(prefix: str, step: int) -> str:
    return f"{prefix}checkpoints/step-{step}/"


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def tensor_fingerprint(obj: Any) -> str:
    """sha256 over every tensor/number in a nested state (optimizer state_dict): equal state -> equal print."""
    digest = hashlib.sha256()

    def visit(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(value.detach().cpu().contiguous().view(-1).to(torch.float64).numpy().tobytes())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                digest.update(str(key).encode())
                visit(value[key])
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        else:
            digest.update(repr(value).encode())

    visit(obj)
    return digest.hexdigest()


def optimizer_fingerprint(engine: D.TrainEngine) -> str:
    """Collective under FSDP2 (the state is gathered; "" on ranks other than 0)."""
    if engine.kind == "deepspeed":
        return ""  # sharded state lives inside DeepSpeed
    if engine.kind == "fsdp":
        from posttrain_trainer.fsdp import full_optimizer_state

        state = full_optimizer_state(engine.model, engine.optimizer)
        return tensor_fingerprint(state) if D.is_main() else ""
    return tensor_fingerprint(engine.optimizer.state_dict())


def trainable_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    full = module.state_dict()
    if len(trainable) == sum(1 for _ in module.parameters()):
        return {k: v.detach().cpu().clone() for k, v in full.items()}
    return {k: full[k].detach().cpu().clone() for k in trainable if k in full}


def _train_state(engine: D.TrainEngine) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainable weights, optimizer state) on rank 0, ({}, {}) elsewhere; collective under FSDP2."""
    if engine.kind == "fsdp":
        from posttrain_trainer import fsdp

        return fsdp.full_model_state(engine.model), fsdp.full_optimizer_state(engine.model, engine.optimizer)
    if not D.is_main():
        return {}, {}
    return trainable_state_dict(engine.module), engine.optimizer.state_dict()


def save_checkpoint(
    engine: D.TrainEngine,
    *,
    client,
    bucket: str,
    prefix: str,
    step: int,
    workdir: str | Path,
    data_state: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    keep: int = 0,
) -> str:
    """Collective: every rank calls it. Returns the s3:// URI of the checkpoint folder. keep > 0: then only
    the newest `keep` complete checkpoints stay (prune_checkpoints)."""
    key_prefix = step_prefix(prefix, step)
    local = Path(workdir) / "checkpoints" / f"step-{step}" / f"rank-{D.rank()}"
    if local.exists():
        shutil.rmtree(local)
    local.mkdir(parents=True, exist_ok=True)
    rngs = D.gather_objects(rng_state())
    fingerprint = ""

    files: list[str] = []  # rank-local files under `local`, uploaded under key_prefix
    if engine.kind == "deepspeed":
        engine.model.save_checkpoint(str(local / "deepspeed"), tag="state", save_latest=False)
        files = [p.relative_to(local).as_posix() for p in (local / "deepspeed").rglob("*") if p.is_file()]
    else:
        weights, optim = _train_state(engine)
        if D.is_main():
            fingerprint = tensor_fingerprint(optim)
            save_tensors(weights, local / MODEL_FILE)
            files = [MODEL_FILE, *save_state(optim, local, "optimizer")]
            if engine.scheduler is not None:
                files += save_state(engine.scheduler.state_dict(), local, "scheduler")
    if D.is_main():
        files += save_state(rngs, local, "rng")
    checksums = file_manifest(local, files)
    for name in checksums:
        s3.upload_file(client, local / name, bucket, key_prefix + name)
    every_rank = D.gather_objects(checksums)
    D.barrier()
    if D.is_main():
        manifest: dict[str, str] = {}
        for rank_files in every_rank:
            manifest.update(rank_files)
        (local / MANIFEST_FILE).write_text(json.dumps({"files": manifest}, sort_keys=True))
        s3.upload_file(client, local / MANIFEST_FILE, bucket, key_prefix + MANIFEST_FILE)
        state = {
            "step": step,
            "world_size": D.world_size(),
            "engine": engine.kind,
            "data": data_state or {},
            "optimizer_fingerprint": fingerprint,
            "checksums_sha256": sha256_file(local / MANIFEST_FILE),
            "saved_at": time.time(),
            **(extra or {}),
        }
        s3.put_json(client, bucket, key_prefix + STATE_FILE, state)  # last: marks the checkpoint complete
        if keep > 0:
            prune_checkpoints(client, bucket, prefix, keep)
    D.barrier()
    shutil.rmtree(local, ignore_errors=True)
    return s3.s3_uri(bucket, key_prefix)


def list_checkpoints(client, bucket: str, prefix: str) -> list[int]:
    """Steps of the complete checkpoints under <prefix>checkpoints/, ascending."""
    steps = set()
    for key in s3.list_prefix(client, bucket, checkpoints_prefix(prefix)):
        if key.endswith("/" + STATE_FILE):
            match = _STEP_RE.search(key)
            if match:
                steps.add(int(match.group(1)))
    return sorted(steps)


def checkpoints_to_delete(complete: list[int], started: list[int], keep: int) -> list[int]:
    """Steps to delete: complete ones older than the newest `keep`, incomplete ones older than the newest
    complete one. Never the newest complete step; keep <= 0 deletes nothing."""
    if keep <= 0 or not complete:
        return []
    newest = max(complete)
    kept = set(sorted(complete)[-keep:])
    doomed = {step for step in complete if step not in kept}
    doomed |= {step for step in started if step not in complete and step < newest}
    doomed.discard(newest)
    return sorted(doomed)


def prune_checkpoints(client, bucket: str, prefix: str, keep: int) -> list[int]:
    """Delete the checkpoints that checkpoints_to_delete names; returns their steps."""
    started = set()
    for key in s3.list_prefix(client, bucket, checkpoints_prefix(prefix)):
        match = _STEP_RE.search(key)
        if match:
            started.add(int(match.group(1)))
    doomed = checkpoints_to_delete(list_checkpoints(client, bucket, prefix), sorted(started), keep)
    for step in doomed:
        s3.delete_prefix(client, bucket, step_prefix(prefix, step))
    return doomed


def find_latest(client, bucket: str, prefix: str) -> int | None:
    steps = list_checkpoints(client, bucket, prefix)
    return steps[-1] if steps else None


def load_checkpoint(
    engine: D.TrainEngine, *, client, bucket: str, prefix: str, step: int, workdir: str | Path
) -> dict[str, Any]:
    """Collective. Restores weights, optimizer, scheduler and this rank's RNG; returns trainer_state.json."""
    key_prefix = step_prefix(prefix, step)
    where = f"checkpoint {s3.s3_uri(bucket, key_prefix)}"
    state = s3.get_json(client, bucket, key_prefix + STATE_FILE)
    local = Path(workdir) / "resume" / f"step-{step}" / f"rank-{D.rank()}"
    if local.exists():
        shutil.rmtree(local)
    local.mkdir(parents=True, exist_ok=True)
    manifest = _verified_manifest(client, bucket, key_prefix, local, state, where)
    wanted = {n: d for n, d in manifest.items() if n.startswith("deepspeed/") == (engine.kind == "deepspeed")}
    wanted.update({n: d for n, d in manifest.items() if n.startswith("rng.")})
    fetched = local / "files"
    for name in wanted:
        s3.download_file(client, s3.s3_uri(bucket, key_prefix + name), fetched / name)
    verify_files(fetched, wanted, where=where)  # before anything is read
    if engine.kind == "deepspeed":
        _load_deepspeed(engine, fetched / "deepspeed")
    else:
        weights = load_file(str(fetched / MODEL_FILE))
        optim = load_state(fetched, "optimizer")
        if engine.kind == "fsdp":
            from posttrain_trainer.fsdp import load_full_state

            load_full_state(engine.model, engine.optimizer, weights, optim)
        else:
            missing, unexpected = engine.module.load_state_dict(weights, strict=False)
            if unexpected or any(k in weights for k in missing):
                raise RuntimeError(
                    f"checkpoint step-{step} does not fit the model: unexpected={unexpected[:5]}"
                )
            engine.optimizer.load_state_dict(optim)
        if engine.scheduler is not None and (fetched / "scheduler.json").exists():
            engine.scheduler.load_state_dict(load_state(fetched, "scheduler"))
    rngs = load_state(fetched, "rng")
    set_rng_state(rngs[D.rank() % len(rngs)])
    D.barrier()
    shutil.rmtree(local, ignore_errors=True)
    state["resumed_optimizer_fingerprint"] = optimizer_fingerprint(engine)
    return state


def _verified_manifest(
    client, bucket: str, key_prefix: str, local: Path, state: dict[str, Any], where: str
) -> dict[str, str]:
    """checksums.json of a checkpoint, checked against the digest trainer_state.json recorded for it."""
    if not s3.exists(client, bucket, key_prefix + MANIFEST_FILE):
        raise CheckpointIntegrityError(
            f"{where} has no {MANIFEST_FILE}: it was written by an older posttrain (pickle files), which "
            "is never loaded; delete the checkpoint to start over"
        )
    path = s3.download_file(client, s3.s3_uri(bucket, key_prefix + MANIFEST_FILE), local / MANIFEST_FILE)
    if sha256_file(path) != state.get("checksums_sha256"):
        raise CheckpointIntegrityError(f"{where}: {MANIFEST_FILE} does not match {STATE_FILE}")
    try:
        files = json.loads(path.read_text())["files"]
    except (ValueError, KeyError, TypeError) as err:
        raise CheckpointIntegrityError(f"{where}: {MANIFEST_FILE} is malformed") from err
    if not isinstance(files, dict) or not files:
        raise CheckpointIntegrityError(f"{where}: {MANIFEST_FILE} lists no files")
    return files


def _deepspeed_data_classes() -> list[Any]:
    """The plain data classes DeepSpeed pickles into its ZeRO optimizer shards (found with
    torch.serialization.get_unsafe_globals_in_checkpoint on stage 2 and 3 checkpoints): allowed by name,
    nothing else."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def _load_deepspeed(engine: D.TrainEngine, folder: Path) -> None:
    """DeepSpeed reads its shards through its checkpoint engine with torch.load(weights_only=False);
    here that engine reads them with weights_only=True (tensors, plain containers and the data classes
    above: no code)."""
    ds_engine = engine.model.checkpoint_engine
    original = ds_engine.load
    allowed = _deepspeed_data_classes()

    def load(path, map_location=None):
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)

    ds_engine.load = load
    try:
        engine.model.load_checkpoint(str(folder), tag="state")
    finally:
        ds_engine.load = original


def checkpoint_summary(state: dict[str, Any]) -> str:
    return json.dumps({k: state[k] for k in ("step", "world_size", "engine") if k in state})
