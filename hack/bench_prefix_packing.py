"""Shared-prefix packing in the GSPO update: posttrain's update with rows packed by shared prefix (what RLRun
runs where prefix_packing.pack_policy allows) against the same update on plain right-padded rows (the
baseline), in the same process, on the same model, the same sampled batches, interleaved per batch (plain,
packed, plain, packed, ...; batch 0 is both sides' warm-up).

Shapes of `make demo` by default: SmolLM2-135M-Instruct with LoRA r16 on all linear layers, frozen weights
and autocast as posttrain.hardware decides for this CPU, 8 prompts x group 8 (math questions in the chat
template, ~46 prompt tokens), completions of 4-16 tokens, 2 mini-batches, micro-batches of 8 sequences.
Both sides start from the same weights (two copies loaded with the same seed) and update on identical data.

Timing: from handing the scored rollout batch to rl.gspo_update until it returns (collation and packing,
advantages, the old-logprob pass, forward, backward, AdamW). Printed: per side the median and spread of the
timed repeats, the forward positions each ran over (padded rows, or packed rows), and the ratio of the
medians of the update seconds plain / packed (> 1: packing faster); the losses of both sides agree to bf16
rounding (printed).

Not a test: `make bench`, or `.venv/bin/python hack/bench_prefix_packing.py [--repeats 6] [--micro-batch 8]`."""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from abtiming import Series, ratio_of_medians, spread_line, uptime
from bench_trainer_gspo import model_dir, sample_rollouts

REPO = Path(__file__).resolve().parents[1]


class Side:
    """One side's LoRA policy and rl.gspo_update, packed or plain."""

    def __init__(self, path: Path, args, precision: Any, pack: bool) -> None:
        import torch
        from posttrain_trainer import distributed as D
        from posttrain_trainer import prefix_packing, rl
        from posttrain_trainer.modeling import load_dtype, load_model_and_tokenizer
        from posttrain_trainer.optim import build_optimizer, build_scheduler
        from posttrain_trainer.rl_config import RLTrainerConfig

        lora = {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["all-linear"]}
        model, tokenizer = load_model_and_tokenizer(
            path, trainer_mode="lora", lora=lora, dtype=load_dtype(precision, "lora"), seed=0
        )
        for p in model.parameters():  # trained weights in fp32, as RLRun keeps them
            if p.requires_grad:
                p.data = p.data.float()
        self.cfg = RLTrainerConfig(
            batch_size=args.prompts, group_size=args.group, learning_rate=2e-4, num_minibatches=args.minibatches,
            micro_batch=args.micro_batch, skip_zero_advantage=False,
            parallel=D.ParallelConfig(bf16=None if args.precision == "auto" else False),
        )  # fmt: skip
        optimizer = build_optimizer(model, lr=self.cfg.learning_rate)
        scheduler = build_scheduler(
            optimizer, total_steps=(args.repeats + 1) * args.minibatches, name="constant"
        )
        self.engine = D.build_engine(model, optimizer, scheduler, self.cfg.parallel, max_grad_norm=1.0)
        self.engine.module.eval()
        self.pad_id = tokenizer.pad_token_id
        policy, self.line = prefix_packing.pack_policy(self.engine.module, vision=False)
        if pack and policy is None:
            raise SystemExit(f"this model does not pack: {self.line}")
        self.pack = policy if pack else None
        self.positions = 0
        self.args = args
        self._torch = torch
        self._rl = rl

    def update(self, rows: list[dict[str, Any]], iteration: int) -> tuple[float, dict[str, Any]]:
        from posttrain_trainer import gspo

        rl, torch = self._rl, self._torch
        collate = rl._collate
        positions = [0]

        def counted(seqs, pad_id, processor=None, pack=None):
            batch = collate(seqs, pad_id, processor, pack)
            ran = batch.packed.input_ids if batch.packed is not None else batch.input_ids
            positions[0] += ran.numel()
            return batch

        rl._collate = counted
        try:
            started = time.perf_counter()
            seqs = []
            for g, row in enumerate(rows):
                advantages = gspo.group_advantages(torch.tensor(row["rewards"]), self.args.group).tolist()
                for completion, reward, adv in zip(
                    row["completions"], row["rewards"], advantages, strict=True
                ):
                    seqs.append(
                        rl.TrainSeq(row["prompt_ids"], completion, [1] * len(completion), adv, reward, g)
                    )
            stats = rl.gspo_update(self.engine, copy.deepcopy(seqs), self.cfg, self.pad_id, iteration=iteration,
                                   pack=self.pack)  # fmt: skip
            seconds = time.perf_counter() - started
        finally:
            rl._collate = collate
        return seconds, {"tokens": int(stats["tokens"]), "positions": positions[0], "loss": stats["loss"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_prefix_packing")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument(
        "--repeats", type=int, default=6, help="timed rollout batches per side (after a warm-up)"
    )
    parser.add_argument("--prompts", type=int, default=8, help="prompts (groups) per rollout batch")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8, help="sequences per forward/backward")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                        help="auto: posttrain.hardware's decision for this CPU; fp32: no autocast, fp32 weights")  # fmt: skip
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    import torch
    from posttrain import hardware

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    precision = hardware.plan(None if args.precision == "auto" else False, lora_policy=True)
    machine = hardware.probe().describe()
    print(f"machine: {machine}; {os.cpu_count()} cores, torch {torch.get_num_threads()} threads; {uptime()}")
    print(f"precision (both sides): {precision.describe()}", flush=True)
    path = model_dir(args.model)
    batches = sample_rollouts(path, args)
    plain, packed = Side(path, args, precision, pack=False), Side(path, args, precision, pack=True)
    print(packed.line, flush=True)
    series = {"plain": Series("plain"), "packed": Series("packed")}
    positions: dict[str, list[int]] = {"plain": [], "packed": []}
    losses: dict[str, list[float]] = {"plain": [], "packed": []}
    for k, batch in enumerate(batches):
        for name, side in (("plain", plain), ("packed", packed)):
            seconds, stats = side.update(batch, k)
            if k == 0:
                continue  # warm-up
            series[name].add(seconds, stats["tokens"])
            positions[name].append(stats["positions"])
            losses[name].append(round(stats["loss"], 6))
        if k:
            print(f"batch {k}: plain {series['plain'].seconds[-1]:.2f} s, packed {series['packed'].seconds[-1]:.2f} s",
                  flush=True)  # fmt: skip
    if series["plain"].tokens != series["packed"].tokens:
        raise SystemExit("the two sides trained on different token counts")
    ratio = ratio_of_medians(series["plain"].seconds, series["packed"].seconds)
    summary = {
        "bench": "prefix_packing",
        "baseline": "plain right-padded rows (the same rl.gspo_update without packing)",
        "model": args.model,
        "machine": machine,
        "precision": precision.describe(),
        "rollout_batch": f"{args.prompts} prompts x {args.group}, completions {args.max_tokens // 4}-{args.max_tokens} tokens",
        "minibatches": args.minibatches,
        "micro_batch": args.micro_batch,
        "order": "interleaved per rollout batch: plain, packed, plain, packed, ... (batch 0 = warm-up)",
        "plain": {
            **series["plain"].as_dict(),
            "forward_positions": positions["plain"],
            "loss": losses["plain"],
        },
        "packed": {
            **series["packed"].as_dict(),
            "forward_positions": positions["packed"],
            "loss": losses["packed"],
        },
        "ratio_of_median_seconds_plain_over_packed": round(ratio, 3),
        "uptime": uptime(),
    }
    print(json.dumps(summary, indent=2))
    for name in ("plain", "packed"):
        s = series[name].as_dict()
        print(f"{name:>7}: {spread_line(s['seconds_summary'], 's', '.2f')}; forward positions per batch "
              f"{sorted(positions[name])[len(positions[name]) // 2]} (median)")  # fmt: skip
    print(
        f"GSPO update with shared-prefix packing: {ratio:.2f}x faster than plain rows (ratio of median seconds "
        f"over {args.repeats} interleaved repeats; {args.model} LoRA, {args.prompts}x{args.group} rollouts, "
        f"{args.minibatches} mini-batches of micro-batches of {args.micro_batch}, {precision.compute} compute; "
        f"{hardware.probe().cpu_model}, {os.cpu_count()} cores)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
