"""Evaluate several models on the math task app's held-out seeds in one go (what `make demo` does; the
general command is `posttrain eval`, built on the same pieces in posttrain.evaluation): for each model (a base model id, a local
folder, or a fine_tuned_model id from an earlier local job) serve it with the rollout server, POST /rollout in
eval mode (greedy unless --temperature) for every seed, and report the mean return.

`python -m posttrain.local.evaluate --model HuggingFaceTB/SmolLM2-135M-Instruct --model rl:... \
     --seeds 1000000-1000099 --env-config '{"difficulty": "medium"}'`"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain.api.urls import CID_PREFIX
from posttrain.local.models import resolve_model
from posttrain.local.processes import ProcessSet, sigterm_as_keyboard_interrupt, wait_http
from posttrain.local.runner import RUNS_DIR, _vllm_env
from posttrain.local.serving import materialize
from posttrain.local.serving import server_argv as _eval_server_argv
from posttrain.local.taskapp import start_taskapp
from posttrain.localhost import free_port
from posttrain.taskapp_client import TaskAppClient, TaskAppError, rollout_request


@dataclass
class EvalResult:
    model: str
    mean_return: float
    episodes: int
    errors: int
    seconds: float


def parse_seeds(text: str) -> list[int]:
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            seeds += list(range(int(lo), int(hi) + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def evaluate_url(
    task_url: str,
    api_key: str,
    inference_base: str,
    model_name: str,
    seeds: list[int],
    *,
    env_name: str = "math",
    env_config: dict[str, Any] | None = None,
    policy_config: dict[str, Any] | None = None,
    concurrency: int = 16,
) -> tuple[float, int, int]:
    """(mean return, episodes, errors) of `model_name` behind `inference_base` on `seeds` (mode eval)."""

    def one(seed: int) -> float | None:
        cid = f"{CID_PREFIX}eval-{uuid.uuid4().hex[:10]}"
        request = rollout_request(
            seed=seed, inference_url=f"{inference_base}/v1/chat/completions?cid={cid}", model=model_name,
            env_name=env_name, mode="eval", env_config={**(env_config or {}), "split": "eval"},
            policy_config=policy_config or {}, run_id=cid,
        )  # fmt: skip
        try:
            with TaskAppClient(task_url, api_key, rollout_timeout=300) as client:
                return float(client.rollout(request)["metrics"]["mean_return"])
        except TaskAppError as err:
            print(f"  seed {seed}: {err}", file=sys.stderr)
            return None

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        returns = list(pool.map(one, seeds))
    good = [r for r in returns if r is not None]
    mean = sum(good) / len(good) if good else 0.0
    return mean, len(good), len(returns) - len(good)


def _swap_weights(base: str, path: Path, version: int) -> bool:
    """Load new full weights into the running rollout server (POST /v1/weights); False when it cannot."""
    import httpx

    try:
        response = httpx.post(f"{base}/v1/weights", json={"path": str(path), "format": "full", "version": version},
                              timeout=600)  # fmt: skip
    except httpx.HTTPError:
        return False
    return response.status_code == 200


def evaluate_models(
    models: list[str],
    seeds: list[int],
    *,
    runs_dir: Path = RUNS_DIR,
    env_config: dict[str, Any] | None = None,
    policy_config: dict[str, Any] | None = None,
    max_model_len: int = 512,
    out: Any = None,
) -> list[EvalResult]:
    """Every model on the same held-out seeds, through one task app and one rollout server (the weights of
    the 2nd, 3rd... model are swapped in with POST /v1/weights; a fresh server when that fails). Models of
    different architectures need separate calls."""
    from posttrain import s3server

    out = out or sys.stdout
    results: list[EvalResult] = []
    run_dir = runs_dir / f"eval-{uuid.uuid4().hex[:8]}"
    logs = run_dir / "logs"
    api_key = "sk_env_eval_" + secrets.token_hex(8)
    with sigterm_as_keyboard_interrupt(), ProcessSet(run_dir / "pids.json") as procs:
        s3 = s3server.start(runs_dir / "s3")
        try:
            env = {**os.environ, **s3.env(), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
            task_url, _ = start_taskapp(procs, api_key=api_key, log_dir=logs)
            server: tuple[Any, str, str] | None = None  # (process, base url, served name)
            for index, model in enumerate(models):
                fine_tuned = model.startswith(("ft:", "rl:", "fft:", "qft:"))
                resolved = resolve_model(None if fine_tuned else model, model if fine_tuned else None,
                                         bucket=s3.bucket)  # fmt: skip
                started = time.monotonic()
                folder = materialize(resolved.model_path, run_dir / "models" / f"m{index}", s3)
                if server is not None and not _swap_weights(server[1], folder, index + 1):
                    print(
                        f"  (weight swap refused; starting a fresh server for {model})", file=out, flush=True
                    )
                    server[0].stop()
                    procs.processes.remove(server[0])
                    server = None
                if server is None:
                    port = free_port()
                    argv = _eval_server_argv(folder, port, resolved.base_model, max_model_len)
                    proc = procs.start(f"eval-{index}", argv, logs / f"rollout-{index}.log",
                                       env=_vllm_env(env, runs_dir, run_dir, 1))  # fmt: skip
                    base = f"http://127.0.0.1:{port}"
                    wait_http(f"{base}/health", timeout=900, proc=proc, interval=1.0)
                    server = (proc, base, resolved.base_model)
                mean, episodes, errors = evaluate_url(
                    task_url, api_key, server[1], server[2], seeds,
                    env_config=env_config, policy_config=policy_config,
                )  # fmt: skip
                result = EvalResult(model, mean, episodes, errors, time.monotonic() - started)
                print(f"eval {model}: mean_return {mean:.3f} on {episodes} held-out seeds"
                      f"{f' ({errors} errors)' if errors else ''} [{result.seconds:.0f} s]", file=out, flush=True)  # fmt: skip
                results.append(result)
        finally:
            procs.stop_all()
            s3.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.local.evaluate", description=__doc__)
    parser.add_argument(
        "--model", action="append", required=True, help="model id, folder or fine_tuned_model"
    )
    parser.add_argument("--seeds", default="1000000-1000063", help="e.g. 1000000-1000063 or 1,2,3")
    parser.add_argument("--env-config", default="{}", help="JSON env.config for the task app")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--runs-dir", type=Path, default=RUNS_DIR)
    parser.add_argument("--json-out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    results = evaluate_models(
        args.model, parse_seeds(args.seeds), runs_dir=args.runs_dir.resolve(),
        env_config=json.loads(args.env_config),
        policy_config={"temperature": args.temperature, "max_tokens": args.max_tokens},
    )  # fmt: skip
    if args.json_out:
        args.json_out.write_text(json.dumps([r.__dict__ for r in results], indent=2))
    return 0 if all(r.episodes for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
