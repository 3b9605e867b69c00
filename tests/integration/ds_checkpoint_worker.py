"""A DeepSpeed ZeRO checkpoint through real S3 and back, under torchrun: the worker of
test_trainer_checkpoint.py::test_deepspeed_checkpoint_resumes_without_pickle.

`python -m torch.distributed.run --nproc-per-node N ds_checkpoint_worker.py OUT STAGE PREFIX [tamper]`: two
steps, checkpoint (checkpoint.save_checkpoint), a fresh engine resumed from it (load_checkpoint: shards
checked against checksums.json and read with weights_only=True), then one more identical step on both;
rank 0 writes both losses to OUT (JSON). "tamper" flips a byte of one shard before the resume and writes
the error instead."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from posttrain import storage as s3
from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import distributed as D
from rl_update_worker import tiny_model


def build(stage: int) -> D.TrainEngine:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    parallel = D.ParallelConfig(use_deepspeed=True, deepspeed_stage=stage, bf16=False)
    return D.build_engine(model, optimizer, None, parallel, max_grad_norm=1.0, micro_batch=1)


def step(engine: D.TrainEngine, seed: int) -> float:
    torch.manual_seed(seed + D.rank())
    ids = torch.randint(0, 97, (1, 12))
    loss = engine.model(input_ids=ids, labels=ids).loss
    engine.backward(loss, boundary=True)
    engine.step()
    return float(loss.detach())


def main(out: str, stage: str, prefix: str, *flags: str) -> None:
    D.init_distributed()
    engine = build(int(stage))
    assert engine.kind == "deepspeed", engine.kind
    storage = {"endpoint": os.environ["S3_ENDPOINT"], "bucket": os.environ["S3_BUCKET"]}
    client = s3.client_from_env(storage)
    bucket = storage["bucket"]
    workdir = Path(out).parent / "work"
    for i in range(2):
        step(engine, i)
    ckpt.save_checkpoint(engine, client=client, bucket=bucket, prefix=prefix, step=2, workdir=workdir)
    files = json.loads(s3.get_bytes(client, bucket, ckpt.step_prefix(prefix, 2) + "checksums.json"))["files"]
    result: dict = {"files": sorted(files)}
    if "tamper" in flags and D.is_main():
        key = ckpt.step_prefix(prefix, 2) + max(f for f in files if f.startswith("deepspeed/"))
        data = bytearray(s3.get_bytes(client, bucket, key))
        data[len(data) // 2] ^= 0x01
        s3.put_bytes(client, bucket, key, bytes(data))
    D.barrier()
    fresh = build(int(stage))
    try:
        ckpt.load_checkpoint(fresh, client=client, bucket=bucket, prefix=prefix, step=2, workdir=workdir / "r")
    except ckpt.CheckpointIntegrityError as err:
        result["error"] = str(err)
    else:
        result["losses"] = [step(engine, 7), step(fresh, 7)]
    if D.is_main():
        Path(out).write_text(json.dumps(result))
    D.barrier()


if __name__ == "__main__":
    main(*sys.argv[1:])
