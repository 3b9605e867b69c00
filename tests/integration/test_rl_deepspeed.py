"""The GSPO update under DeepSpeed ZeRO-3: two processes (gloo, CPU) give the losses and parameters of one
process without DeepSpeed, over three updates of two optimizer steps each (a variable number of micro-batches
per step: four on one rank, two on each of two)."""

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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port", "0",
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
        assert torch.allclose(zero3["params"][name], p, atol=1e-5), name
    moved = max((one["params"][n] - p).abs().max().item() for n, p in one["initial"].items())
    assert moved > 1e-3  # the updates changed the weights: the comparison is not of two untouched models
