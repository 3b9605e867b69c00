"""Two GSPO updates (rl.gspo_update) on a tiny random Qwen2 built in memory, under torchrun: the worker of
test_rl_deepspeed.py. `python -m torch.distributed.run --nproc-per-node N rl_update_worker.py OUT ENGINE`,
ENGINE "ddp" (plain for one process) or "ds3" (DeepSpeed ZeRO-3). Rank 0 writes the losses and the final
(gathered) parameters to OUT (torch.save)."""

from __future__ import annotations

import sys

import torch
from posttrain_trainer import distributed as D
from posttrain_trainer import rl
from posttrain_trainer.rl_config import RLTrainerConfig


def tiny_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def sequences() -> list[rl.TrainSeq]:
    out = []
    for i in range(8):
        completion = [10 + (i * 13 + j * 7) % 80 for j in range(4 + i % 5)]
        advantage = [1.0, -0.5, 0.7, -1.2, 0.3, 0.9, -0.8, 0.4][i]
        out.append(rl.TrainSeq([3, 4, 5 + i % 3], completion, [1] * len(completion), advantage))
    return out


def main(out: str, engine_kind: str) -> None:
    D.init_distributed()
    model = tiny_model()
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    parallel = D.ParallelConfig(use_deepspeed=engine_kind == "ds3", deepspeed_stage=3, bf16=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    engine = D.build_engine(model, optimizer, None, parallel, max_grad_norm=1.0, micro_batch=2)
    assert engine.kind == (
        "deepspeed" if engine_kind == "ds3" else ("ddp" if D.world_size() > 1 else "single")
    )
    cfg = RLTrainerConfig(num_minibatches=2, micro_batch=2, temperature=0.7, eps_low=0.2, eps_high=0.2)
    losses = [rl.gspo_update(engine, sequences(), cfg, pad_id=0, iteration=i)["loss"] for i in range(3)]
    with D.gathered_parameters(engine):
        params = {name: p.detach().clone().cpu() for name, p in engine.module.named_parameters()}
    if D.is_main():
        torch.save({"losses": losses, "params": params, "initial": initial, "engine": engine.kind}, out)
    D.barrier()
    D.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
