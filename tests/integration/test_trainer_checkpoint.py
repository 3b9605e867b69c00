"""Checkpoint round trip through real S3, and LoRA save/merge on the tiny model (single process)."""

from __future__ import annotations

import json
import random

import pytest
import torch
from posttrain import storage as s3
from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer.distributed import ParallelConfig, build_engine
from posttrain_trainer.modeling import (
    load_model_and_tokenizer,
    merge_to_full_state_dict,
    save_final,
    save_merged,
)
from posttrain_trainer.optim import build_optimizer, build_scheduler


def _engine(model_dir, mode):
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(model_dir, trainer_mode=mode, lora={"r": 4, "alpha": 8}, seed=0)
    opt = build_optimizer(model, lr=1e-3, weight_decay=0.01)
    sched = build_scheduler(opt, total_steps=10, warmup_ratio=0.2)
    return build_engine(model, opt, sched, ParallelConfig()), tok


def _train(engine, steps):
    for _ in range(steps):
        ids = torch.randint(0, 400, (2, 12))
        loss = engine.model(input_ids=ids, labels=ids).loss
        engine.backward(loss, boundary=True)
        engine.step()


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_checkpoint_roundtrip(s3_env, tiny_model_dir, tmp_path, mode):
    client = s3.client_from_env(s3_env.storage())
    prefix = f"jobs/test/ckpt-{mode}/"
    engine, _ = _engine(tiny_model_dir, mode)
    _train(engine, 3)
    saved_weights = {k: v.clone() for k, v in ckpt.trainable_state_dict(engine.module).items()}
    saved_fp = ckpt.optimizer_fingerprint(engine)
    saved_lr = engine.current_lr()
    random.seed(7)
    torch.manual_seed(7)
    uri = ckpt.save_checkpoint(
        engine,
        client=client,
        bucket=s3_env.bucket,
        prefix=prefix,
        step=3,
        workdir=tmp_path,
        data_state={"epoch": 0, "index": 6},
    )
    expected_draw = torch.rand(3)
    assert uri.endswith(f"{prefix}checkpoints/step-3/")
    # an incomplete checkpoint (no trainer_state.json) is ignored
    s3.put_bytes(client, s3_env.bucket, prefix + "checkpoints/step-9/model.pt", b"partial")
    assert ckpt.find_latest(client, s3_env.bucket, prefix) == 3

    fresh, _ = _engine(tiny_model_dir, mode)
    assert ckpt.optimizer_fingerprint(fresh) != saved_fp
    state = ckpt.load_checkpoint(
        fresh, client=client, bucket=s3_env.bucket, prefix=prefix, step=3, workdir=tmp_path
    )
    assert state["step"] == 3 and state["data"] == {"epoch": 0, "index": 6}
    assert state["resumed_optimizer_fingerprint"] == saved_fp == state["optimizer_fingerprint"]
    assert fresh.current_lr() == pytest.approx(saved_lr)
    for key, value in ckpt.trainable_state_dict(fresh.module).items():
        assert torch.equal(value, saved_weights[key]), key
    assert torch.equal(torch.rand(3), expected_draw)  # RNG restored
    # both continue identically
    torch.manual_seed(1)
    _train(engine, 1)
    torch.manual_seed(1)
    _train(fresh, 1)
    for key, value in ckpt.trainable_state_dict(fresh.module).items():
        assert torch.allclose(value, ckpt.trainable_state_dict(engine.module)[key], atol=1e-7), key


def test_lora_merge_matches_adapter_outputs(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    engine, tok = _engine(tiny_model_dir, "lora")
    _train(engine, 3)  # make the adapter non-zero
    model = engine.module.eval()
    ids = torch.randint(0, 400, (1, 10))
    with torch.no_grad():
        want = model(input_ids=ids).logits
    state = merge_to_full_state_dict(model, dtype=torch.float32)
    assert not any("lora" in k or "base_layer" in k for k in state)
    merged_dir = save_merged(model, tok, tmp_path / "merged", dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        got = plain(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-4)
    with torch.no_grad():  # the peft model is unchanged (unmerged again)
        assert torch.equal(model(input_ids=ids).logits, want)
    # adapter + base reference round trip: loading the adapter folder gives the merged model
    final = save_final(
        model,
        tok,
        tmp_path / "final",
        base_model="posttrain/tiny-random-qwen2",
        base_model_path=str(tiny_model_dir),
    )
    assert (final / "adapter_config.json").exists()
    assert (
        json.loads((final / "posttrain-base.json").read_text())["base_model"] == "posttrain/tiny-random-qwen2"
    )
    reloaded, _ = load_model_and_tokenizer(final, trainer_mode="full")
    with torch.no_grad():
        assert torch.allclose(reloaded.eval()(input_ids=ids).logits, want, atol=1e-4)


def _saved(s3_env, tiny_model_dir, tmp_path, prefix):
    client = s3.client_from_env(s3_env.storage())
    engine, _ = _engine(tiny_model_dir, "full")
    _train(engine, 2)
    ckpt.save_checkpoint(
        engine, client=client, bucket=s3_env.bucket, prefix=prefix, step=2, workdir=tmp_path / "save"
    )
    return client


def test_checkpoint_files_are_data_only_and_listed(s3_env, tiny_model_dir, tmp_path):
    """No pickle archives in a checkpoint: safetensors + JSON, every file in checksums.json."""
    prefix = "jobs/test/ckpt-files/"
    client = _saved(s3_env, tiny_model_dir, tmp_path, prefix)
    keys = {k.rsplit("/", 1)[1] for k in s3.list_prefix(client, s3_env.bucket, prefix + "checkpoints/step-2/")}
    assert not any(k.endswith((".pt", ".pkl", ".bin")) for k in keys), keys
    listed = json.loads(s3.get_bytes(client, s3_env.bucket, prefix + "checkpoints/step-2/checksums.json"))
    assert set(listed["files"]) == keys - {"checksums.json", "trainer_state.json"}
    assert {"model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.json"} <= keys


@pytest.mark.parametrize(
    "target", ["model.safetensors", "optimizer.safetensors", "optimizer.json", "rng.json", "checksums.json"]
)
def test_tampered_checkpoint_fails_resume(s3_env, tiny_model_dir, tmp_path, target):
    """A file changed after the save (someone with write access to the job's folder) fails the resume
    with a clear error before anything is loaded."""
    prefix = f"jobs/test/ckpt-tampered-{target.replace('.', '-')}/"
    client = _saved(s3_env, tiny_model_dir, tmp_path, prefix)
    key = prefix + "checkpoints/step-2/" + target
    data = bytearray(s3.get_bytes(client, s3_env.bucket, key))
    data[-2] ^= 0x01  # one bit in the file's tail
    s3.put_bytes(client, s3_env.bucket, key, bytes(data))
    fresh, _ = _engine(tiny_model_dir, "full")
    before = {k: v.clone() for k, v in ckpt.trainable_state_dict(fresh.module).items()}
    with pytest.raises(ckpt.CheckpointIntegrityError, match=r"step-2/.*does not match"):
        ckpt.load_checkpoint(
            fresh, client=client, bucket=s3_env.bucket, prefix=prefix, step=2, workdir=tmp_path / "load"
        )
    for key_name, value in ckpt.trainable_state_dict(fresh.module).items():
        assert torch.equal(value, before[key_name]), key_name  # nothing was loaded


def test_pickle_checkpoint_is_never_loaded(s3_env, tiny_model_dir, tmp_path):
    """A checkpoint of pickle files (an older format, or planted) is refused, and its pickle never runs."""
    prefix = "jobs/test/ckpt-pickle/"
    client = s3.client_from_env(s3_env.storage())
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("ran",))

    for name in ("model.pt", "optimizer.pt", "rng.pt"):
        local = tmp_path / name
        torch.save({"x": Payload()}, local)
        s3.upload_file(client, local, s3_env.bucket, prefix + "checkpoints/step-1/" + name)
    s3.put_json(client, s3_env.bucket, prefix + "checkpoints/step-1/trainer_state.json", {"step": 1})
    fresh, _ = _engine(tiny_model_dir, "full")
    with pytest.raises(ckpt.CheckpointIntegrityError, match="checksums.json"):
        ckpt.load_checkpoint(
            fresh, client=client, bucket=s3_env.bucket, prefix=prefix, step=1, workdir=tmp_path / "load"
        )
    assert not marker.exists()


def test_deepspeed_checkpoint_resumes_without_pickle(s3_env, tmp_path):
    """ZeRO shards are torch.save archives written by DeepSpeed: they are listed in checksums.json and read
    back with weights_only=True; the resumed engine continues exactly as the saved one, and a flipped byte
    in a shard fails the resume. Stage 2: its optimizer shards hold every DeepSpeed class stage 3's do."""
    stage = 2
    import os
    import subprocess
    import sys
    from pathlib import Path

    worker = Path(__file__).with_name("ds_checkpoint_worker.py")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "S3_BUCKET": s3_env.bucket,
           "PYTHONPATH": os.pathsep.join([str(worker.parent), os.environ.get("PYTHONPATH", "")])}  # fmt: skip

    def run(out, *flags):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
               str(worker), str(out), str(stage), f"jobs/test/ds{stage}-{len(flags)}/", *flags]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
        return json.loads(Path(out).read_text())

    result = run(tmp_path / "ok.json")
    assert any(f.startswith("deepspeed/") for f in result["files"]) and "rng.json" in result["files"]
    saved, resumed = result["losses"]
    assert resumed == pytest.approx(saved, abs=1e-6)
    tampered = run(tmp_path / "tampered.json", "tamper")
    assert "does not match the checksum" in tampered["error"]


def test_pickled_model_weights_are_never_loaded(tiny_model_dir, tmp_path):
    """A model folder (model.source, a base in S3) whose weights are a pickle (pytorch_model.bin) is refused
    by the trainer, and the pickle never runs."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    for path in folder.glob("*.safetensors*"):
        path.unlink()
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (marker.write_text, ("ran",))

    torch.save({"model.embed_tokens.weight": Payload()}, folder / "pytorch_model.bin")
    with pytest.raises(OSError, match="safetensors"):
        load_model_and_tokenizer(folder, trainer_mode="full", seed=0)
    assert not marker.exists()
