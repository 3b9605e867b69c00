"""`posttrain train --local --type rl --nproc-per-node 2` with full fine-tuning sharded over the two trainer
ranks (DeepSpeed ZeRO-3, and FSDP2): the job completes and prints its fine_tuned_model, and the weights the rollout
server was last given (gathered from the shards at the final evaluation's weight sync) are exactly the saved
final model's, with every tensor at its full shape and moved by training (the overlong penalty gives the
random model's groups different rewards)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.tiny_rl import tiny_rl_toml

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

# The random model never solves a problem (reward 0): a response cut at max_tokens loses 1, one that ends
# on its own keeps 0, so most groups carry a gradient and the weights move.
MORE = """overlong = "penalty"

[training.parallelism]
{parallelism}

[evaluation]
instances = 1
every_n_iters = 2
seeds = [100]
"""

# engine -> ([training.parallelism], the engine the trainer reports)
SHARDED = {
    "zero3": ("use_deepspeed = true\ndeepspeed_stage = 3", "deepspeed"),
    "fsdp": ("fsdp = true", "fsdp"),
}


@pytest.fixture(scope="module")
def vllm_tiny_dir() -> Path:
    """The tiny random Qwen2 with head_dim 32 (vLLM's CPU attention rejects head_dim 16)."""
    from posttrain.modelzoo import build_tiny_model

    return build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)


@pytest.mark.parametrize("engine", sorted(SHARDED))
def test_rl_local_two_ranks_sharded_serves_what_it_trains(engine, vllm_tiny_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    toml = tmp_path / "rl.toml"
    more = MORE.format(parallelism=SHARDED[engine][0])
    toml.write_text(tiny_rl_toml(label=f"rl-{engine}", trainer_mode="full", group_size=4, max_tokens=32,
                                 learning_rate="1e-3", more=more))  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
    done = subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--runs-dir", str(tmp_path / "runs"),
         "--type", "rl", "--config", str(toml), "--nproc-per-node", "2", "--model-path", str(vllm_tiny_dir)],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^\s+step 2/2\s+mean_return [0-9.]+", out, re.M), out
    assert re.search(rf"^fine_tuned_model: rl:posttrain/tiny-random-qwen2:local\.rl-{engine}\.[0-9a-f]{{8}}$",
                     out, re.M), out  # fmt: skip
    run_dir = Path(re.search(r"run folder (\S+)", out).group(1))
    manifest = (run_dir / "work" / "manifest.json").read_text()
    assert f'"engine": "{SHARDED[engine][1]}"' in manifest and '"world_size": 2' in manifest, manifest
    # v1 after iteration 1, v2 (the final weights) before the final evaluation (every_n_iters = 2 = the
    # iteration count: no evaluation in between)
    served = load_file(next((run_dir / "weights" / "v2").glob("*.safetensors")))
    final = load_file(run_dir / "work" / "final" / "model.safetensors")
    base = load_file(next(vllm_tiny_dir.glob("*.safetensors")))
    assert served.keys() == final.keys() and set(final) <= set(base)
    for key, tensor in final.items():
        assert tensor.shape == base[key].shape, key  # gathered, not one rank's shard
        assert torch.equal(served[key].to(tensor.dtype), tensor), key  # fp32 served without native bf16
    moved = max((final[k].float() - base[k].float()).abs().max().item() for k in final)
    assert moved > 1e-3, "no group had mixed rewards in two iterations (rare: most groups of 4 are mixed)"
