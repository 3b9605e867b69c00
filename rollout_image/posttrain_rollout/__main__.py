"""`python -m posttrain_rollout serve --role policy|reference|judge --model DIR|s3://... [--host H] [--port P]`

Starts vLLM's OpenAI server as a child on an internal 127.0.0.1 port (dev mode on, never exposed) and the
proxy (posttrain_rollout.server) on the public host/port. Exits (stopping vLLM's process group) when vLLM
dies, on SIGTERM/SIGINT, or when vLLM does not become healthy within --startup-timeout."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from posttrain.localhost import free_port, stop_group

ROLES = ("policy", "reference", "judge")
VLLM_STOP_GRACE_SECONDS = 20.0  # vLLM frees its engine and KV cache on SIGTERM; give it the time
log = logging.getLogger("posttrain_rollout")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m posttrain_rollout")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve a model through vLLM behind the capture/weight-sync proxy")
    s.add_argument("--role", choices=ROLES, default="policy")
    s.add_argument("--model", required=True, help="model folder or s3://bucket/prefix/")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--served-model-name", default=None)
    s.add_argument("--max-model-len", type=int, default=None)
    s.add_argument(
        "--tool-call-parser",
        default=None,
        help="vLLM's tool-call parser (e.g. hermes, llama3_json; none: no tool calling); default: the one the "
        "model's family is known to use ($POSTTRAIN_TOOL_CALL_PARSER overrides that)",
    )
    s.add_argument("--tensor-parallel-size", type=int, default=1)
    s.add_argument(
        "--dtype",
        default=None,
        help="vLLM --dtype (default: what this machine computes natively, posttrain.hardware: bfloat16 where "
        "bf16 is native, float32 on other CPUs, float16 on other GPUs)",
    )
    s.add_argument(
        "--lora-policy",
        action="store_true",
        help="the served weights are a base plus a trained LoRA merged at every weight sync: on a CPU vLLM "
        "runs in float32, where bf16 would round the adapter's per-step change away (posttrain.hardware)",
    )
    s.add_argument("--limit-mm-per-prompt", default=None, help='JSON, e.g. {"image": 1}')
    s.add_argument("--enable-lora", action="store_true")
    s.add_argument("--max-lora-rank", type=int, default=None)
    s.add_argument("--max-loras", type=int, default=None)
    s.add_argument("--run-dir", default=os.environ.get("POSTTRAIN_RUN_DIR"), help="caches, temp, weights")
    s.add_argument("--startup-timeout", type=float, default=1800.0)
    s.add_argument("--capture-max-cids", type=int, default=20_000)
    s.add_argument("--capture-ttl", type=float, default=3600.0, help="seconds after a cid's last write")
    s.add_argument("--vllm-arg", action="append", default=[], help="extra vLLM flag (repeatable)")
    s.add_argument(
        "--seed",
        type=int,
        default=None,
        help="the job's seed: each captured sampling request (a cid) without a seed of its own gets one derived "
        "from it, the cid and the call's index in the cid (posttrain_rollout.seeding); unset: unseeded",
    )
    s.add_argument("--log-level", default="info")
    s.add_argument("--max-images-per-message", type=int, default=None, help="each message keeps its first N")
    s.add_argument(
        "--max-images-per-step", type=int, default=None, help="a request keeps its newest N images"
    )
    s.add_argument("--image-only-mode", action="store_true", help="user messages with images lose their text")
    s.add_argument(
        "--token-env",
        default="POSTTRAIN_ROLLOUT_TOKEN",
        help="environment variable holding the token POST /v1/weights and the captures demand (unset: open)",
    )
    return parser


async def _serve(args: argparse.Namespace, proc: subprocess.Popen, proxy, started: float) -> int:
    import httpx
    import uvicorn

    from posttrain_rollout.server import create_app

    app = create_app(proxy)
    config = uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level, access_log=False, lifespan="on"
    )
    server = uvicorn.Server(config)
    state = {"rc": 0}

    async def watch() -> None:
        ready = False
        async with httpx.AsyncClient(base_url=proxy.upstream, timeout=5.0) as http:
            while not server.should_exit:
                if proc.poll() is not None:
                    log.error("vLLM exited with code %s", proc.returncode)
                    state["rc"] = 1
                    server.should_exit = True
                    return
                if not ready:
                    try:
                        ready = (await http.get("/health")).status_code == 200
                    except httpx.HTTPError:
                        ready = False
                    if ready:
                        log.info("vLLM ready after %.1f s", time.monotonic() - started)
                    elif time.monotonic() - started > args.startup_timeout:
                        log.error("vLLM not healthy after %.0f s", args.startup_timeout)
                        state["rc"] = 1
                        server.should_exit = True
                        return
                await asyncio.sleep(1.0)

    watcher = asyncio.create_task(watch())
    await server.serve()
    watcher.cancel()
    return state["rc"]


def serve(args: argparse.Namespace) -> int:
    from posttrain import reaper

    from posttrain_rollout import vllm_args, weights
    from posttrain_rollout.captures import CaptureStore
    from posttrain_rollout.server import Proxy
    from posttrain_rollout.vision import ImageLimits

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request otherwise
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="posttrain-rollout-")).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    model_dir = weights.local_path(args.model, run_dir / "models", "base")
    port = free_port()
    cpu = vllm_args.is_cpu_backend()
    from posttrain import hardware

    capability = hardware.probe()
    dtype = args.dtype or hardware.vllm_dtype(capability, args.lora_policy)
    log.info(
        "%s; vLLM --dtype %s (%s)", capability.describe(), dtype, "given" if args.dtype else "chosen for it"
    )
    argv = vllm_args.vllm_argv(
        str(model_dir),
        port,
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        tensor_parallel_size=args.tensor_parallel_size,
        dtype=dtype,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
        enable_lora=args.enable_lora,
        max_lora_rank=args.max_lora_rank,
        max_loras=args.max_loras,
        extra=[*vllm_args.tool_call_args(model_dir, parser=args.tool_call_parser), *args.vllm_arg],
        eager=vllm_args.cpu_eager(cpu),
        block_size=vllm_args.cpu_block_size(cpu),
        whole_prefills=vllm_args.cpu_whole_prefills(cpu),
    )
    env = vllm_args.vllm_env(
        None, run_dir, cpu=cpu, enable_lora=args.enable_lora, tensor_parallel_size=args.tensor_parallel_size
    )
    log.info(
        "role %s: vLLM on 127.0.0.1:%d (%s), proxy on %s:%d", args.role, port, model_dir, args.host, args.port
    )
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, start_new_session=True)
    reaper.watch(proc.pid)  # vLLM's group is stopped even if this process is killed outright

    def on_signal(signum, _frame):
        for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut the clean-up short
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    proxy = Proxy(
        f"http://127.0.0.1:{port}",
        role=args.role,
        served_model_name=args.served_model_name,
        model_dir=model_dir,
        run_dir=run_dir,
        enable_lora=args.enable_lora,
        captures=CaptureStore(max_cids=args.capture_max_cids, ttl_s=args.capture_ttl),
        upstream_alive=lambda: proc.poll() is None,
        token=os.environ.get(args.token_env, "").strip() or None,
        image_limits=ImageLimits(args.max_images_per_message, args.max_images_per_step, args.image_only_mode),
        seed=args.seed,
    )
    if args.seed is not None:
        log.info("sampling seeded from the job's seed %d", args.seed)
    rc = 1
    try:
        rc = asyncio.run(_serve(args, proc, proxy, started))
    except KeyboardInterrupt:
        rc = 0
    finally:
        stop_group(proc, VLLM_STOP_GRACE_SECONDS)
        reaper.unwatch(proc.pid)
        vllm_args.remove_fallback_tmp(env, run_dir)
    return rc


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
