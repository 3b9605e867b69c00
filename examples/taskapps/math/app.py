"""A math task app that speaks the synth task-app contract (GET /, /health, /info, /task_info; POST /rollout).

Each seed maps deterministically to one arithmetic problem, "What is a + b? Reply with only the number.".
The policy answers through `policy.config.inference_url` (an OpenAI-compatible endpoint, its `?cid=` query
kept); the reward is 1.0 when the last number in the answer equals the result, else 0.0.

Splits: `train` and `eval` draw from disjoint problem sets (a problem belongs to the eval set when a hash
of (a, op, b) falls in a 1-in-`EVAL_FRACTION` bucket), so held-out accuracy measures generalisation. The
split comes from `env.config.split`, or from the seed: seeds >= 1_000_000 are eval seeds.

Difficulty (`env.config`, all optional): `difficulty` = easy (1-digit + 1-digit) | medium (2-digit +
1-digit, default) | hard (2-digit + 2-digit) | expert (3-digit + 2-digit), or explicit `a_digits`,
`b_digits`; `operations` = ["+"] (default) or any of "+", "-", "*"; `reward` = "last_number" (default) or
"exact" (the whole answer must be only the number).

Auth: the server accepts ENVIRONMENT_API_KEY (fallbacks dev_environment_api_key, DEV_ENVIRONMENT_API_KEY)
and the comma-separated ENVIRONMENT_API_KEY_ALIASES; requests send X-API-Key, X-API-Keys (CSV) or
Authorization: Bearer. No key configured -> 503 missing_environment_api_key; a missing or wrong key -> 400
unauthorised (synth's code; no key prefixes are echoed). GET / needs no key (use it for probes).

Run: `python examples/taskapps/math/app.py --port 8000` (binds 127.0.0.1; --host 0.0.0.0 in a container).
Needs only fastapi, uvicorn, httpx and pydantic.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import random
import re
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

APP_ID = "math"
APP_NAME = "Arithmetic (single step)"
VERSION = "1.0.0"
EVAL_SEED_START = 1_000_000
EVAL_FRACTION = 8  # one problem in 8 is held out for eval
DIFFICULTIES: dict[str, tuple[int, int]] = {
    "easy": (1, 1),
    "medium": (2, 1),
    "hard": (2, 2),
    "expert": (3, 2),
}
DEFAULT_DIFFICULTY = "medium"
OPERATIONS = ("+", "-", "*")
PROMPT = "What is {a} {op} {b}? Reply with only the number."
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 64}
# Keys of policy.config forwarded to the chat-completions body as they are (vLLM / OpenAI sampling knobs).
FORWARDED_POLICY_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "stop",
    "stop_sequences",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logprobs",
    "top_logprobs",
    "thinking_mode",
    "thinking_budget",
    "tools",
    "tool_choice",
    "chat_template_kwargs",
)

RUBRIC = {
    "outcome": {
        "name": "correct_answer",
        "criteria": [
            {
                "id": "last_number_correct",
                "description": "The last number in the reply equals the exact result of the arithmetic problem.",
                "weight": 1.0,
            }
        ],
    },
    "events": None,
}


# --------------------------------------------------------------------------------------------- problems


class ProblemError(ValueError):
    """A bad env.config (difficulty, operations, digits)."""


def _digit_range(digits: int) -> tuple[int, int]:
    if digits < 1 or digits > 6:
        raise ProblemError(f"digits must be between 1 and 6, got {digits}")
    return (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1


def problem_settings(env_config: dict[str, Any] | None) -> dict[str, Any]:
    """Normalise env.config into {difficulty, a_digits, b_digits, operations, reward}."""
    config = dict(env_config or {})
    difficulty = str(config.get("difficulty", DEFAULT_DIFFICULTY))
    if difficulty not in DIFFICULTIES and not ("a_digits" in config and "b_digits" in config):
        raise ProblemError(f"unknown difficulty {difficulty!r}; expected one of {sorted(DIFFICULTIES)}")
    a_digits, b_digits = DIFFICULTIES.get(difficulty, DIFFICULTIES[DEFAULT_DIFFICULTY])
    try:
        a_digits = int(config.get("a_digits", a_digits))
        b_digits = int(config.get("b_digits", b_digits))
    except (TypeError, ValueError) as exc:
        raise ProblemError("a_digits and b_digits must be integers") from exc
    _digit_range(a_digits), _digit_range(b_digits)
    operations = config.get("operations", ["+"])
    if isinstance(operations, str):
        operations = [operations]
    if not operations or any(op not in OPERATIONS for op in operations):
        raise ProblemError(f"operations must be a non-empty list of {list(OPERATIONS)}, got {operations!r}")
    reward = str(config.get("reward", "last_number"))
    if reward not in ("last_number", "exact"):
        raise ProblemError(f"reward must be 'last_number' or 'exact', got {reward!r}")
    return {
        "difficulty": difficulty,
        "a_digits": a_digits,
        "b_digits": b_digits,
        "operations": list(operations),
        "reward": reward,
    }


def split_of(seed: int, requested: str | None = None) -> str:
    """The split of a seed: an explicit 'train'/'eval' wins; otherwise seeds >= 1_000_000 are eval seeds."""
    if requested in ("train", "eval"):
        return requested
    if requested not in (None, "", "default"):
        raise ProblemError(f"split must be 'train' or 'eval', got {requested!r}")
    return "eval" if seed >= EVAL_SEED_START else "train"


def _is_eval_problem(a: int, op: str, b: int) -> bool:
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return digest[0] % EVAL_FRACTION == 0


def make_problem(
    seed: int, env_config: dict[str, Any] | None = None, split: str | None = None
) -> dict[str, Any]:
    """The problem for a seed: deterministic in (seed, split, settings); train and eval problems disjoint."""
    settings = problem_settings(env_config)
    split = split_of(seed, split)
    rng = random.Random(f"{APP_ID}:{split}:{seed}:{settings['a_digits']}:{settings['b_digits']}")
    a_lo, a_hi = _digit_range(settings["a_digits"])
    b_lo, b_hi = _digit_range(settings["b_digits"])
    want_eval = split == "eval"
    for _ in range(10_000):
        a, b = rng.randint(a_lo, a_hi), rng.randint(b_lo, b_hi)
        op = rng.choice(settings["operations"])
        if _is_eval_problem(a, op, b) == want_eval:
            break
    answer = {"+": a + b, "-": a - b, "*": a * b}[op]
    return {
        "seed": seed,
        "split": split,
        "a": a,
        "b": b,
        "op": op,
        "answer": answer,
        "question": PROMPT.format(a=a, op=op, b=b),
        "settings": settings,
    }


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def last_number(text: str) -> float | None:
    """The last number in a text ('1,234' -> 1234, '12.0' -> 12.0), or None."""
    found = _NUMBER.findall(text or "")
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def score(problem: dict[str, Any], text: str) -> tuple[float, float | None]:
    """(reward, parsed answer)."""
    parsed = last_number(text)
    correct = parsed is not None and parsed == float(problem["answer"])
    if problem["settings"]["reward"] == "exact":
        correct = correct and re.fullmatch(r"\s*-?[\d,]+(?:\.0+)?\s*\.?\s*", text or "") is not None
    return (1.0 if correct else 0.0), parsed


# ------------------------------------------------------------------------------------------------- auth


def allowed_keys() -> list[str]:
    primary = (
        os.environ.get("ENVIRONMENT_API_KEY")
        or os.environ.get("dev_environment_api_key")  # noqa: SIM112 (synth spells it so)
        or os.environ.get("DEV_ENVIRONMENT_API_KEY")
        or ""
    ).strip()
    keys = [primary] if primary else []
    for alias in os.environ.get("ENVIRONMENT_API_KEY_ALIASES", "").split(","):
        if alias.strip():
            keys.append(alias.strip())
    return keys


def presented_keys(request: Request) -> list[str]:
    candidates: list[str] = []
    for header in ("x-api-key", "x-api-keys"):
        value = request.headers.get(header)
        if value:
            candidates += value.split(",")
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        candidates += auth[7:].split(",")
    return [c.strip() for c in candidates if c.strip()]


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"detail": {"error": {"code": code, "message": message, **extra}}}
    )


def auth_failure(request: Request) -> JSONResponse | None:
    """None when the request carries an allowed key; else the synth error response (503 or 400)."""
    keys = allowed_keys()
    if not keys:
        return _error(
            503,
            "missing_environment_api_key",
            "the task app has no ENVIRONMENT_API_KEY configured; set it in the task app's environment",
        )
    got = presented_keys(request)
    for candidate in got:
        if any(hmac.compare_digest(candidate.encode(), key.encode()) for key in keys):
            return None
    message = "API key missing or invalid" if got else "API key missing: send X-API-Key"
    return _error(400, "unauthorised", message, got_count=len(got))


# ---------------------------------------------------------------------------------------------- models


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class EnvSpec(_Open):
    env_id: str | None = None
    env_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None


class PolicySpec(_Open):
    policy_id: str | None = None
    policy_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class RecordSpec(_Open):
    trajectories: bool = True
    logprobs: bool = False
    value: bool = False
    return_trace: bool = False
    trace_format: str = "compact"


class SafetySpec(_Open):
    max_ops: int = 100_000
    max_time_s: float = 3600.0


class RolloutRequest(_Open):
    run_id: str
    mode: str
    env: EnvSpec
    policy: PolicySpec
    ops: list[Any] = Field(default_factory=lambda: ["agent", "env"])
    record: RecordSpec = Field(default_factory=RecordSpec)
    on_done: str = "reset"
    safety: SafetySpec = Field(default_factory=SafetySpec)
    training_session_id: str | None = None
    synth_base_url: str | None = None


# --------------------------------------------------------------------------------------- inference url


def chat_completions_url(inference_url: str) -> str:
    """Append /v1/chat/completions (or /chat/completions after /v1) unless the path has it; keep the query.
    Repairs the known malformed shape `...?cid=x/v1/chat/completions`."""
    parts = urlsplit(inference_url)
    path, query = parts.path, parts.query
    if "/" in query and ("/v1" in query or "/chat" in query):
        cut = query.find("/")
        query, stray = query[:cut], query[cut:]
        if not path.rstrip("/").endswith("/chat/completions"):
            path = path.rstrip("/") + stray
    stripped = path.rstrip("/")
    if not stripped.endswith("/chat/completions"):
        if stripped.endswith("/v1"):
            stripped += "/chat/completions"
        elif stripped.endswith("/chat"):
            stripped += "/completions"
        else:
            stripped += "/v1/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, stripped, query, parts.fragment))


def correlation_id(inference_url: str, policy_config: dict[str, Any]) -> str | None:
    if policy_config.get("trace_correlation_id"):
        return str(policy_config["trace_correlation_id"])
    query = parse_qs(urlsplit(inference_url).query)
    for key in ("cid", "trace", "trace_correlation_id"):
        if query.get(key):
            return query[key][0].split("/")[0]
    return None


# ------------------------------------------------------------------------------------------------- app


def descriptor() -> dict[str, Any]:
    return {
        "id": APP_ID,
        "name": APP_NAME,
        "description": "Single-step arithmetic: one question per seed, reward 1 when the last number is right.",
        "version": VERSION,
    }


def dataset_info() -> dict[str, Any]:
    return {
        "id": "math-arithmetic",
        "name": "Generated arithmetic problems",
        "version": VERSION,
        "splits": ["train", "eval"],
        "default_split": "train",
        "eval_seed_start": EVAL_SEED_START,
        "difficulties": {k: {"a_digits": a, "b_digits": b} for k, (a, b) in DIFFICULTIES.items()},
        "default_difficulty": DEFAULT_DIFFICULTY,
        "operations": list(OPERATIONS),
    }


LIMITS = {"max_turns": 1, "max_response_tokens": 512, "timeout_seconds": 120}


def task_info_for(seed: int, split: str | None, env_config: dict[str, Any]) -> dict[str, Any]:
    problem = make_problem(seed, env_config, split)
    return {
        "task": descriptor(),
        "environment": APP_ID,
        "dataset": {**dataset_info(), "split": problem["split"]},
        "rubric": RUBRIC,
        "inference": {"supports_proxy": False},
        "limits": LIMITS,
        "task_metadata": {
            "seed": seed,
            "split": problem["split"],
            "question": problem["question"],
            "difficulty": problem["settings"]["difficulty"],
        },
        "observation": {"type": "text", "prompt": problem["question"]},
    }


def create_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if app.state.http is not None:
            await app.state.http.aclose()

    app = FastAPI(title="posttrain math task app", version=VERSION, lifespan=lifespan)
    app.state.http = None

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        # Auth comes first: an unauthenticated caller learns nothing about the request schema.
        failure = auth_failure(request)
        if failure is not None:
            return failure
        problems = [
            {"loc": list(err.get("loc", [])), "msg": err.get("msg", ""), "type": err.get("type", "")}
            for err in exc.errors()
        ]
        return JSONResponse(
            status_code=422,
            content={
                "detail": {
                    "error": {"code": "invalid_request", "message": "malformed request", "problems": problems}
                }
            },
        )

    async def client() -> httpx.AsyncClient:
        if app.state.http is None:
            app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
        return app.state.http

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict[str, Any]:
        return {"status": "ok", "service": APP_ID}

    @app.get("/health")
    async def health(request: Request) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        return {"healthy": True, "service": APP_ID, "auth": {"required": True}}

    @app.get("/info")
    async def info(request: Request) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        return {
            "service": {"task": descriptor(), "version": VERSION},
            "dataset": dataset_info(),
            "rubrics": RUBRIC,
            "inference": {"supports_proxy": False},
            "limits": LIMITS,
        }

    @app.get("/task_info")
    async def task_info(
        request: Request,
        seed: Annotated[list[int] | None, Query()] = None,
        seeds: str | None = Query(default=None),
        split: str | None = Query(default=None),
        difficulty: str | None = Query(default=None),
    ) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        wanted = list(seed or [])
        if seeds:
            try:
                wanted += [int(s) for s in seeds.split(",") if s.strip()]
            except ValueError:
                return _error(422, "invalid_request", "seeds must be a comma-separated list of integers")
        if not wanted:
            return {"taskset": {**descriptor(), "dataset": dataset_info(), "rubric": RUBRIC}}
        env_config = {"difficulty": difficulty} if difficulty else {}
        try:
            infos = [task_info_for(s, split, env_config) for s in wanted]
        except ProblemError as exc:
            return _error(422, "invalid_env_config", str(exc))
        return infos[0] if len(infos) == 1 else infos

    @app.post("/rollout")
    async def rollout(request: Request, body: RolloutRequest) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        return await run_rollout(body, await client())

    @app.post("/done")
    async def done(request: Request) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        return {"ok": True, "service": APP_ID}

    return app


async def run_rollout(body: RolloutRequest, http: httpx.AsyncClient) -> Any:
    if body.mode not in ("rl", "eval"):
        return _error(422, "invalid_request", f"mode must be 'rl' or 'eval', got {body.mode!r}")
    seed = body.env.seed if body.env.seed is not None else 0
    if seed < 0:
        return _error(422, "invalid_request", "env.seed must be >= 0")
    config = dict(body.env.config or {})
    try:
        problem = make_problem(seed, config, config.get("split"))
    except ProblemError as exc:
        return _error(422, "invalid_env_config", str(exc))

    policy_config = dict(body.policy.config or {})
    inference_url = policy_config.get("inference_url")
    if not inference_url or not isinstance(inference_url, str):
        return _error(400, "missing_inference_url", "policy.config.inference_url is required")
    cid = correlation_id(inference_url, policy_config)
    if body.mode == "rl" and not cid:
        return _error(
            400,
            "missing_correlation_id",
            "mode 'rl' needs a correlation id: add ?cid=<id> to policy.config.inference_url",
        )
    url = chat_completions_url(inference_url)

    messages: list[dict[str, Any]] = []
    if policy_config.get("system_prompt"):
        messages.append({"role": "system", "content": str(policy_config["system_prompt"])})
    messages.append({"role": "user", "content": problem["question"]})
    payload: dict[str, Any] = {"model": policy_config.get("model") or "policy", "messages": messages}
    payload.update(DEFAULT_SAMPLING)
    for key in FORWARDED_POLICY_KEYS:
        if key in policy_config and policy_config[key] is not None:
            payload["stop" if key == "stop_sequences" else key] = policy_config[key]
    if body.mode == "eval" and "temperature" not in policy_config:
        payload["temperature"] = 0.0

    timeout = min(float(body.safety.max_time_s), float(policy_config.get("timeout_s", 300.0)))
    started = time.monotonic()
    try:
        response = await http.post(url, json=payload, timeout=timeout)
    except httpx.HTTPError as exc:
        return _error(
            502, "inference_unreachable", f"policy inference call failed: {type(exc).__name__}: {exc}"
        )
    if response.status_code >= 400:
        return _error(
            502,
            "inference_failed",
            f"policy inference returned HTTP {response.status_code}",
            upstream_status=response.status_code,
            upstream_body=response.text[:500],
        )
    try:
        completion = response.json()
        choices = completion["choices"]
        assert isinstance(choices, list) and choices
    except Exception:
        return _error(502, "inference_bad_response", "policy inference returned no choices")
    latency = time.monotonic() - started

    trajectories, returns = [], []
    for index, choice in enumerate(choices):
        message = choice.get("message") or {}
        text = message.get("content") or choice.get("text") or ""
        reward, parsed = score(problem, text)
        returns.append(reward)
        step = {
            "obs": {"question": problem["question"], "messages": messages},
            "tool_calls": [{"tool": "submit_answer", "args": {"answer": text}}],
            "reward": reward,
            "done": True,
            "truncated": choice.get("finish_reason") == "length",
            "info": {
                "correct": reward > 0,
                "expected": problem["answer"],
                "parsed_answer": parsed,
                "response": text,
                "finish_reason": choice.get("finish_reason"),
                "choice_index": index,
                "meta": {"inference_url": inference_url},
            },
        }
        trajectories.append(
            {
                "env_id": f"{APP_ID}::{problem['split']}::{seed}",
                "policy_id": body.policy.policy_id or body.policy.policy_name or "policy",
                "steps": [step],
                "final": {"reward": reward, "observation": {"answer": problem["answer"]}},
                "length": 1,
                "inference_url": inference_url,
                "decision_samples": None,
            }
        )
    mean_return = sum(returns) / len(returns)
    usage = completion.get("usage") or {}
    # pass@k of this problem when the policy gave several answers (policy.config n > 1): pass@1 is the share
    # of right answers, pass@n whether any was right
    pass_at_k = {"1": mean_return, str(len(returns)): float(any(returns))} if len(returns) > 1 else None
    return {
        "run_id": body.run_id,
        "trajectories": trajectories if body.record.trajectories else [],
        "branches": {},
        "metrics": {
            "episode_returns": returns,
            "mean_return": mean_return,
            "num_steps": len(returns),
            "num_episodes": len(returns),
            "outcome_score": mean_return,
            "events_score": None,
            "details": {
                "seed": seed,
                "split": problem["split"],
                "expected": problem["answer"],
                "latency_s": round(latency, 4),
                "completion_tokens": usage.get("completion_tokens"),
                **({"pass_at_k": pass_at_k} if pass_at_k else {}),
            },
        },
        "aborted": False,
        "ops_executed": 2 * len(returns),
        "trace_correlation_id": cid,
        "trace": None,
        "pipeline_metadata": {
            "inference_url": inference_url,
            "trace_correlation_id": cid,
            "task_id": APP_ID,
            "split": problem["split"],
            "seed": seed,
            "model": payload["model"],
            "request_id": completion.get("id") or str(uuid.uuid4()),
        },
    }


app = create_app()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="posttrain math task app (synth task-app contract)")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "warning"))
    args = parser.parse_args(argv)
    # Bind first, so that the address printed is the one served (also with --port 0: a free port).
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    for line in startup_lines(args.host, sock.getsockname()[1], allowed_keys()):
        print(line, file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level=args.log_level))
    server.run(sockets=[sock])


def startup_lines(host: str, port: int, keys: list[str]) -> list[str]:
    """What the app says when it starts: where it listens and whether requests can authenticate (never a
    key, only how many there are)."""
    shown = f"[{host}]" if ":" in host else host
    lines = [f"posttrain math task app {VERSION}: listening on http://{shown}:{port} "
             f"({len(keys)} API key(s) configured)"]  # fmt: skip
    if not keys:
        lines.append(
            "warning: no API key configured (ENVIRONMENT_API_KEY, DEV_ENVIRONMENT_API_KEY or "
            "ENVIRONMENT_API_KEY_ALIASES): every request except GET / answers 503 missing_environment_api_key "
            "(fix: export ENVIRONMENT_API_KEY=<a key> and restart)"
        )
    return lines


if __name__ == "__main__":
    main()
