"""The GSPO update under DeepSpeed ZeRO-3: two processes (gloo, CPU) give the losses and parameters of one
process without DeepSpeed, over three updates of two optimizer steps each (a variable number of micro-batches
per step: two on one rank, one on each of two): losses to 1e-5, parameters to 5e-5."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("rl_update_worker.py")


def _run(out: Path, nproc: int, engine: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--standalone",
           str(WORKER), str(out), engine]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return torch.load(out)


def test_zero3_two_ranks_match_one_rank(tmp_path):
    one = _run(tmp_path / "one.pt", 1, "ddp")
    zero3 = _run(tmp_path / "zero3.pt", 2, "ds3")
    assert (one["engine"], zero3["engine"]) == ("single", "deepspeed")
    assert zero3["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert one["params"].keys() == zero3["params"].keys()
    for name, p in one["params"].items():
        # AdamW divides by the root of tiny second moments: measured 1.1e-5 apart, against moves of 6e-2
        assert torch.allclose(zero3["params"][name], p, atol=5e-5), name
    moved = max((one["params"][n] - p).abs().max().item() for n, p in one["initial"].items())
    assert moved > 1e-3  # the updates changed the weights: the comparison is not of two untouched models


def _trainer_run(tmp: Path, model_dir: Path, taskapp, storage: dict, nproc: int, parallelism: dict | None):
    """The RL trainer process (torchrun for nproc > 1) for 3 iterations against the real rollout server in
    front of the scripted model and judge of test_rl_trainer_rollouts; returns the final model's and the
    last served weight version's tensors."""
    import json

    from posttrain_rollout.server import Proxy, create_app
    from safetensors.torch import load_file
    from test_rl_trainer_rollouts import Scripted, _job, _serve

    tmp.mkdir(parents=True)
    scripted = Scripted()
    model, model_thread, model_url = _serve(scripted.model)
    proxy = Proxy(model_url, served_model_name="tiny", run_dir=tmp / "rollout")
    rollout, rollout_thread, rollout_url = _serve(create_app(proxy))
    judge, judge_thread, judge_url = _serve(scripted.judge)
    try:
        job_path = _job(tmp, model_dir, taskapp, rollout_url, judge_url, storage)
        job = json.loads(job_path.read_text())
        training = job["config"]["training"]
        training.update(overlong="keep", keep_weight_versions=1, parallelism=parallelism, learning_rate=1e-2)
        job_path.write_text(json.dumps(job))
        env = {**os.environ, "ENVIRONMENT_API_KEY": taskapp.api_key, "OMP_NUM_THREADS": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                  "--standalone", "-m"] if nproc > 1 else [sys.executable, "-m"]  # fmt: skip
        out = subprocess.run(
            [*launch, "posttrain_trainer", "rl", "--config", str(job_path)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
    finally:
        for server, thread in ((rollout, rollout_thread), (judge, judge_thread), (model, model_thread)):
            server.should_exit = True
            thread.join(10)
    assert "fine_tuned_model" in out.stdout and scripted.reloads == ["v1", "v2"]
    served = load_file(next((tmp / "weights" / "v2").glob("*.safetensors")))
    final = load_file(tmp / "work" / "final" / "model.safetensors")
    return served, final


def test_trainer_zero3_two_ranks_serves_and_saves_what_one_rank_trains(
    s3_env, tiny_model_dir, math_taskapp, tmp_path
):
    """`python -m posttrain_trainer rl` full fine-tuning, 1 process vs 2 ranks under ZeRO-3 on the same
    rollouts: the weights synced to the rollout server (gathered from the shards) and the final model agree
    (bf16 on disk: to a rounding step), and both moved away from the base."""
    from safetensors.torch import load_file

    storage = s3_env.storage()
    one = _trainer_run(tmp_path / "one", tiny_model_dir, math_taskapp, storage, 1, None)
    zero3 = _trainer_run(tmp_path / "zero3", tiny_model_dir, math_taskapp, storage, 2,
                         {"use_deepspeed": True, "deepspeed_stage": 3})  # fmt: skip
    base = load_file(next(tiny_model_dir.glob("*.safetensors")))
    (served_one, final_one), (served_z3, final_z3) = one, zero3
    for a, b in ((served_one, served_z3), (final_one, final_z3)):
        assert a.keys() == b.keys()
        for key in a:  # bf16 on disk: equal to about one rounding step (2^-8 relative)
            assert torch.allclose(a[key].float(), b[key].float(), atol=1e-3, rtol=8e-3), key
    moved = max((final_one[k].float() - base[k].float()).abs().max().item() for k in final_one if k in base)
    assert moved > 1e-2  # three AdamW steps at lr 1e-2: far more than the tolerance above
