"""Peak memory of one GSPO update (rl.gspo_update), before and after the trainer's memory work, on
SmolLM2-135M-Instruct (vocabulary 49,152, 30 layers) with 8 sequences x 1,024 completion tokens.

- before: the update as it was: the model in eval() (so gradient checkpointing, although enabled, keeps
  every activation), and per-token logprobs from full-vocabulary fp32 logits of every completion position
  at once, plus the temperature-scaled copy and the log-sum-exp over them (reconstructed here as
  `legacy_token_logprobs`).
- after: the trainer's code: train mode with dropout off (checkpointing recomputes), and the chunked,
  checkpointed log-softmax (posttrain_trainer.logprobs, 128 MiB of fp32 logits per chunk).
Both: full fine-tuning, fp32 weights (this probe's decision on a CPU without native bf16; the script says
which), AdamW state allocated by a warm-up update first, one mini-batch of micro-batches of `--micro`
sequences, temperature 0.7, gradient checkpointing on.

Measured: the process's resident set (RSS). Each variant runs in its own process; the kernel's peak-RSS
counter (VmHWM) is reset (`5 > /proc/self/clear_refs`) just before the measured update and read after it.
Printed: RSS before the update (weights, gradients' storage freed, Adam state), the peak during it, the
update's own peak (peak - before) and the ratio before/after of the update's own peak.

Not a test: `.venv/bin/python hack/bench_trainer_memory.py [--micro 4] [--completion 1024]`. Run it alone
(under the heavy lock where machines are shared): other processes do not change RSS, but swap would."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def legacy_token_logprobs(
    model, input_ids, attention_mask, *, temperature=1.0, autocast=None, first_target=0, **_ignored
):
    """The per-token logprobs as the trainer computed them before: full logits of every kept position."""
    import contextlib

    width = input_ids.shape[1]
    first_target = max(0, min(int(first_target), width - 1))
    kwargs = {"logits_to_keep": width - first_target} if first_target else {}
    with autocast or contextlib.nullcontext():
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
    logits = out.logits[:, -(width - first_target) :, :][:, :-1, :].float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, first_target + 1 :].unsqueeze(-1)
    import torch

    picked = torch.gather(logits, -1, targets).squeeze(-1)
    values = picked - torch.logsumexp(logits, dim=-1)
    if not first_target:
        return values
    full = values.new_zeros((input_ids.shape[0], width - 1))
    full[:, first_target:] = values
    return full


def run_variant(args) -> dict:
    import random

    import torch
    from posttrain.modelzoo import convert_smollm2
    from posttrain_trainer import distributed as D
    from posttrain_trainer import gspo, rl
    from posttrain_trainer.modeling import load_dtype, load_model_and_tokenizer
    from posttrain_trainer.rl_config import RLTrainerConfig

    torch.manual_seed(0)
    path = convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    parallel = D.ParallelConfig(activation_checkpointing=True)
    precision = parallel.precision()
    model, tokenizer = load_model_and_tokenizer(
        path,
        trainer_mode="full",
        dtype=load_dtype(precision, "full"),
        gradient_checkpointing=True,
        seed=0,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    engine = D.build_engine(model, optimizer, None, parallel, max_grad_norm=1.0)
    if args.variant == "before":
        gspo.token_logprobs = legacy_token_logprobs
        rl.train_without_dropout = lambda module: module.eval()
    rng = random.Random(0)
    vocab = model.config.vocab_size

    def seqs(n: int, completion: int) -> list[rl.TrainSeq]:
        out = []
        for i in range(n):
            prompt = [rng.randrange(vocab) for _ in range(args.prompt)]
            tokens = [rng.randrange(vocab) for _ in range(completion)]
            out.append(rl.TrainSeq(prompt, tokens, [1] * completion, advantage=(-1.0) ** i))
        return out

    cfg = RLTrainerConfig(num_minibatches=1, micro_batch=args.micro, temperature=0.7)
    rl.gspo_update(engine, seqs(2, 8), cfg, pad_id=0)  # warm-up: AdamW state exists from here on
    batch = seqs(args.sequences, args.completion)
    before = rss_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")
    started = time.perf_counter()
    update = rl.gspo_update(engine, batch, cfg, pad_id=0)
    seconds = time.perf_counter() - started
    peak = rss_kib("VmHWM")
    return {
        "variant": args.variant,
        "dtype": str(next(model.parameters()).dtype),
        "precision": precision.describe(),
        "rss_before_mib": before / 1024,
        "peak_rss_mib": peak / 1024,
        "update_peak_mib": (peak - before) / 1024,
        "seconds": seconds,
        "policy_tokens": update["policy_tokens"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=["before", "after"], help="run one variant (internal)")
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("--completion", type=int, default=1024)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument(
        "--micro", type=int, default=4, help="sequences per micro-batch (the trainer's default)"
    )
    args = parser.parse_args(argv)
    if args.variant:
        print(json.dumps(run_variant(args)), flush=True)
        return 0
    from posttrain.hardware import probe

    print(f"machine: {probe().describe()}", flush=True)
    print(
        f"one gspo_update, SmolLM2-135M-Instruct, {args.sequences} x {args.completion} completion tokens "
        f"(+{args.prompt} prompt), micro-batch {args.micro}, full fine-tuning, checkpointing on",
        flush=True,
    )
    results = {}
    for variant in ("before", "after"):
        cmd = [sys.executable, __file__, "--variant", variant]
        cmd += ["--sequences", str(args.sequences), "--completion", str(args.completion)]
        cmd += ["--prompt", str(args.prompt), "--micro", str(args.micro)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        results[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        r = results[variant]
        print(
            f"{variant:6s} weights {r['dtype']}: RSS before {r['rss_before_mib']:.0f} MiB, peak "
            f"{r['peak_rss_mib']:.0f} MiB, update's own peak {r['update_peak_mib']:.0f} MiB, "
            f"{r['seconds']:.1f} s",
            flush=True,
        )
    b, a = results["before"], results["after"]
    print(f"precision: {a['precision']}", flush=True)
    print(
        f"ratio before/after: update's own peak {b['update_peak_mib'] / max(a['update_peak_mib'], 1e-9):.2f}x, "
        f"whole-process peak {b['peak_rss_mib'] / a['peak_rss_mib']:.2f}x",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
