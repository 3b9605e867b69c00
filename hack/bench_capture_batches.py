"""The trainer's rollout client: its own CPU seconds per batch of rollouts as it runs now (the rollouts in
flight spread over HTTP clients of 16 connections, the captures taken in batches: POST /v1/captures,
posttrain_trainer.capture_batches) against the baseline, the client before 2026-11-29 (one client of
2 x concurrency connections, one capture request per rollout: here GET ?pop=true, what the trainer still
falls back to against a rollout server without the batch route; it was GET then DELETE), and, to tell the
two changes apart, the spread clients with a request per rollout. Same process, interleaved per round.

Each side has its own server process (uvicorn, 127.0.0.1): the rollout server's own app
(posttrain_rollout.server.create_app) plus a task-app route, POST /rollout, that waits `--episode-ms` as an
episode would, records one capture of the demo's size under the rollout's cid (as the policy call would)
and answers one step; the baseline's server lacks POST /v1/captures. The client is the trainer's
RolloutClient.collect over `--rollouts` specs at the demo's concurrency (128), so everything the trainer
does per rollout is in the figures; vLLM is not (hack/bench_rollout.py measures the proxy beside it).

Printed: per side the client's CPU seconds and wall seconds per round (median and spread), and the ratios
of the medians baseline / side (> 1: cheaper than the baseline). The client's CPU is what matters: on a 2-core
machine it is taken from the cores vLLM samples on.

Not a test: `make bench`, or `.venv/bin/python hack/bench_capture_batches.py [--rounds 6] [--rollouts 512]`."""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from abtiming import Series, ratio_of_medians, spread_line, uptime
from fastapi import Request

REPO = Path(__file__).resolve().parents[1]
for part in ("operator", "trainer_image", "rollout_image"):
    sys.path.insert(0, str(REPO / part))

# one single-turn math episode's capture, the demo's size: a ~46-token prompt, 16 sampled tokens
CAPTURE = {"prompt_token_ids": list(range(46)), "completion_token_ids": list(range(16)),
           "logprobs": [-0.25] * 16, "weight_version": 3, "finish_reason": "stop"}  # fmt: skip


def serve(port: int, batch_route: bool, episode_ms: float) -> None:
    import uvicorn
    from posttrain_rollout.server import Proxy, create_app

    proxy = Proxy("http://127.0.0.1:9", served_model_name="m")  # vLLM is never called here
    app = create_app(proxy)
    if not batch_route:
        app.router.routes = [
            r for r in app.router.routes
            if not (getattr(r, "path", "") == "/v1/captures" and "POST" in getattr(r, "methods", ()))
        ]  # fmt: skip

    @app.post("/rollout")
    async def rollout(request: Request):
        body = await request.json()
        url = body["policy"]["config"]["inference_url"]
        cid = parse_qs(urlsplit(url).query)["cid"][0]
        await asyncio.sleep(episode_ms / 1000)
        proxy.captures.add(cid, [dict(CAPTURE)])
        step = {"obs": {}, "tool_calls": [], "reward": 1.0, "done": True}
        return {"run_id": body["run_id"], "trajectories": [{"steps": [step]}],
                "metrics": {"episode_returns": [1.0], "mean_return": 1.0, "num_steps": 1}}  # fmt: skip

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


def start_server(batch_route: bool, episode_ms: float) -> tuple[subprocess.Popen, str]:
    import httpx
    from posttrain.localhost import free_port

    port = free_port()
    argv = [sys.executable, __file__, "--serve", str(port), "--episode-ms", str(episode_ms)]
    argv += [] if batch_route else ["--no-batch-route"]
    proc = subprocess.Popen(argv)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/v1/captures", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the benchmark's server on {url} did not start")


def one_round(client, url: str, rollouts: int, round_no: int) -> tuple[float, float]:
    from posttrain_trainer.rollouts import plan_rollouts

    specs = plan_rollouts("bench", round_no, range(rollouts // 8), 8, [url])
    cpu0, wall0 = time.process_time(), time.perf_counter()
    results = asyncio.run(client.collect(specs))
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    failed = [r.error for r in results if not r.ok]
    if failed or sum(len(r.sequences) for r in results) != len(specs):
        raise SystemExit(f"{len(failed)} rollouts failed, e.g. {failed[:1]}")
    return cpu, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6, help="timed rounds per side (after one warm-up each)")
    parser.add_argument("--rollouts", type=int, default=512, help="rollouts per round (groups of 8)")
    parser.add_argument("--concurrency", type=int, default=128, help="rollouts in flight (the demo's 128)")
    parser.add_argument("--episode-ms", type=float, default=20.0, help="how long the task app takes an episode")
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-batch-route", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, not args.no_batch_route, args.episode_ms)
        return 0

    from posttrain.api.rollout_settings import RolloutSettings
    from posttrain_trainer.rollouts import RolloutClient

    settings = RolloutSettings(concurrency=args.concurrency)
    base = "baseline: one pool, per cid"
    sides = {  # name: (the server has POST /v1/captures, rollouts in flight per HTTP client)
        base: (False, 2 * args.concurrency),
        "spread pools, per cid": (False, None),
        "spread pools, batches (now)": (True, None),
    }
    servers = {route: start_server(route, args.episode_ms) for route in (False, True)}
    cpu = {name: Series(name) for name in sides}
    wall = {name: Series(name) for name in sides}
    try:
        for round_no in range(args.rounds + 1):  # round 0: every side's warm-up
            for name, (route, per_client) in sides.items():
                url = servers[route][1]
                client = RolloutClient(task_url=url, settings=settings, model="m", api_key="k")
                client.connections_per_client = per_client or client.connections_per_client
                spent, took = one_round(client, url, args.rollouts, round_no)
                if round_no:
                    cpu[name].add(spent)
                    wall[name].add(took)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    print(f"{args.rollouts} rollouts a round at concurrency {args.concurrency}, {args.rounds} rounds per side, "
          f"episodes of {args.episode_ms:g} ms; {uptime()}")  # fmt: skip
    for name in sides:
        print(f"  {name:>28}: client CPU {spread_line(cpu[name].summary(cpu[name].seconds), 's', '.2f')}; "
              f"wall {spread_line(wall[name].summary(wall[name].seconds), 's', '.2f')}")  # fmt: skip
    for name in list(sides)[1:]:
        print(f"baseline / {name}: client CPU per round {ratio_of_medians(cpu[base].seconds, cpu[name].seconds):.2f}x, "
              f"wall {ratio_of_medians(wall[base].seconds, wall[name].seconds):.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
