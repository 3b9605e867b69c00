"""SFT throughput of posttrain_trainer vs TRL's SFTTrainer, in the same process, same model, data and batch.

Both train fp32 on this machine's device (CPU here), batch B, no accumulation, AdamW, linear schedule, loss on
the completion (assistant) tokens only, no packing. Throughput = non-padding input tokens / seconds of
optimizer steps, the first step (warm-up) excluded. Printed as a ratio posttrain / TRL (> 1: faster).
posttrain sorts each global batch by length before cutting micro-batches (less padding); TRL pads each
batch as it comes. Not a test: `make bench` or `.venv/bin/python hack/bench_trainer_sft.py [--model tiny]`."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def make_rows(n: int, seed: int = 0) -> list[dict]:
    """Chat rows of varied length (so padding matters), single turn."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(0, 99), rng.randint(0, 9)
        detail = " ".join(f"Step {i}: add {i} to the running total." for i in range(rng.randint(0, 12)))
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": f"What is {a} + {b}? {detail}".strip()},
                    {"role": "assistant", "content": f"{detail} The answer is {a + b}.".strip()},
                ]
            }
        )
    return rows


def model_dir(which: str) -> Path:
    from posttrain.modelzoo import build_tiny_model, convert_smollm2

    if which == "tiny":
        return build_tiny_model(REPO / ".models" / "tiny-random-qwen2")
    return convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")


def bench_posttrain(path: Path, rows: list[dict], args, work: Path) -> dict:
    import torch
    from posttrain.api.jobfile import JobFile
    from posttrain_trainer.sft import train

    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = JobFile.model_validate(
        {
            "kind": "sft",
            "base_model": "bench",
            "model_path": str(path),
            "dataset": {"train": str(data)},
            "config": {
                "hyperparameters": {
                    "n_epochs": 1,
                    "total_steps": args.steps,
                    "per_device_batch": args.batch,
                    "learning_rate": args.lr,
                    "sequence_length": args.seq,
                    "max_grad_norm": 1.0,
                    "seed": 42,
                },
                "training": {"mode": "full_finetune"},
            },
            "report": {"mode": "file", "path": str(work / "report.jsonl")},
            "workdir": str(work / "pt"),
        }
    )
    torch.manual_seed(0)
    train(job)
    history = [json.loads(line) for line in (work / "pt" / "metrics.jsonl").read_text().splitlines()]
    steps = [h for h in history if "tokens_per_second" in h]
    timed = steps[1:]
    seconds, tokens = sum(h["step_seconds"] for h in timed), sum(h["seen_tokens"] for h in timed)
    return {
        "tokens_per_second": tokens / seconds,
        "steps": len(steps),
        "first_loss": steps[0]["loss"],
        "last_loss": steps[-1]["loss"],
        "timed_tokens": tokens,
        "timed_seconds": seconds,
    }


def bench_trl(path: Path, rows: list[dict], args, work: Path) -> dict:
    import torch
    from datasets import Dataset
    from posttrain_trainer.modeling import load_tokenizer
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    tokenizer = load_tokenizer(path)
    data = Dataset.from_list([{"prompt": r["messages"][:-1], "completion": r["messages"][-1:]} for r in rows])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)

    class Timer(TrainerCallback):
        def __init__(self):
            self.steps: list[tuple[float, int]] = []
            self._t0 = 0.0
            self._tokens0 = 0

        def on_step_begin(self, targs, state, control, **kw):
            self._t0 = time.perf_counter()
            self._tokens0 = state.num_input_tokens_seen

        def on_step_end(self, targs, state, control, **kw):
            self.steps.append((time.perf_counter() - self._t0, state.num_input_tokens_seen - self._tokens0))

    timer = Timer()
    config = SFTConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        max_grad_norm=1.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        max_length=args.seq,
        packing=False,
        completion_only_loss=True,
        seed=42,
        include_num_input_tokens_seen="non_padding",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    timed = timer.steps[1:]
    seconds, tokens = sum(s for s, _ in timed), sum(t for _, t in timed)
    return {
        "tokens_per_second": tokens / seconds,
        "steps": len(timer.steps),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "timed_tokens": tokens,
        "timed_seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_trainer_sft")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-5)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    path = model_dir(args.model)
    rows = make_rows(args.steps * args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-sft-") as tmp:
        work = Path(tmp)
        ours = bench_posttrain(path, rows, args, work)
        trl = bench_trl(path, rows, args, work)
    ratio = ours["tokens_per_second"] / trl["tokens_per_second"]
    device = "cuda" if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()} threads"
    print(
        json.dumps(
            {
                "bench": "sft",
                "model": args.model,
                "device": device,
                "batch": args.batch,
                "steps": args.steps,
                "posttrain": ours,
                "trl": trl,
            },
            indent=2,
        )
    )
    print(
        f"SFT throughput posttrain/TRL = {ratio:.2f}x ({ours['tokens_per_second']:.0f} vs "
        f"{trl['tokens_per_second']:.0f} tokens/s, {args.model}, batch {args.batch}, {device})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
