"""Retention on real S3 (SeaweedFS, 127.0.0.1): [training] keep_checkpoints and keep_weight_versions.

Checkpoints: the tiny model's engine saves steps 2..10 with keep 2 (and a step a dead job left incomplete);
after each save only the newest two complete checkpoints stay, the newest is never deleted, a resume reads
it, and nothing outside checkpoints/ is touched.

Weight versions: WeightSyncer (via s3) uploads versions 1..4 and POSTs them to the real rollout server
(posttrain_rollout.server on uvicorn, 127.0.0.1), which downloads each from SeaweedFS and reloads it on a
scripted upstream (no model needed for the file handling); after each sync only the newest `keep` versions
stay, locally and in S3, and the served version is never among the deleted ones."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn
from fastapi import FastAPI, Request
from posttrain import storage as s3
from posttrain.api.jobfile import JobFile
from posttrain.localhost import free_port
from posttrain_rollout.server import Proxy, create_app
from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer.distributed import ParallelConfig, build_engine
from posttrain_trainer.modeling import load_model_and_tokenizer
from posttrain_trainer.optim import build_optimizer, build_scheduler
from posttrain_trainer.weightsync import WeightSyncer


def _engine(model_dir: Path):
    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(model_dir, trainer_mode="full", seed=0)
    optimizer = build_optimizer(model, lr=1e-3)
    return build_engine(
        model, optimizer, build_scheduler(optimizer, total_steps=10), ParallelConfig()
    ), tokenizer


def _step(engine) -> None:
    ids = torch.randint(0, 400, (2, 8))
    engine.backward(engine.model(input_ids=ids, labels=ids).loss, boundary=True)
    engine.step()


def test_checkpoints_keep_the_newest(s3_env, tiny_model_dir, tmp_path):
    client = s3.client_from_env(s3_env.storage())
    bucket, prefix = s3_env.bucket, "jobs/test/retention-ckpt/"
    s3.put_bytes(client, bucket, prefix + "model/config.json", b"{}")  # outside checkpoints/: untouched
    engine, _ = _engine(tiny_model_dir)
    seen = []
    for step in (2, 4, 6, 8, 10):
        _step(engine)
        ckpt.save_checkpoint(
            engine, client=client, bucket=bucket, prefix=prefix, step=step, workdir=tmp_path, keep=2
        )
        keys = s3.list_prefix(client, bucket, prefix + "checkpoints/")
        seen.append(sorted({int(k.split("step-")[1].split("/")[0]) for k in keys}))
        if step == 4:  # a job that died while saving step 5 left it incomplete
            s3.put_bytes(client, bucket, ckpt.step_prefix(prefix, 5) + "model.pt", b"partial")
    assert seen == [[2], [2, 4], [4, 6], [6, 8], [8, 10]]
    assert ckpt.list_checkpoints(client, bucket, prefix) == [8, 10]
    assert s3.exists(client, bucket, prefix + "model/config.json")
    assert not (tmp_path / "checkpoints" / "step-10" / "rank-0").exists()  # no local copy left behind
    weights = {k: v.clone() for k, v in ckpt.trainable_state_dict(engine.module).items()}
    fresh, _ = _engine(tiny_model_dir)
    state = ckpt.load_checkpoint(
        fresh, client=client, bucket=bucket, prefix=prefix, step=10, workdir=tmp_path
    )
    assert state["step"] == 10
    for key, value in ckpt.trainable_state_dict(fresh.module).items():
        assert torch.equal(value, weights[key]), key
    # keep = 0 keeps every checkpoint
    ckpt.save_checkpoint(
        engine, client=client, bucket=bucket, prefix=prefix, step=12, workdir=tmp_path, keep=0
    )
    assert ckpt.list_checkpoints(client, bucket, prefix) == [8, 10, 12]


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


def scripted_upstream(reloads: list[str]) -> FastAPI:
    """The vLLM endpoints a weight sync calls; records which folder each reload read."""
    app = FastAPI()

    @app.post("/collective_rpc")
    async def rpc(request: Request) -> dict[str, Any]:
        body = await request.json()
        folder = Path(body["kwargs"]["weights_path"])
        assert (folder / "config.json").is_file() and any(folder.glob("*.safetensors")), folder
        reloads.append(folder.name)
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset() -> dict[str, Any]:
        return {}

    return app


@pytest.mark.parametrize("keep", [2, 1])
def test_weight_versions_keep_the_newest_and_the_served(s3_env, tiny_model_dir, tmp_path, keep):
    reloads: list[str] = []
    upstream, upstream_thread, upstream_url = _serve(scripted_upstream(reloads))
    proxy = Proxy(upstream_url, served_model_name="tiny", run_dir=tmp_path / "rollout")
    rollout, rollout_thread, rollout_url = _serve(create_app(proxy))
    prefix = f"jobs/test/retention-weights-{keep}/"
    try:
        job = JobFile(
            kind="rl",
            base_model="tiny",
            model_path=str(tiny_model_dir),
            config={"training": {"keep_weight_versions": keep}},
            endpoints={"policy": [rollout_url]},
            storage=s3_env.storage(prefix),
            weight_sync={"via": "s3", "shared_dir": str(tmp_path / "weights")},
            workdir=str(tmp_path / "work"),
        )
        client = s3.client_from_env(job.storage)
        engine, tokenizer = _engine(tiny_model_dir)
        syncer = WeightSyncer(job, client=client, dtype=torch.float32)
        assert syncer.keep == keep
        for version in range(1, 5):
            _step(engine)
            result = syncer.sync(engine.module, tokenizer, version)
            newest = list(range(max(1, version - keep + 1), version + 1))
            remote = sorted(
                {
                    int(k.split("weights/v")[1].split("/")[0])
                    for k in s3.list_prefix(client, s3_env.bucket, prefix + "weights/")
                }
            )
            local = sorted(
                int(p.name[1:]) for p in (tmp_path / "weights").iterdir() if p.name.startswith("v")
            )
            assert remote == newest and local == newest, (version, remote, local)
            assert version in remote and proxy.gate.version == version  # the served version stays
            assert result.pruned == ([version - keep] if version > keep else [])
        assert len(reloads) == 4
    finally:
        for server, thread in ((rollout, rollout_thread), (upstream, upstream_thread)):
            server.should_exit = True
            thread.join(10)
