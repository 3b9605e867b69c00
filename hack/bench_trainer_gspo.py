"""GSPO update throughput of posttrain_trainer vs TRL's GRPOTrainer (importance_sampling_level="sequence"),
in the same process, on the same model, the same sampled tokens, rewards and batches, interleaved.

Data: --repeats + 1 rollout batches are sampled once from the model (temperature 1, varied lengths) and scored
by a fixed function of the tokens, so both trainers update on identical data. TRL gets them through its
`rollout_func` hook, posttrain through `rl.gspo_update`. Per rollout batch both do the same work: old logprobs
with the pre-update weights, then --minibatches mini-batches of one forward, backward, clip and AdamW step each
(TRL: steps_per_generation = minibatches, gradient_accumulation_steps = 1, num_iterations = 1; posttrain:
num_minibatches = minibatches, one micro-batch per mini-batch), GSPO clip 3e-4/4e-4, beta 0. posttrain
computes the first mini-batch's old logprobs in its update pass (ratio exactly 1), TRL runs a separate no-grad
pass over the whole batch: that difference is each trainer's own and is timed. posttrain packs each
prompt's samples into one row where RLRun would (prefix_packing.pack_policy: the prompt runs once per
micro-batch; TRL runs it once per sample): also each trainer's own, timed, and named in the output.

Interleaving: batch k is updated by TRL, then by posttrain (A, B, A, B, ...): TRL's training loop runs, and a
callback runs posttrain's update on the same batch when TRL's last optimizer step of that batch returns,
outside TRL's timed region. Batch 0 is the warm-up of both; batches 1..repeats are timed.

Timing boundaries (the same on both sides): from handing the scored rollout batch (token ids + rewards) to
the trainer until its last optimizer step of that batch returns. Included on both sides: group advantages,
shuffling into mini-batches, collation (padding into tensors), the old-logprob pass, forward, backward, gradient
clipping, AdamW and the LR scheduler. Excluded on both sides: producing the rollouts and scoring them. For
TRL that is measured and subtracted: its per-step time (Trainer callbacks on_step_begin -> on_step_end) minus
the time inside GRPOTrainer._generate (the rollout_func, decoding the completions to text, length metrics) and
_calculate_rewards (the reward function). TRL 1.16 has no separate entropy pass: its fused LM head returns
log-probs and entropy from the same forward (not switchable without patching TRL), so that is part of its
update and stays in. Logging, which the Trainer does after on_step_end, is outside.

Tokens are measured on both sides from the inputs each trainer trained on: non-padding prompt + completion
tokens of every micro-batch of the update (posttrain: the attention masks it collated, its `tokens`
statistic; TRL: prompt_mask + completion_mask of each compute_loss input). Padded positions (what the forward
actually ran over: posttrain's packed rows where it packs) are printed too. Both sides must report the same non-padding count (checked).

Precision: both the same, posttrain.hardware's decision for this machine (--precision auto: bf16 autocast
with fp32 master weights where bf16 is native, else fp32), or both fp32 (--precision fp32). Mode: both in
train() with every dropout off (posttrain: modeling.train_without_dropout, as its RL update runs; TRL:
disable_dropout=True), and both without gradient checkpointing (GRPOConfig defaults it on: set off here,
as posttrain's default). Precision and mode are measured during the update (the dtype of a projection's
output, model.training, active dropout layers) and printed.

Printed: per side the median and spread (min, IQR, max) of the timed repeats, in seconds and tokens/s, and
the ratio of the medians of the throughputs posttrain / TRL (> 1: posttrain faster).

Not a test: `make bench` or `.venv/bin/python hack/bench_trainer_gspo.py [--model tiny|smollm2] [--repeats 6]`."""

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

from abtiming import Series, ratio_of_medians, spread_line, uptime
from trl_gspo import gspo_grpo_config

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


def sample_rollouts(path: Path, args) -> list[list[dict[str, Any]]]:
    """repeats + 1 rollout batches of args.prompts prompts x args.group completions, sampled from the model
    with lengths spread over [max_tokens/4, max_tokens]; reward = a fixed function of the tokens (so groups
    have spread and advantages are non-zero)."""
    import torch
    from posttrain_trainer.modeling import load_model_and_tokenizer

    torch.manual_seed(0)
    model, tokenizer = load_model_and_tokenizer(path, trainer_mode="full", seed=0)
    model.eval()
    rng = random.Random(0)
    batches = []
    for b in range(args.repeats + 1):
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


class Probe:
    """What the model computes in during an update, measured: the dtype of the first layer's first linear
    output, model.training, and the dropout layers / rates that would act."""

    def __init__(self, model) -> None:
        import torch

        self.model = model
        self.dtypes: set[str] = set()
        linear = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        linear.register_forward_hook(
            lambda _m, _i, out: self.dtypes.add(str(out.dtype).replace("torch.", ""))
        )
        self.modes: set[str] = set()
        self.active_dropout: set[str] = set()

    def look(self) -> None:
        import torch

        self.modes.add("train" if self.model.training else "eval")
        for name, module in self.model.named_modules():
            if not module.training:
                continue
            if isinstance(module, torch.nn.modules.dropout._DropoutNd) and module.p > 0:
                self.active_dropout.add(name or "model")
            for key, value in vars(module).items():
                if "dropout" in key and isinstance(value, float) and value > 0:
                    self.active_dropout.add(f"{name}.{key}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "linear_output_dtype": sorted(self.dtypes),
            "mode": sorted(self.modes),
            "active_dropout": sorted(self.active_dropout) or "none",
        }


class Posttrain:
    """posttrain_trainer's GSPO update, one rollout batch per call."""

    def __init__(self, path: Path, args, bf16: bool | None) -> None:
        import torch
        from posttrain_trainer import distributed as D
        from posttrain_trainer import prefix_packing, rl
        from posttrain_trainer.modeling import load_model_and_tokenizer
        from posttrain_trainer.optim import build_optimizer, build_scheduler
        from posttrain_trainer.rl_config import RLTrainerConfig

        torch.manual_seed(0)
        model, tokenizer = load_model_and_tokenizer(path, trainer_mode="full", seed=0)
        sequences_per_batch = args.prompts * args.group
        self.cfg = RLTrainerConfig(
            batch_size=args.prompts,
            group_size=args.group,
            learning_rate=args.lr,
            num_minibatches=args.minibatches,
            micro_batch=sequences_per_batch // args.minibatches,
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            skip_zero_advantage=False,
            parallel=D.ParallelConfig(bf16=bf16),
        )
        optimizer = build_optimizer(model, lr=self.cfg.learning_rate)
        scheduler = build_scheduler(
            optimizer, total_steps=(args.repeats + 1) * args.minibatches, name="constant"
        )
        self.engine = D.build_engine(model, optimizer, scheduler, self.cfg.parallel, max_grad_norm=1.0)
        self.engine.module.eval()  # as RLRun leaves it between updates; gspo_update sets its own mode
        # shared-prefix packing where RLRun would pack (prefix_packing.pack_policy): posttrain's update as it runs
        self.pack, self.pack_line = prefix_packing.pack_policy(self.engine.module, vision=False)
        self.pad_id = tokenizer.pad_token_id
        self.args = args
        self.probe = Probe(self.engine.module)
        self.padded = 0
        collate = rl._collate

        # positions the forward ran over (padded rows, or the packed ones), and the mode during the update
        def counted_collate(seqs, pad_id, processor=None, pack=None):
            batch = collate(seqs, pad_id, processor, pack)
            self.padded += (batch.packed.input_ids if batch.packed is not None else batch.input_ids).numel()
            self.probe.look()
            return batch

        rl._collate = counted_collate

    def update(self, rows: list[dict[str, Any]], iteration: int) -> tuple[float, int, int]:
        """(seconds, non-padding tokens, padded positions) of one rollout batch's update."""
        import torch
        from posttrain_trainer import gspo
        from posttrain_trainer.rl import TrainSeq, gspo_update

        self.padded = 0
        started = time.perf_counter()
        seqs = []
        for g, row in enumerate(rows):
            advantages = gspo.group_advantages(torch.tensor(row["rewards"]), self.args.group).tolist()
            for completion, reward, adv in zip(row["completions"], row["rewards"], advantages, strict=True):
                seqs.append(TrainSeq(row["prompt_ids"], completion, [1] * len(completion), adv, reward, g))
        stats = gspo_update(self.engine, seqs, self.cfg, self.pad_id, iteration=iteration, pack=self.pack)
        seconds = time.perf_counter() - started
        assert stats["optimizer_steps"] == self.args.minibatches, stats
        return seconds, int(stats["tokens"]), self.padded


def run_interleaved(path: Path, batches: list[list[dict[str, Any]]], args, work: Path, precision) -> dict:
    """TRL's training loop over every batch; after TRL's last step of batch k, posttrain's update of batch k."""
    import torch
    from datasets import Dataset
    from posttrain_trainer.modeling import load_tokenizer
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOTrainer

    ours = Posttrain(path, args, None if args.precision == "auto" else False)
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
    series = {"posttrain": Series("posttrain"), "trl": Series("TRL")}
    padded = {"posttrain": [], "trl": []}
    excluded: list[float] = []

    class Interleave(TrainerCallback):
        """Times TRL's steps of one rollout batch, then runs posttrain's update of the same batch."""

        def __init__(self) -> None:
            self.step_seconds = 0.0
            self.tokens = 0
            self.padded = 0
            self.outside = 0.0  # seconds inside rollout_func/decoding and the reward function
            self._t0 = 0.0

        def on_step_begin(self, targs, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, targs, state, control, **kw):
            self.step_seconds += time.perf_counter() - self._t0
            if state.global_step % args.minibatches:
                return
            batch = state.global_step // args.minibatches - 1
            if batch > 0:
                series["trl"].add(self.step_seconds - self.outside, self.tokens)
                padded["trl"].append(self.padded)
                excluded.append(self.outside)
            seconds, tokens, positions = ours.update(batches[batch], batch)
            if batch > 0:
                series["posttrain"].add(seconds, tokens)
                padded["posttrain"].append(positions)
            print(
                f"  batch {batch}{' (warm-up)' if batch == 0 else ''}: TRL {self.step_seconds - self.outside:.2f} s "
                f"({self.tokens} tokens; {self.outside:.2f} s of rollout_func + rewards excluded), "
                f"posttrain {seconds:.2f} s ({tokens} tokens)",
                flush=True,
            )
            self.step_seconds, self.tokens, self.padded, self.outside = 0.0, 0, 0, 0.0

    interleave = Interleave()
    config = gspo_grpo_config(
        str(work / "trl"),
        samples=sequences_per_batch,
        minibatches=args.minibatches,
        group=args.group,
        max_steps=len(batches) * args.minibatches,
        lr=args.lr,
        eps_low=EPS_LOW,
        eps_high=EPS_HIGH,
        max_tokens=args.max_tokens,
        bf16=precision.bf16,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_func,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        rollout_func=rollout_func,
        callbacks=[interleave],
    )
    trl_probe = Probe(trainer.model)

    def excluded_from_timing(method):
        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return method(*a, **kw)
            finally:
                interleave.outside += time.perf_counter() - t0

        return timed

    trainer._generate = excluded_from_timing(trainer._generate)
    trainer._calculate_rewards = excluded_from_timing(trainer._calculate_rewards)
    compute_loss = trainer.compute_loss

    def counted_compute_loss(model, inputs, *a, **kw):
        interleave.tokens += int(inputs["prompt_mask"].sum()) + int(inputs["completion_mask"].sum())
        interleave.padded += inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()
        trl_probe.look()
        return compute_loss(model, inputs, *a, **kw)

    trainer.compute_loss = counted_compute_loss
    trainer.train()
    assert len(series["trl"].seconds) == args.repeats == len(series["posttrain"].seconds), series
    return {
        "series": series,
        "padded": padded,
        "excluded_trl_seconds": excluded,
        "probes": {"posttrain": ours.probe.as_dict(), "trl": trl_probe.as_dict()},
        "trl_mixed_precision": str(trainer.accelerator.mixed_precision),
        "pack_line": ours.pack_line,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_trainer_gspo")
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument(
        "--repeats", type=int, default=6, help="timed rollout batches per side (after a warm-up)"
    )
    parser.add_argument("--prompts", type=int, default=4, help="prompts (groups) per rollout batch")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--precision", choices=["auto", "fp32"], default="auto",
                        help="auto: posttrain.hardware's decision on both sides; fp32: both fp32")  # fmt: skip
    args = parser.parse_args(argv)
    if (args.prompts * args.group) % args.minibatches:
        parser.error("--prompts x --group must divide into --minibatches")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    import torch
    from posttrain import hardware

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    precision = hardware.plan(None if args.precision == "auto" else False)
    machine = hardware.probe().describe()
    print(f"machine: {machine}; {os.cpu_count()} cores, torch {torch.get_num_threads()} threads; {uptime()}")
    print(f"precision (both sides): {precision.describe()}", flush=True)
    path = model_dir(args.model)
    batches = sample_rollouts(path, args)
    with tempfile.TemporaryDirectory(prefix="bench-gspo-") as tmp:
        result = run_interleaved(path, batches, args, Path(tmp), precision)
    ours, trl = result["series"]["posttrain"], result["series"]["trl"]
    if ours.tokens != trl.tokens:
        raise SystemExit(f"the two sides trained on different token counts: {ours.tokens} vs {trl.tokens}")
    ratio = ratio_of_medians(ours.throughput, trl.throughput)
    device = "cuda" if torch.cuda.is_available() else f"cpu x{torch.get_num_threads()} threads"
    summary = {
        "bench": "gspo_update",
        "model": args.model,
        "machine": machine,
        "device": device,
        "precision": precision.describe(),
        "trl_accelerate_mixed_precision": result["trl_mixed_precision"],
        "measured_during_update": result["probes"],
        "rollout_batch": f"{args.prompts} prompts x {args.group}",
        "minibatches": args.minibatches,
        "order": "interleaved per rollout batch: TRL, posttrain, TRL, posttrain, ... (batch 0 = warm-up)",
        "timing": "scored rollout batch handed over -> last optimizer step returned (collation, advantages, "
        "old-logprob pass included; rollouts and rewards excluded on both sides)",
        "posttrain": {
            **ours.as_dict(),
            "padded_positions": result["padded"]["posttrain"],
            "prefix_packing": result["pack_line"],
        },  # fmt: skip
        "trl": {
            **trl.as_dict(),
            "padded_positions": result["padded"]["trl"],
            "excluded_rollout_reward_seconds": [round(s, 3) for s in result["excluded_trl_seconds"]],
        },
        "ratio_of_median_tokens_per_second": round(ratio, 3),
        "uptime": uptime(),
    }
    print(json.dumps(summary, indent=2))
    for name, series in (("posttrain", ours), ("TRL", trl)):
        s = series.as_dict()
        print(f"{name:>9}: {spread_line(s['tokens_per_second_summary'], 'tokens/s', '.0f')}; "
              f"{spread_line(s['seconds_summary'], 's', '.2f')}")  # fmt: skip
    print(
        f"GSPO update throughput posttrain/TRL GRPOTrainer(sequence) = {ratio:.2f}x, ratio of medians over "
        f"{args.repeats} interleaved repeats ({args.model}, {args.prompts}x{args.group} rollouts, "
        f"{args.minibatches} mini-batches, {precision.compute} compute on both, train mode without dropout on "
        f"both, {device}; {hardware.probe().cpu_model})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
