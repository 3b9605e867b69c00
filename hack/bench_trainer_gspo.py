"""GSPO update throughput of posttrain_trainer vs TRL's GRPOTrainer (importance_sampling_level="sequence"),
in the same process, on the same model, the same sampled tokens, rewards and batch.

The rollouts are sampled once from the model (temperature 1, varied lengths) and scored by a fixed reward, so
both trainers update on identical data: TRL gets them through its `rollout_func` hook (no generation inside
the timed region), posttrain through `rl.gspo_update`. Per rollout batch both do the same work: old
logprobs with the pre-update weights, then `MINIBATCHES` mini-batches of one forward, backward and AdamW
step each (TRL: steps_per_generation = MINIBATCHES, gradient_accumulation_steps = 1, num_iterations = 1;
posttrain: num_minibatches = MINIBATCHES, one micro-batch per mini-batch), GSPO clip 3e-4/4e-4, beta 0,
fp32. Throughput = non-padding tokens (prompt + completion) of the rollout batch / seconds of its update;
the first rollout batch (warm-up) is not timed. Printed as the ratio posttrain / TRL (> 1: faster).

Not a test: `make bench` or `.venv/bin/python hack/bench_trainer_gspo.py [--model tiny|smollm2]`."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

EPS_LOW, EPS_HIGH = 3e-4, 4e-4


def model_dir(which: str) -> Path:
    from posttrain.modelzoo import build_tiny_model, convert_smollm2

    if which == "tiny":
        return build_tiny_model(REPO / ".models" / "tiny-random-qwen2")
    return convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")


def prompt_messages(i: int) -> list[dict[str, str]]:
    a, b = (i * 37) % 90 + 10, (i * 11) % 9 + 1
    return [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}]


def sample_rollouts(path: Path, args) -> list[dict[str, Any]]:
    """args.batches rollout batches of args.prompts prompts x args.group completions, sampled from the model
    with lengths spread over [max_tokens/4, max_tokens]; reward = a fixed function of the tokens (so groups
    have spread and advantages are non-zero)."""
    import torch
    from posttrain_trainer.modeling import load_model_and_tokenizer

    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(path, trainer_mode="full", seed=0)
    model.eval()
    rng = random.Random(0)
    batches = []
    for b in range(args.batches):
        rows = []
        for p in range(args.prompts):
            messages = prompt_messages(b * args.prompts + p)
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt] * args.group)
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    do_sample=True,
                    temperature=1.0,
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=args.max_tokens,
                    min_new_tokens=args.max_tokens,
                    pad_token_id=tokenizer.pad_token_id,
                    use_cache=True,  # the trainer's loader turns the KV cache off for training
                )
            completions = []
            for row in out:
                length = rng.randint(args.max_tokens // 4, args.max_tokens)
                completions.append(row[len(prompt) : len(prompt) + length].tolist())
            rewards = [sum(1 for t in c if t % 2 == 0) / len(c) for c in completions]
            rows.append(
                {"messages": messages, "prompt_ids": prompt, "completions": completions, "rewards": rewards}
            )
        batches.append(rows)
    return batches


def batch_tokens(rows: list[dict[str, Any]]) -> int:
    return sum(len(r["prompt_ids"]) * len(r["completions"]) + sum(map(len, r["completions"])) for r in rows)


def bench_posttrain(path: Path, batches: list[list[dict[str, Any]]], args) -> dict[str, Any]:
    import torch
    from posttrain_trainer import distributed as D
    from posttrain_trainer import gspo
    from posttrain_trainer.modeling import load_model_and_tokenizer
    from posttrain_trainer.optim import build_optimizer, build_scheduler
    from posttrain_trainer.rl import TrainSeq, gspo_update
    from posttrain_trainer.rl_config import RLTrainerConfig

    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(path, trainer_mode="full", seed=0)
    sequences_per_batch = args.prompts * args.group
    cfg = RLTrainerConfig(
        batch_size=args.prompts,
        group_size=args.group,
        learning_rate=args.lr,
        num_minibatches=args.minibatches,
        micro_batch=sequences_per_batch // args.minibatches,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        skip_zero_advantage=False,
    )
    optimizer = build_optimizer(model, lr=cfg.learning_rate)
    scheduler = build_scheduler(optimizer, total_steps=len(batches) * args.minibatches, name="constant")
    engine = D.build_engine(model, optimizer, scheduler, cfg.parallel, max_grad_norm=cfg.max_grad_norm)
    engine.module.train()
    timed = []
    for it, rows in enumerate(batches):
        seqs = []
        for g, row in enumerate(rows):
            advantages = gspo.group_advantages(torch.tensor(row["rewards"]), args.group).tolist()
            for completion, reward, adv in zip(row["completions"], row["rewards"], advantages, strict=True):
                seqs.append(TrainSeq(row["prompt_ids"], completion, [1] * len(completion), adv, reward, g))
        stats = gspo_update(engine, seqs, cfg, tokenizer.pad_token_id, iteration=it)
        assert stats["optimizer_steps"] == args.minibatches, stats
        assert stats["tokens"] == batch_tokens(rows), (stats["tokens"], batch_tokens(rows))
        if it > 0:
            timed.append((stats["seconds"], stats["tokens"]))
    seconds, tokens = sum(s for s, _ in timed), sum(t for _, t in timed)
    return {"tokens_per_second": tokens / seconds, "timed_tokens": tokens, "timed_seconds": seconds}


def bench_trl(path: Path, batches: list[list[dict[str, Any]]], args, work: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from posttrain_trainer.modeling import load_tokenizer
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = load_tokenizer(path)
    # One dataset row per prompt, in rollout-batch order; rollout_func hands back that prompt's sampled
    # completions (TRL repeats each prompt num_generations times and may shuffle them within the batch).
    flat = [row for rows in batches for row in rows]
    by_prompt: dict[str, dict[str, Any]] = {json.dumps(r["messages"]): r for r in flat}
    handed: dict[str, int] = {}
    rewards_of: dict[tuple[int, ...], float] = {}
    for r in flat:
        for c, reward in zip(r["completions"], r["rewards"], strict=True):
            rewards_of[tuple(c)] = reward

    def rollout_func(prompts: list, trainer: Any) -> dict[str, Any]:
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": []}
        for messages in prompts:
            key = json.dumps(messages)
            row = by_prompt[key]
            k = handed.get(key, 0)
            handed[key] = k + 1
            completion = row["completions"][k % args.group]
            out["prompt_ids"].append(row["prompt_ids"])
            out["completion_ids"].append(completion)
            out["logprobs"].append([0.0] * len(completion))
        return out

    def reward_func(completions, completion_ids, **kwargs) -> list[float]:
        return [rewards_of[tuple(c)] for c in completion_ids]

    data = Dataset.from_list([{"prompt": r["messages"]} for r in flat])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    sequences_per_batch = args.prompts * args.group

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, targs, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, targs, state, control, **kw):
            self.steps.append(time.perf_counter() - self._t0)

    timer = Timer()
    config = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=sequences_per_batch // args.minibatches,
        steps_per_generation=args.minibatches,
        gradient_accumulation_steps=1,
        num_generations=args.group,
        num_iterations=1,
        max_steps=len(batches) * args.minibatches,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        weight_decay=0.0,
        optim="adamw_torch",
        importance_sampling_level="sequence",
        loss_type="grpo",
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
        beta=0.0,
        temperature=1.0,
        max_completion_length=args.max_tokens,
        shuffle_dataset=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        bf16=False,
        seed=42,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=[timer],
    )
    trainer.train()
    assert len(timer.steps) == len(batches) * args.minibatches, len(timer.steps)
    # The first rollout batch (its MINIBATCHES optimizer steps) is the warm-up.
    seconds = sum(timer.steps[args.minibatches :])
    tokens = sum(batch_tokens(rows) for rows in batches[1:])
    return {"tokens_per_second": tokens / seconds, "timed_tokens": tokens, "timed_seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_trainer_gspo")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--batches", type=int, default=4, help="rollout batches (the first is warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (groups) per rollout batch")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-6)
    args = parser.parse_args(argv)
    if (args.prompts * args.group) % args.minibatches:
        parser.error("--prompts x --group must divide into --minibatches")
    import torch

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    path = model_dir(args.model)
    batches = sample_rollouts(path, args)
    with tempfile.TemporaryDirectory(prefix="bench-gspo-") as tmp:
        ours = bench_posttrain(path, batches, args)
        trl = bench_trl(path, batches, args, Path(tmp))
    ratio = ours["tokens_per_second"] / trl["tokens_per_second"]
    device = "cuda" if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()} threads"
    summary = {
        "bench": "gspo",
        "model": args.model,
        "device": device,
        "rollout_batch": f"{args.prompts} prompts x {args.group}",
        "minibatches": args.minibatches,
        "timed_batches": args.batches - 1,
        "posttrain": ours,
        "trl": trl,
    }
    print(json.dumps(summary, indent=2))
    print(
        f"GSPO update throughput posttrain/TRL GRPOTrainer(sequence) = {ratio:.2f}x "
        f"({ours['tokens_per_second']:.0f} vs {trl['tokens_per_second']:.0f} tokens/s, {args.model}, "
        f"{args.prompts}x{args.group} rollouts, {args.minibatches} mini-batches, {device})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
