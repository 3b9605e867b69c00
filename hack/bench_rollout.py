"""Rollout server benchmark (not a test): the capture proxy's cost, and weight-sync seconds.

Starts `python -m posttrain_rollout serve --role policy` on a model (default the tiny test model), then drives
the same completion load (C concurrent clients, N requests x T tokens, ignore_eos) alternately against
  raw    vLLM's own OpenAI server (the proxy's internal 127.0.0.1 port, read from the server log), and
  proxy  the public proxy, every request captured under its own cid (return_token_ids + logprobs) and
         the captures taken afterwards in batches, POST /v1/captures (the trainer's CaptureBatches),
with logprobs asked for on every side (the proxy injects them for captured calls, so raw gets them too for
a like-for-like load). Sides: raw, forward (proxy, no cid), capture (proxy, ?cid=), fetch (capture + the
captures taken in batches). Prints requests/s and tokens/s of each and the ratio to raw (median of rounds),
then full-reload sync seconds (POST /v1/weights, same weights, median of K) and, with --lora, the LoRA
path (CPU: merge into the base + reload).

    .venv/bin/python hack/bench_rollout.py [--model DIR] [--concurrency 32] [--requests 128] [--tokens 32]
        [--rounds 3] [--syncs 5] [--lora]"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "trainer_image"))

from posttrain.localhost import free_port, stop_group  # noqa: E402
from posttrain_trainer.capture_batches import CaptureBatches  # noqa: E402

NAME = "bench-model"


async def load(
    base: str, *, concurrency: int, requests: int, tokens: int, capture: bool, fetch: bool = True
) -> tuple[float, int]:
    sem = asyncio.Semaphore(concurrency)
    run_tag = uuid.uuid4().hex[:8]  # fresh cids every run: captures never accumulate across runs
    produced = 0
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as http:
        batches = CaptureBatches(http)
        cids: list[str] = []

        async def one(i: int) -> None:
            nonlocal produced
            body = {"model": NAME, "prompt": f"request {i}: the quick brown fox", "max_tokens": tokens,
                    "temperature": 1.0, "ignore_eos": True, "logprobs": 1}  # fmt: skip
            async with sem:
                if capture:
                    cid = f"bench-{run_tag}-{i}"
                    r = await http.post("/v1/completions", params={"cid": cid}, json=body)
                    r.raise_for_status()
                    if fetch:
                        cids.append(cid)
                        await batches.add(base, cid)
                    else:
                        produced += sum(len(c["token_ids"]) for c in r.json()["choices"])
                else:
                    body["return_token_ids"] = True
                    r = await http.post("/v1/completions", json=body)
                    r.raise_for_status()
                    produced += sum(len(c["token_ids"]) for c in r.json()["choices"])

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        await batches.flush()
        for cid in cids:
            taken = batches.taken(cid)
            if taken.entries is None:
                raise RuntimeError(taken.error)
            produced += sum(len(c["completion_token_ids"]) for c in taken.entries)
        return time.perf_counter() - t0, produced


def make_adapter(model_dir: Path, out: Path) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    peft_model.save_pretrained(str(out))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    # head_dim 32: vLLM's CPU attention rejects the default tiny model's head_dim 16
    parser.add_argument("--model", default=str(REPO / ".models" / "tiny-random-qwen2-hd32"))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--lora", action="store_true", help="also time format=lora (CPU: merge + reload)")
    parser.add_argument("--enable-lora", action="store_true",
                        help="serve with --enable-lora (LoRA hot-load in place; implies --lora)")  # fmt: skip
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--startup-timeout", type=float, default=900)
    args = parser.parse_args()

    model = Path(args.model)
    if not model.exists() and model.name == "tiny-random-qwen2-hd32":
        from posttrain.modelzoo import build_tiny_model

        build_tiny_model(model, hidden_size=128)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-rollout-"))
    port = free_port()
    env = dict(os.environ)
    env.setdefault("VLLM_CACHE_ROOT", str(REPO / ".runs" / "cache" / "vllm"))
    log_path = run_dir / "server.log"
    argv = [sys.executable, "-m", "posttrain_rollout", "serve", "--role", "policy", "--model", str(model),
            "--port", str(port), "--served-model-name", NAME, "--max-model-len", str(args.max_model_len),
            "--run-dir", str(run_dir)]  # fmt: skip
    if args.enable_lora:
        argv += ["--enable-lora", "--max-lora-rank", "8"]
        args.lora = True
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    proxy = f"http://127.0.0.1:{port}"
    try:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                print(log_path.read_text()[-3000:])
                return 1
            try:
                if httpx.get(f"{proxy}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() - t0 > args.startup_timeout:
                print(f"not healthy after {args.startup_timeout} s; log {log_path}")
                return 1
            time.sleep(1)
        print(f"server healthy after {time.monotonic() - t0:.1f} s")
        m = re.search(r"vLLM on 127\.0\.0\.1:(\d+)", log_path.read_text())
        raw = f"http://127.0.0.1:{m.group(1)}"
        kw = {"concurrency": args.concurrency, "requests": args.requests, "tokens": args.tokens}
        asyncio.run(load(raw, **{**kw, "requests": args.concurrency}, capture=False))  # warm-up
        asyncio.run(load(proxy, **{**kw, "requests": args.concurrency}, capture=True))
        results: dict[str, list[tuple[float, int]]] = {"raw": [], "forward": [], "capture": [], "fetch": []}
        for _ in range(args.rounds):
            results["raw"].append(asyncio.run(load(raw, **kw, capture=False)))
            results["forward"].append(asyncio.run(load(proxy, **kw, capture=False)))
            results["capture"].append(asyncio.run(load(proxy, **kw, capture=True, fetch=False)))
            results["fetch"].append(asyncio.run(load(proxy, **kw, capture=True)))
        print(f"load: {args.requests} completions x {args.tokens} tokens, {args.concurrency} concurrent, "
              f"logprobs on, {args.rounds} rounds (median)")  # fmt: skip
        med = {}
        for side, runs in results.items():
            rps = statistics.median(args.requests / s for s, _ in runs)
            tps = statistics.median(n / s for s, n in runs)
            med[side] = (rps, tps)
            ratio = f"  ratio to raw {rps / med['raw'][0]:.3f}" if side != "raw" else ""
            print(f"  {side:8s} {rps:8.1f} req/s  {tps:9.1f} tok/s{ratio}   rounds: "
                  + ", ".join(f"{n / s:.0f}" for s, n in runs) + " tok/s")  # fmt: skip
        print(
            "  raw: vLLM directly; forward: through the proxy, no cid; capture: with ?cid= (captured);"
            " fetch: captured + GET and DELETE of the captures per request (3 HTTP calls per rollout)"
        )

        def sync(path: str, fmt: str, version: int) -> tuple[float, float]:
            t = time.perf_counter()
            r = httpx.post(
                f"{proxy}/v1/weights", json={"path": path, "format": fmt, "version": version}, timeout=600
            )
            r.raise_for_status()
            return time.perf_counter() - t, r.json()["seconds"]

        full = [sync(str(model.resolve()), "full", v) for v in range(1, args.syncs + 1)]
        print(f"full reload sync: server {statistics.median(s for _, s in full):.3f} s, "
              f"round trip {statistics.median(w for w, _ in full):.3f} s (median of {args.syncs})")  # fmt: skip
        if args.lora:
            adapter = make_adapter(model, run_dir / "adapter")
            lora = [sync(str(adapter), "lora", 100 + v) for v in range(max(1, args.syncs // 2))]
            how = "hot-load in place (load_lora_adapter)" if args.enable_lora else "merge into base + reload"
            print(f"lora sync ({how}): server {statistics.median(s for _, s in lora):.3f} s")
            sync(str(model.resolve()), "full", 1000)
    finally:
        stop_group(proc, grace=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
