"""`posttrain verify-task-app URL`: GET /health, GET /task_info (taskset and seeds 0-9), and one dry POST
/rollout, with a verdict per check. Exit 0 when every check passes, 1 when one fails, 2 on a usage mistake.

The dry rollout needs a policy the task app can call: `--inference-url URL --model NAME` names a real one
(an OpenAI-compatible server); otherwise, for a task app on this machine, a stub policy on 127.0.0.1 answers
every chat completion with a fixed text, which checks the request/response plumbing without a model.

`--in-cluster` is the trainer pod's init container: the operator's own check (posttrain.controller.verify:
GET /health and /task_info under one deadline each, bodies capped, addresses checked against the operator's
settings as it rendered them into the environment), retried with backoff for --retry-for seconds, printing
only fixed messages (never a byte of what the task app sent)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from posttrain.api.urls import CID_PREFIX
from posttrain.commands.argtypes import positive_float
from posttrain.errors import Problem, UserError
from posttrain.taskapp_client import Check, TaskAppClient, rollout_request, verify

LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}


class StubPolicy:
    """An OpenAI-compatible chat endpoint on 127.0.0.1 that answers every request with `reply`."""

    def __init__(self, reply: str = "42"):
        self.reply = reply
        self.requests: list[dict[str, Any]] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    body = {}
                stub.requests.append({"path": self.path, "body": body})
                n = int(body.get("n") or 1)
                answer = {
                    "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "stub"),
                    "choices": [
                        {
                            "index": i,
                            "message": {"role": "assistant", "content": stub.reply},
                            "finish_reason": "stop",
                        }
                        for i in range(n)
                    ],
                    "usage": {"prompt_tokens": 0, "completion_tokens": 1, "total_tokens": 1},
                }
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> StubPolicy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  ENVIRONMENT_API_KEY=sk_env_... posttrain verify-task-app http://127.0.0.1:8100
  posttrain verify-task-app https://task.example.com --no-rollout --json
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "verify-task-app",
        help="check a task app: /health, /task_info, one dry /rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("url", help="task app base URL, e.g. http://127.0.0.1:8100")
    parser.add_argument("--api-key-env", default="ENVIRONMENT_API_KEY", help="env var holding the key")
    parser.add_argument(
        "--inference-url", help="a real policy (OpenAI-compatible base URL) for the dry rollout"
    )
    parser.add_argument("--model", default="policy", help="model name sent with the dry rollout")
    parser.add_argument("--env-name", default="default")
    parser.add_argument("--seed", type=int, default=0, help="seed of the dry rollout")
    parser.add_argument(
        "--timeout", type=positive_float, default=10.0, help="seconds per request, > 0 (rollout: 30x)"
    )
    parser.add_argument("--no-rollout", action="store_true", help="only /health and /task_info")
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.add_argument(
        "--in-cluster",
        action="store_true",
        help="the trainer's init container: the operator's check (no rollout), fixed messages only",
    )
    parser.add_argument(
        "--retry-for", type=positive_float, default=300.0, help="--in-cluster: retry with backoff this long"
    )
    parser.set_defaults(func=run)


def check_url_argument(url: str) -> str:
    from posttrain.api.urls import UrlRefused, check_url

    try:
        return check_url(url)
    except UrlRefused as err:
        raise UserError(Problem(f"the task app URL {err.reason}", field="url", fix=err.fix)) from None


def run_in_cluster(args: argparse.Namespace) -> int:
    """The operator's prober, retried; one fixed line per attempt, exit 0 (verified) or 1."""
    import asyncio

    from posttrain.controller.verify import TaskAppProber, VerifyPolicy, policy_from_env, verify_with_retries

    url = check_url_argument(args.url)
    api_key = os.environ.get(args.api_key_env) or None
    policy = VerifyPolicy(timeout_seconds=args.retry_for, request_timeout=args.timeout)

    async def main() -> bool:
        prober = TaskAppProber(addresses=policy_from_env())
        try:

            async def pending(verification) -> None:  # noqa: ANN001 (posttrain.controller.status.Verification)
                print(f"verify-task-app: {verification.reason}: {verification.message}", flush=True)

            result = await verify_with_retries(
                lambda: prober.check(url, api_key, deadline=policy.request_timeout),
                policy,
                "task app",
                on_attempt=pending,
            )
        finally:
            await prober.close()
        print(f"verify-task-app: {result.reason}: {result.message}", flush=True)
        return result.state == "ok"

    return 0 if asyncio.run(main()) else 1


def run(args: argparse.Namespace) -> int:
    if args.in_cluster:
        return run_in_cluster(args)
    check_url_argument(args.url)
    parts = urlsplit(args.url.strip())
    api_key = os.environ.get(args.api_key_env)
    if not api_key:
        raise UserError(
            Problem(
                f"environment variable {args.api_key_env} is not set",
                fix=f"export {args.api_key_env}=<the task app's key> or pass --api-key-env NAME",
            )
        )
    aliases = [a.strip() for a in os.environ.get("ENVIRONMENT_API_KEY_ALIASES", "").split(",") if a.strip()]
    client = TaskAppClient(
        args.url, api_key, aliases, timeout=args.timeout, rollout_timeout=args.timeout * 30
    )
    stub: StubPolicy | None = None
    request = None
    note = ""
    try:
        if not args.no_rollout:
            inference = args.inference_url
            if not inference and (parts.hostname or "") in LOOPBACK_HOSTS:
                stub = StubPolicy().__enter__()
                inference = stub.url
                note = " (stub policy on loopback)"
            if inference:
                cid = f"{CID_PREFIX}verify-{uuid.uuid4().hex[:10]}"
                sep = "&" if "?" in inference else "?"
                request = rollout_request(
                    seed=args.seed,
                    inference_url=f"{inference}{sep}cid={cid}",
                    model=args.model,
                    env_name=args.env_name,
                    mode="rl",
                    run_id=cid,
                    policy_config={"temperature": 0.0, "max_tokens": 32},
                )
        checks = verify(client, key_env=args.api_key_env, rollout=request)
        if request is None and not args.no_rollout:
            checks.append(
                Check("rollout", None, "skipped: remote task app; pass --inference-url and --model")
            )
    finally:
        client.close()
        if stub is not None:
            stub.__exit__(None, None, None)

    failed = [c for c in checks if c.ok is False]
    if args.json:
        print(
            json.dumps(
                [{"check": c.name, "verdict": c.verdict, "detail": c.detail} for c in checks], indent=2
            )
        )
    else:
        print(f"verify-task-app {args.url} (key from ${args.api_key_env})")
        for check in checks:
            extra = note if check.name == "rollout" and check.ok else ""
            print(f"  {check.verdict}  {check.name:<10} {check.detail}{extra}")
        print(f"verdict: {'FAILED' if failed else 'OK'}")
    sys.stdout.flush()
    return 1 if failed else 0
