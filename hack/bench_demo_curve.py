"""`make demo`'s reliability on this machine (the default), or its learning curve against a minimal hand-written
GSPO loop (--compare).

Reliability (default): `python -m posttrain.local.demo --seed S` --runs N times (seeds --seed-base,
--seed-base + 1, ...; every run from the base model, each a full `make demo`), printing per run the seed, the
wall time, the iteration at which the training mean_return first reached 0.5, the held-out accuracy and, for
a run below the bar, the demo's own one-line diagnosis; then the distribution (min, median, share >= 0.8,
median wall time). Its last line is one JSON object: runs, seeds, held_out (list), min, median,
share_at_least_0_8, wall_s (list), wall_s_median, first_0_5 (list), cpu (the CPU's name from /proc/cpuinfo
and its capability). Each run's summary.json is kept in bench-results/demo_runs/. `--runs 20` measures the
demo's goal (held-out >= 0.8 in 19 of 20, docs/benchmarks.md); about 4-7 min a run on 2 cores. --task agent: the multi-step demo.

--compare: the side by side below (--which, --iterations, --target, --stop-at-target apply to it only).

The reference is the loop this project first learned the demo task with, written out plainly: SmolLM2-135M-
Instruct served by vLLM (OpenAI server, dev mode), plain torch + peft LoRA r16 / alpha 32 on all linear
layers, AdamW lr 2e-4, 8 prompts x group 8 (64 samples, T = 1, at most 48 new tokens), reward 1 when the last
number of the answer is right, group advantages (population std), only groups with mixed rewards trained,
two mini-batches with GSPO's clip (3e-4 / 4e-4), old log-probabilities recomputed by the trainer, and after
every update the LoRA merged into a copy of the base weights, saved, and reloaded by vLLM (reload_weights +
reset_prefix_cache). No SFT warm-up. It was measured at 0.05 -> 0.95 mean reward by iteration 17 (336 s) on
an AVX-512/AMX CPU in bf16.

Ours is the product: `posttrain train --local` on examples/demo/rl.toml (what `make demo` trains).

Same task and prompts for both: the math task app's own make_problem / score (two-digit + one-digit
addition, training seeds 0, 1, 2, ... in order, 8 per iteration), and the same held-out greedy evaluation
(the eval split, seeds 1000000-1000127). Both use the dtypes posttrain.hardware picks for this machine.
Printed: mean reward and seconds per iteration, then side by side the training seconds and iterations to
mean reward >= --target (training seconds: from the first rollout of iteration 1, without server start-up
and evaluation), and held-out accuracy before and after. `uptime` is printed beside the timings (a shared
machine inflates them).

--runs N (default 3) repeats both, interleaved (reference, ours, reference, ours, ...), and prints the medians
of iterations and training seconds to the target over the runs, and whether ours reaches it in fewer
seconds and no more iterations (a run that never reaches the target counts as infinitely slow: the median
is then "-" when most runs missed). One run each takes about 10-15 min on a quiet 2-core machine;
--runs 1 for a quick look.

Not a test: `make bench-demo` (or part of `make bench`);
`.venv/bin/python hack/bench_demo_curve.py [--runs 3] [--seed-base 0] [--task math|agent]`;
`.venv/bin/python hack/bench_demo_curve.py --compare [--which both|reference|ours] [--iterations 20] [--runs 3]`."""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from abtiming import uptime

REPO = Path(__file__).resolve().parents[1]
MATH_APP = REPO / "examples" / "taskapps" / "math" / "app.py"
DEMO_RL = REPO / "examples" / "demo" / "rl.toml"
ENV_CONFIG = {"difficulty": "medium"}
EVAL_SEEDS = list(range(1_000_000, 1_000_128))
PROMPTS, GROUP, MAX_TOKENS = 8, 8, 48
LR, LORA_R, LORA_ALPHA = 2e-4, 16, 32
EPS_LOW, EPS_HIGH, MINIBATCHES = 3e-4, 4e-4, 2



def math_app():
    spec = importlib.util.spec_from_file_location("posttrain_bench_math_app", MATH_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def first_reaching(values: list[float], target: float) -> int | None:
    """1-based index of the first value >= target, or None."""
    for index, value in enumerate(values, 1):
        if value is not None and value >= target:
            return index
    return None


# -- the reference loop --------------------------------------------------------------------------------


class VLLMServer:
    """vLLM's own OpenAI server (dev mode for reload_weights) in its own process group."""

    def __init__(self, model: Path, workdir: Path, dtype: str):
        from posttrain import reaper
        from posttrain.localhost import free_port
        from posttrain_rollout import vllm_args

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # served as ours is (eager on a CPU backend: vllm_args.cpu_eager), so that decoding costs the same
        argv = vllm_args.vllm_argv(str(model), self.port, served_model_name="policy", max_model_len=512,
                                   dtype=dtype, eager=vllm_args.cpu_eager(vllm_args.is_cpu_backend()))  # fmt: skip
        workdir.mkdir(parents=True, exist_ok=True)
        shared = {**os.environ, "VLLM_CACHE_ROOT": str(REPO / ".runs" / "cache" / "vllm")}  # the demo's too
        env = vllm_args.vllm_env(shared, workdir, cpu=vllm_args.is_cpu_backend())
        self.log = workdir / "vllm.log"
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        reaper.watch(self.proc.pid)

    def wait_ready(self, timeout: float = 1800) -> float:
        import httpx

        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited ({self.proc.returncode}); log {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise RuntimeError(f"vLLM not ready after {timeout} s; log {self.log}")

    def stop(self) -> None:
        from posttrain import reaper
        from posttrain.localhost import stop_group

        stop_group(self.proc, grace=20)
        reaper.unwatch(self.proc.pid)


async def _chat(client, url: str, question: str, *, n: int, temperature: float) -> list[dict[str, Any]]:
    body = {"model": "policy", "messages": [{"role": "user", "content": question}], "n": n,
            "temperature": temperature, "top_p": 1.0, "max_tokens": MAX_TOKENS, "return_token_ids": True}  # fmt: skip
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    response.raise_for_status()
    data = response.json()
    prompt_ids = data.get("prompt_token_ids") or data["choices"][0].get("prompt_token_ids")
    return [{"text": c["message"]["content"] or "", "prompt_ids": list(prompt_ids),
             "completion_ids": list(c["token_ids"])} for c in data["choices"]]  # fmt: skip


def sample(url: str, problems: list[dict[str, Any]], *, n: int, temperature: float) -> list[list[dict]]:
    import httpx

    async def run() -> list[list[dict]]:
        async with httpx.AsyncClient(timeout=600) as client:
            return list(await asyncio.gather(
                *(_chat(client, url, p["question"], n=n, temperature=temperature) for p in problems)))  # fmt: skip

    return asyncio.run(run())


def greedy_accuracy(url: str, app) -> float:
    problems = [app.make_problem(seed, ENV_CONFIG) for seed in EVAL_SEEDS]
    answers = sample(url, problems, n=1, temperature=0.0)
    return sum(app.score(p, a[0]["text"])[0] for p, a in zip(problems, answers, strict=True)) / len(problems)


def token_logprobs(model, rows: list[dict[str, Any]], pad_id: int):
    """Per-token log-probabilities of each row's completion tokens: ([B, T-1] logprobs, [B, T-1] mask)."""
    import torch

    width = max(len(r["prompt_ids"]) + len(r["completion_ids"]) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((len(rows), width - 1))
    for i, r in enumerate(rows):
        seq = r["prompt_ids"] + r["completion_ids"]
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        mask[i, len(r["prompt_ids"]) - 1 : len(seq) - 1] = 1
    logits = model(input_ids=ids, attention_mask=attention).logits[:, :-1].float()
    picked = torch.gather(logits, -1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1), mask


def gspo_step(model, optimizer, rows: list[dict[str, Any]], pad_id: int) -> None:
    import torch

    with torch.no_grad():
        old, _ = token_logprobs(model, rows, pad_id)
    order = list(range(len(rows)))
    random.shuffle(order)
    size = (len(rows) + MINIBATCHES - 1) // MINIBATCHES
    for start in range(0, len(rows), size):
        picked = order[start : start + size]
        batch = [rows[i] for i in picked]
        logprobs, mask = token_logprobs(model, batch, pad_id)
        old_batch = old[picked][:, : logprobs.shape[1]]
        adv = torch.tensor([r["advantage"] for r in batch])
        ratio = torch.exp(((logprobs - old_batch) * mask).sum(-1) / mask.sum(-1).clamp(min=1))
        objective = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
        loss = -objective.mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def merged_weights(model, dtype) -> dict[str, Any]:
    """The base weights with the LoRA merged in, out of place (peft's merge on a deep copy)."""
    import copy

    merged = copy.deepcopy(model).merge_and_unload()
    state = {k: v.detach().to(dtype).contiguous() for k, v in merged.state_dict().items()}
    if merged.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def reference(args, workdir: Path) -> dict[str, Any]:
    import httpx
    import torch
    from peft import LoraConfig, get_peft_model
    from posttrain import hardware
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    # The same rule as ours: a LoRA policy is synced to, and served by, vLLM in float32 on a CPU (merged into
    # bf16 weights most of an adapter step rounds away).
    precision = hardware.plan(lora_policy=True)
    print(f"[reference] {hardware.probe().describe()}; {precision.describe()}", flush=True)
    app = math_app()
    model_dir = args.model_dir
    started = time.monotonic()
    server = VLLMServer(model_dir, workdir, precision.vllm)
    try:
        ready = server.wait_ready()
        print(f"[reference] vLLM ready in {ready:.0f} s ({uptime()})", flush=True)
        torch.manual_seed(0)
        random.seed(0)
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = get_peft_model(base, LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                target_modules="all-linear", task_type="CAUSAL_LM"))  # fmt: skip
        model.eval()  # no dropout: the clip band is far narrower than dropout noise
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)
        sync_dir = workdir / "weights"
        shutil.copytree(
            model_dir, sync_dir, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors")
        )
        config = json.loads((sync_dir / "config.json").read_text())
        config["dtype"] = precision.sync
        (sync_dir / "config.json").write_text(json.dumps(config))
        eval_before = greedy_accuracy(server.url, app)
        print(f"[reference] held-out greedy accuracy before: {eval_before:.3f}", flush=True)
        pad_id = 2
        rows_out, train_seconds = [], 0.0
        for iteration in range(args.iterations):
            t0 = time.monotonic()
            seeds = [iteration * PROMPTS + j for j in range(PROMPTS)]
            problems = [app.make_problem(seed, ENV_CONFIG) for seed in seeds]
            groups = sample(server.url, problems, n=GROUP, temperature=1.0)
            t1 = time.monotonic()
            rows, rewards = [], []
            for problem, group in zip(problems, groups, strict=True):
                scores = torch.tensor([app.score(problem, g["text"])[0] for g in group])
                rewards += scores.tolist()
                if scores.std() == 0:
                    continue
                adv = (scores - scores.mean()) / (scores.std(unbiased=False) + 1e-6)
                rows += [dict(g, advantage=float(a)) for g, a in zip(group, adv, strict=True)]
            if rows:
                gspo_step(model, optimizer, rows, pad_id)
            t2 = time.monotonic()
            save_file(merged_weights(model, hardware.torch_dtype(precision.sync)),
                      str(sync_dir / "model.safetensors"), metadata={"format": "pt"})  # fmt: skip
            for path, body in (("/collective_rpc", {"method": "reload_weights",
                                                    "kwargs": {"weights_path": str(sync_dir)}}),
                               ("/reset_prefix_cache", None)):  # fmt: skip
                httpx.post(f"{server.url}{path}", json=body, timeout=600).raise_for_status()
            t3 = time.monotonic()
            train_seconds += t3 - t0
            mean = sum(rewards) / len(rewards)
            row = {"iteration": iteration + 1, "mean_return": mean, "mixed_groups": len(rows) // GROUP,
                   "rollout_s": t1 - t0, "update_s": t2 - t1, "sync_s": t3 - t2, "elapsed_s": train_seconds}  # fmt: skip
            rows_out.append(row)
            print(f"[reference] it {iteration + 1:2d}  mean_return {mean:.3f}  mixed {row['mixed_groups']}/8  "
                  f"rollout {row['rollout_s']:.1f} s  update {row['update_s']:.1f} s  sync {row['sync_s']:.1f} s  "
                  f"training {train_seconds:.0f} s", flush=True)  # fmt: skip
            if args.stop_at_target and mean >= args.target:
                break
        eval_after = greedy_accuracy(server.url, app)
        print(f"[reference] held-out greedy accuracy after: {eval_after:.3f} ({uptime()})", flush=True)
    finally:
        server.stop()
    return {"iterations": rows_out, "eval_before": eval_before, "eval_after": eval_after,
            "server_start_s": ready, "wall_s": time.monotonic() - started}  # fmt: skip


# -- ours ----------------------------------------------------------------------------------------------


def with_iterations(config: Path, iterations: int, out: Path) -> Path:
    """The config with [training].iterations_per_epoch = iterations: ours gets the reference's budget (the
    demo itself runs fewer; its final evaluation then comes after `iterations`)."""
    import re

    text, count = re.subn(r"(?m)^iterations_per_epoch\s*=\s*\d+", f"iterations_per_epoch = {iterations}",
                          config.read_text(), count=1)  # fmt: skip
    if count != 1:
        raise SystemExit(f"{config}: no [training].iterations_per_epoch line")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def ours(args) -> dict[str, Any]:
    """`posttrain train --local` on the demo's RL config from the base model (no SFT), its per-iteration
    events, and its first and final evaluation (the config's [evaluation]: the held-out seeds, greedy).
    The run stays in --runs-dir (default .runs/): `posttrain status`, `plot` and `eval --model rl:...` find it."""
    started = time.monotonic()
    config = with_iterations(args.config, args.iterations, args.runs_dir / "bench-demo-curve-rl.toml")
    argv = [sys.executable, "-m", "posttrain.cli", "train", "--local", "--type", "rl", "--config", str(config),
            "--runs-dir", str(args.runs_dir), "--name", "bench-ours"]  # fmt: skip
    print(f"[ours] $ posttrain {' '.join(argv[3:])}", flush=True)
    run_dir = None
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"[ours] {line}", end="", flush=True)
            if "run folder " in line:
                run_dir = Path(line.rsplit("run folder ", 1)[1].strip())
        code = proc.wait()
    if code != 0 or run_dir is None:
        raise SystemExit(f"posttrain train --local failed (exit {code})")
    rows, evals, ready = [], [], None
    for raw in (run_dir / "report.jsonl").read_text().splitlines():
        line = json.loads(raw)
        if line.get("event") == "iteration":
            rows.append(line)
        elif line.get("event") == "evaluation":
            evals.append(line["eval_score"])
    elapsed = 0.0
    for row in rows:
        elapsed += row["iteration_seconds"]
        row["elapsed_s"] = elapsed
    progress = [json.loads(raw)["progress"] for raw in (run_dir / "report.jsonl").read_text().splitlines()
                if "progress" in json.loads(raw)]  # fmt: skip
    by_step = {p["step"]: p for p in progress if p.get("meanReturn") is not None}
    for row in rows:
        row["mean_return"] = by_step.get(row["step"], {}).get("meanReturn")
    log = (run_dir / "logs" / "rollout-policy.log").read_text(errors="replace")
    for text in log.splitlines():
        if "vLLM ready after" in text:
            ready = float(text.rsplit("after", 1)[1].split()[0])
    return {"iterations": rows, "eval_before": evals[0] if evals else None,
            "eval_after": evals[-1] if evals else None, "server_start_s": ready,
            "wall_s": time.monotonic() - started, "run_dir": str(run_dir)}  # fmt: skip


def summarize(name: str, result: dict[str, Any], target: float) -> dict[str, Any]:
    returns = [r["mean_return"] for r in result["iterations"]]
    hit = first_reaching(returns, target)
    return {
        "name": name,
        "iterations_to_target": hit,
        "seconds_to_target": result["iterations"][hit - 1]["elapsed_s"] if hit else None,
        "iterations_run": len(returns),
        "mean_return": [round(r, 3) for r in returns],
        "eval_before": result["eval_before"],
        "eval_after": result["eval_after"],
        "server_start_s": result["server_start_s"],
        "wall_s": round(result["wall_s"], 1),
        "run_dir": result.get("run_dir"),
    }


def median_or_none(values: list[float | None]) -> float | None:
    """The median over runs where a run that missed the target (None) ranks above every number; None when
    the median itself falls on a miss."""
    ranked = sorted(values, key=lambda v: (v is None, v if v is not None else 0.0))
    if not ranked:
        return None
    n = len(ranked)
    middle = ranked[(n - 1) // 2 : n // 2 + 1]
    if any(v is None for v in middle):
        return None
    return statistics.fmean(middle)


def verdict(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per side over the runs, and whether ours reaches the target in fewer seconds and in no more
    iterations than the reference."""
    sides: dict[str, dict[str, Any]] = {}
    for r in results:
        side = sides.setdefault(r["name"], {"iterations": [], "seconds": [], "eval_after": []})
        side["iterations"].append(r["iterations_to_target"])
        side["seconds"].append(r["seconds_to_target"])
        side["eval_after"].append(r["eval_after"])
    out: dict[str, Any] = {}
    for name, side in sides.items():
        out[name] = {
            "runs": len(side["iterations"]),
            "median_iterations_to_target": median_or_none(side["iterations"]),
            "median_seconds_to_target": median_or_none(side["seconds"]),
            "median_eval_after": median_or_none(side["eval_after"]),
            "iterations_to_target": side["iterations"],
            "seconds_to_target": side["seconds"],
        }
    ref, ours_ = out.get("reference"), out.get("ours (posttrain)")
    if ref and ours_:
        ri, rs = ref["median_iterations_to_target"], ref["median_seconds_to_target"]
        oi, os_ = ours_["median_iterations_to_target"], ours_["median_seconds_to_target"]
        out["ours_fewer_seconds"] = os_ is not None and (rs is None or os_ < rs)
        out["ours_no_more_iterations"] = oi is not None and (ri is None or oi <= ri)
    return out


# -- reliability: the demo N times ---------------------------------------------------------------------


def run_record(seed: int, wall_s: float, exit_code: int, summary: dict[str, Any] | None) -> dict[str, Any]:
    """One demo run: its seed, wall time, exit code, the iteration at which training mean_return first
    reached 0.5 (None: never), its held-out score (None: no final evaluation) and diagnosis; the seconds of
    its rollouts and updates, and the groups dynamic sampling rolled out in all (None without it): with the
    held-out score, what tells two machines' runs of one seed apart or shows them the same."""
    summary = summary or {}
    returns = summary.get("mean_return") or []
    timings = summary.get("timings") or {}
    sampled = [it.get("groups_sampled") for it in summary.get("iterations") or []]
    return {
        "seed": seed,
        "wall_s": round(wall_s, 1),
        "exit_code": exit_code,
        "first_0_5": first_reaching(returns, 0.5),
        "iterations": len(returns),
        "held_out": summary.get("eval_fine_tuned"),
        "held_out_base": summary.get("eval_base"),
        "diagnosis": summary.get("diagnosis") if exit_code == 1 else None,
        "rollouts_s": timings.get("rollouts_s"),
        "updates_s": timings.get("updates_s"),
        "groups_sampled": sum(sampled) if sampled and None not in sampled else None,
    }


def distribution(records: list[dict[str, Any]], cpu: str, bar: float = 0.8) -> dict[str, Any]:
    """The runs' distribution (a run without a held-out score counts as a miss, as 0): the benchmark's last
    line."""
    held = [r["held_out"] for r in records]
    scores = sorted(h if isinstance(h, int | float) else 0.0 for h in held)
    walls = [r["wall_s"] for r in records]
    n = len(records)
    return {
        "runs": n,
        "seeds": [r["seed"] for r in records],
        "held_out": held,
        "min": scores[0] if scores else None,
        "median": statistics.median(scores) if scores else None,
        "share_at_least_0_8": (sum(s >= 0.8 for s in scores) / n) if n else None,
        "bar": bar,
        "share_at_least_bar": (sum(s >= bar for s in scores) / n) if n else None,
        "wall_s": walls,
        "wall_s_median": statistics.median(walls) if walls else None,
        "first_0_5": [r["first_0_5"] for r in records],
        "cpu": cpu,
    }


def run_demo(seed: int, args) -> dict[str, Any]:
    """`python -m posttrain.local.demo --seed S` (the demo's own lines streamed, prefixed), its summary."""
    argv = [sys.executable, "-m", "posttrain.local.demo", "--seed", str(seed), "--runs-dir", str(args.runs_dir),
            "--task", args.task, *args.demo_arg]  # fmt: skip
    if args.config != DEMO_RL:
        argv += ["--config", str(args.config)]
    print(f"$ {' '.join(argv[1:])}", flush=True)
    summary_path = args.runs_dir / "demo" / "summary.json"
    summary_path.unlink(missing_ok=True)
    started = time.monotonic()
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"[seed {seed}] {line}", end="", flush=True)
        code = proc.wait()
    wall = time.monotonic() - started
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is not None:
        keep = args.json_out.parent / "demo_runs" / f"{args.task}-seed-{seed}.json"
        keep.parent.mkdir(parents=True, exist_ok=True)
        keep.write_text(json.dumps(summary, indent=2))
    return run_record(seed, wall, code, summary)


def print_distribution(records: list[dict[str, Any]], dist: dict[str, Any]) -> None:
    def fmt(v, spec):
        return format(v, spec) if isinstance(v, int | float) else "-"

    print(f"\n== {dist['runs']} run(s) on {dist['cpu']} ({uptime()})")
    print(f"{'seed':>6} {'wall s':>7} {'mean_return >= 0.5 at':>22} {'held-out':>9} {'rollouts s':>11} "
          f"{'updates s':>10} {'groups sampled':>15}  exit")  # fmt: skip
    for r in records:
        print(f"{r['seed']:>6} {fmt(r['wall_s'], '.0f'):>7} {fmt(r['first_0_5'], 'd'):>22} "
              f"{fmt(r['held_out'], '.3f'):>9} {fmt(r.get('rollouts_s'), '.0f'):>11} "
              f"{fmt(r.get('updates_s'), '.0f'):>10} {fmt(r.get('groups_sampled'), 'd'):>15}  {r['exit_code']}"
              + (f"  ({r['diagnosis']})" if r["diagnosis"] else ""))  # fmt: skip
    print(f"held-out: min {fmt(dist['min'], '.3f')}, median {fmt(dist['median'], '.3f')}, "
          f">= 0.8 in {round((dist['share_at_least_0_8'] or 0) * dist['runs'])} of {dist['runs']}; "
          f"wall time median {fmt(dist['wall_s_median'], '.0f')} s")  # fmt: skip


def reliability(args) -> int:
    from posttrain import hardware

    cpu = f"{hardware.cpu_label()}; {hardware.probe().describe()}; {os.cpu_count()} cores"
    print(f"machine: {cpu}; {uptime()}", flush=True)
    bar = 0.8 if args.task == "math" else 0.0
    records = []
    for i in range(args.runs):
        seed = args.seed_base + i
        print(f"== run {i + 1} of {args.runs}: seed {seed} ({uptime()})", flush=True)
        records.append(run_demo(seed, args))
    dist = distribution(records, cpu, bar)
    print_distribution(records, dist)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"records": records, "distribution": dist}, indent=2))
    print(f"written: {args.json_out}")
    print(json.dumps(dist), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--compare", action="store_true",
                        help="the side by side against the hand-written GSPO loop instead of N demo runs")  # fmt: skip
    parser.add_argument("--seed-base", type=int, default=0, help="reliability: the first run's seed")
    parser.add_argument("--task", choices=["math", "agent"], default="math", help="reliability: the demo's --task")
    parser.add_argument("--demo-arg", action="append", default=[],
                        help="reliability: one more option for the demo (repeatable), e.g. --demo-arg=--sft-warmup")  # fmt: skip
    parser.add_argument("--which", choices=["both", "reference", "ours"], default="both")
    parser.add_argument("--iterations", type=int, default=20,
                        help="iterations at most, for both (ours runs them all; the reference can stop at target)")
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--runs", type=int, default=3,
                        help="demo runs (reliability), or runs of each side, interleaved (--compare)")  # fmt: skip
    parser.add_argument("--stop-at-target", action="store_true", help="end the reference once it reaches it")
    parser.add_argument("--config", type=Path, default=DEMO_RL, help="our RL config (default: the demo's)")
    parser.add_argument("--runs-dir", type=Path, default=REPO / ".runs",
                        help="where our run's folder and its embedded S3 stay (default .runs/)")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="default bench-results/demo_reliability.json (--compare: demo_curve.json)")  # fmt: skip
    args = parser.parse_args(argv)
    args.json_out = args.json_out or REPO / "bench-results" / ("demo_curve.json" if args.compare else "demo_reliability.json")
    args.runs_dir = args.runs_dir.resolve()
    if not args.compare:
        return reliability(args)
    from posttrain import hardware, modelzoo

    args.model_dir = modelzoo.convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    print(f"machine: {hardware.probe().describe()}; {os.cpu_count()} cores; {uptime()}", flush=True)
    results = []
    for run in range(args.runs):
        print(f"== run {run + 1} of {args.runs} ({uptime()})", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-demo-curve-") as tmp:
            if args.which in ("both", "reference"):
                results.append(summarize("reference", reference(args, Path(tmp) / "reference"), args.target))
            if args.which in ("both", "ours"):
                results.append(summarize("ours (posttrain)", ours(args), args.target))
    print(f"\n== side by side ({hardware.probe().describe()}; {uptime()})")
    print(f"{'':18} {'iters to ' + str(args.target):>14} {'train s to it':>14} {'held-out before':>16} "
          f"{'after':>7} {'vLLM start s':>13} {'wall s':>8}")  # fmt: skip
    for r in results:

        def fmt(v, spec):
            return format(v, spec) if isinstance(v, int | float) else "-"

        print(f"{r['name']:18} {fmt(r['iterations_to_target'], 'd'):>14} {fmt(r['seconds_to_target'], '.0f'):>14} "
              f"{fmt(r['eval_before'], '.3f'):>16} {fmt(r['eval_after'], '.3f'):>7} "
              f"{fmt(r['server_start_s'], '.0f'):>13} {fmt(r['wall_s'], '.0f'):>8}")  # fmt: skip
        print(f"{'':18} mean_return: {', '.join(f'{v:.2f}' for v in r['mean_return'])}")
        if r["run_dir"]:
            print(f"{'':18} run folder: {r['run_dir']}")
    medians = verdict(results)
    print(f"\n== medians over {args.runs} run(s) each, target mean_return >= {args.target}")
    for name, side in medians.items():
        if isinstance(side, dict):
            print(f"{name:18} iterations {side['median_iterations_to_target']} (runs: {side['iterations_to_target']}), "
                  f"training s {side['median_seconds_to_target']} (runs: "
                  f"{[round(s) if s is not None else None for s in side['seconds_to_target']]}), "
                  f"held-out after {side['median_eval_after']}")  # fmt: skip
    if "ours_fewer_seconds" in medians:
        print(f"ours in fewer seconds: {medians['ours_fewer_seconds']}; "
              f"in no more iterations: {medians['ours_no_more_iterations']}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"machine": hardware.probe().describe(), "uptime": uptime(),
                                         "results": results, "medians": medians}, indent=2))  # fmt: skip
    print(f"written: {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
