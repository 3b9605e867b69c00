"""Three GSPO updates (rl.gspo_update) on a tiny random Qwen2 built in memory, under torchrun: the worker of
test_rl_deepspeed.py and test_rl_fsdp.py.

`python -m torch.distributed.run --nproc-per-node N rl_update_worker.py OUT ENGINE [bf16] [resume]`, ENGINE
"ddp" (plain for one process), "ds3" (DeepSpeed ZeRO-3) or "fsdp" (FSDP2, with activation checkpointing);
"bf16" turns bf16 on (else fp32); "resume" (FSDP2) saves the full model and optimizer state after the second
update, builds a fresh model, engine and optimizer from them, and runs the third update on those; "beta" runs
two on-policy updates (one mini-batch) with a KL term against a frozen copy of the initial weights (sharded
like the policy under FSDP2) and writes their KL means instead; "pack" runs the three updates on groups that
share 9-token prompts, in micro-batches of 4 packed by shared prefix (prefix_packing), and writes how many
micro-batches of rank 0 packed. Otherwise the updates
use 8, 7 and 6 sequences in two mini-batches of micro-batches of one sequence: with two ranks, some
micro-batches of the later updates are empty on one rank. Rank 0 writes the losses and the final (gathered)
parameters to OUT (torch.save)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from posttrain_trainer import distributed as D
from posttrain_trainer import prefix_packing, rl
from posttrain_trainer.rl_config import RLTrainerConfig


def tiny_model() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def sequences(count: int = 8) -> list[rl.TrainSeq]:
    out = []
    for i in range(count):
        completion = [10 + (i * 13 + j * 7) % 80 for j in range(4 + i % 5)]
        advantage = [1.0, -0.5, 0.7, -1.2, 0.3, 0.9, -0.8, 0.4][i]
        out.append(rl.TrainSeq([3, 4, 5 + i % 3], completion, [1] * len(completion), advantage))
    return out


def grouped_sequences(count: int = 8) -> list[rl.TrainSeq]:
    """Two groups whose samples share a 9-token prompt (what shared-prefix packing is for)."""
    return [
        rl.TrainSeq([3, 4, 5, 6, 7, 8, 9, 10, 11 + i % 2], s.completion_ids, s.completion_mask, s.advantage)
        for i, s in enumerate(sequences(count))
    ]


def build(engine_kind: str, bf16: bool) -> D.TrainEngine:
    model = tiny_model()
    if engine_kind == "fsdp":
        model.gradient_checkpointing_enable()
    parallel = D.ParallelConfig(
        use_deepspeed=engine_kind == "ds3", deepspeed_stage=3, fsdp=engine_kind == "fsdp", bf16=bf16,
        force_bf16=bf16,  # bf16 mixed precision on any CPU (emulated, slow, where not native: a tiny model)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return D.build_engine(model, optimizer, None, parallel, max_grad_norm=1.0, micro_batch=1)


def checkpointed(engine: D.TrainEngine, folder: Path, bf16: bool) -> D.TrainEngine:
    """The engine rebuilt from the full state it saves (as checkpoint.py writes and reads it)."""
    from posttrain_trainer import fsdp
    from posttrain_trainer.safe_state import load_state, save_state, save_tensors
    from safetensors.torch import load_file

    weights = fsdp.full_model_state(engine.model)
    optim = fsdp.full_optimizer_state(engine.model, engine.optimizer)
    if D.is_main():
        save_tensors(weights, folder / "model.safetensors")
        save_state(optim, folder, "optimizer")
    D.barrier()
    fresh = build("fsdp", bf16)
    weights, optim = load_file(str(folder / "model.safetensors")), load_state(folder, "optimizer")
    fsdp.load_full_state(fresh.model, fresh.optimizer, weights, optim)
    return fresh


def kl_run(out: str, engine_kind: str, bf16: bool) -> None:
    """Two updates with beta > 0 against the initial weights: the first one's KL is exactly 0."""
    import copy

    engine = build(engine_kind, bf16)
    frozen = copy.deepcopy(tiny_model()).eval()
    for p in frozen.parameters():
        p.requires_grad_(False)
    cfg = RLTrainerConfig(
        num_minibatches=1, micro_batch=1, temperature=0.7, eps_low=0.2, eps_high=0.2, beta=0.1
    )
    ref_fn = rl.local_reference_fn(engine, D.shard_frozen(engine, frozen), cfg.temperature)
    kls = [
        rl.gspo_update(engine, sequences(7), cfg, pad_id=0, iteration=i, ref_fn=ref_fn)["kl"]
        for i in range(2)
    ]
    if D.is_main():
        torch.save({"kl": kls, "engine": engine.kind}, out)


def main(out: str, engine_kind: str, *flags: str) -> None:
    D.init_distributed()
    bf16 = "bf16" in flags
    if "beta" in flags:
        kl_run(out, engine_kind, bf16)
        D.barrier()
        D.shutdown()
        return
    initial = {name: p.detach().clone() for name, p in tiny_model().named_parameters()}
    engine = build(engine_kind, bf16)
    expected = {"ds3": "deepspeed", "fsdp": "fsdp"}.get(
        engine_kind, "ddp" if D.world_size() > 1 else "single"
    )
    assert engine.kind == expected, (engine.kind, expected)
    pack = "pack" in flags
    cfg = RLTrainerConfig(
        num_minibatches=2, micro_batch=4 if pack else 1, temperature=0.7, eps_low=0.2, eps_high=0.2
    )
    policy = prefix_packing.pack_policy(engine.module, vision=False)[0] if pack else None
    assert policy is not None or not pack
    plans: list[object] = []
    plan = prefix_packing.plan
    prefix_packing.plan = lambda *a, **k: plans.append(plan(*a, **k)) or plans[-1]  # counts rank 0's packing
    losses = []
    for i in range(3):
        if i == 2 and "resume" in flags:
            engine = checkpointed(engine, Path(out).parent, bf16)
        seqs = grouped_sequences(8 - i) if pack else sequences(8 - i)
        losses.append(rl.gspo_update(engine, seqs, cfg, pad_id=0, iteration=i, pack=policy)["loss"])
    with D.full_weights(engine) as state:
        if state is None:
            state = {name: p.detach().clone().cpu() for name, p in engine.module.named_parameters()}
    if D.is_main():
        params = {name: state[name].float() for name in initial}
        torch.save({"losses": losses, "params": params, "initial": initial, "engine": engine.kind,
                    "packed": sum(p is not None for p in plans)}, out)  # fmt: skip
    D.barrier()
    D.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
