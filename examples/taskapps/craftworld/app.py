"""Craftworld: a multi-step task app on the synth task-app contract (GET /, /health, /info, /task_info;
POST /rollout, /done), the world in craftworld.py (gather, then craft, in Crafter's chains; microseconds a step).

One rollout is one episode of many turns. Each `agent` op asks the policy (`policy.config.inference_url`, its
`?cid=` kept) with the whole conversation so far and the `act` tool; each `env` op applies the decision's
actions (the tool call's `actions`/`action`, or the first action named or numbered in a text reply; none is a
noop counted as invalid) and appends the result as the tool's reply (as a user turn after a text reply).
The episode ends when the ops run out, at `max_steps_per_episode` (env.config, default 10) or on a diamond.
Each observation is a few lines: the last result, the step, area, inventory and achievements, and last the
legal actions (craftworld.legal_actions); the system prompt is two sentences (policy.config.system_prompt
replaces it).

Rewards, as synth's Crafter app gives them:
  - steps[].reward: the unique achievements the decision unlocked (so the return counts distinct achievements);
  - with a `step_rewards` block (policy.config first, then env.config) enabled in mode decision_stepwise:
    steps[].info.meta.decision_rewards = {turn, ach_delta, unique_delta, all, unique} (absolute and unique
    achievement deltas), steps[].info.stepwise (the strategy's credit), trajectory.decision_samples, and
    metrics.details.stepwise (sums);
  - metrics.outcome_score: distinct achievements / all achievements (the outcome rubric);
    metrics.events_score: the share of decisions that unlocked a new achievement (the events rubric).
Traces: record.return_trace = true adds `trace` (session id, metadata, one event per decision; with
trace_format "full" or "structured" also the message history).

Splits: seeds >= 1_000_000 (or env.config.split = "eval") draw their worlds from the held-out generator.
Auth as the math app: ENVIRONMENT_API_KEY (+ ENVIRONMENT_API_KEY_ALIASES) via X-API-Key, X-API-Keys or
Bearer; none configured -> 503, missing/wrong -> 400. Run: `python examples/taskapps/craftworld/app.py --port
8000` (binds 127.0.0.1; --host 0.0.0.0 in a container). Needs fastapi, uvicorn, httpx, pydantic."""

from __future__ import annotations

import argparse
import hmac
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

sys.path.insert(0, str(Path(__file__).resolve().parent))  # craftworld.py beside this file, also when imported
import craftworld as W  # noqa: E402

APP_ID = "craftworld"
VERSION = "1.0.0"
EVAL_SEED_START = 1_000_000
MAX_TOOL_CALLS = 4
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 48}
FORWARDED_POLICY_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "max_tokens", "max_completion_tokens", "seed", "stop",
    "repetition_penalty", "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs",
    "thinking_mode", "thinking_budget", "chat_template_kwargs", "response_format", "structured_outputs",
)  # fmt: skip
# Short: each observation names the area and the legal actions, so the prompt needs no rules or action list.
SYSTEM_PROMPT = (
    "You play Craftworld: gather and craft to unlock new achievements (wood -> table -> pickaxe -> stone ...). "
    "Each turn, pick one of the legal actions: reply with its name, or call the act tool."
)
ACT_TOOL = {
    "type": "function",
    "function": {
        "name": "act",
        "description": "Take up to four actions in order, in one turn.",
        "parameters": {
            "type": "object",
            "properties": {
                "actions": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(W.ACTIONS)},
                    "minItems": 1,
                    "maxItems": W.MAX_ACTIONS_PER_DECISION,
                }
            },
            "required": ["actions"],
        },
    },
}
RUBRIC = {
    "outcome": {
        "name": "achievements",
        "criteria": [
            {
                "id": "distinct_achievements",
                "description": "Share of the world's achievements unlocked in the episode.",
                "weight": 1.0,
            }
        ],
    },
    "events": {
        "name": "unique_achievement_events",
        "criteria": [
            {
                "id": "new_achievement",
                "description": "A decision unlocks an achievement the episode had not unlocked before.",
                "weight": 1.0,
            }
        ],
    },
}
LIMITS = {"max_turns": W.DEFAULT_MAX_STEPS, "max_response_tokens": 512, "timeout_seconds": 600}


# ------------------------------------------------------------------------------------------------- auth


def allowed_keys() -> list[str]:
    primary = (
        os.environ.get("ENVIRONMENT_API_KEY")
        or os.environ.get("dev_environment_api_key")  # noqa: SIM112 (synth spells it so)
        or os.environ.get("DEV_ENVIRONMENT_API_KEY")
        or ""
    ).strip()
    keys = [primary] if primary else []
    keys += [a.strip() for a in os.environ.get("ENVIRONMENT_API_KEY_ALIASES", "").split(",") if a.strip()]
    return keys


def presented_keys(request: Request) -> list[str]:
    candidates: list[str] = []
    for header in ("x-api-key", "x-api-keys"):
        if request.headers.get(header):
            candidates += request.headers[header].split(",")
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        candidates += auth[7:].split(",")
    return [c.strip() for c in candidates if c.strip()]


def _error(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse(
        status_code=status, content={"detail": {"error": {"code": code, "message": message, **extra}}}
    )


def auth_failure(request: Request) -> JSONResponse | None:
    keys = allowed_keys()
    if not keys:
        return _error(
            503, "missing_environment_api_key", "the task app has no ENVIRONMENT_API_KEY configured"
        )
    got = presented_keys(request)
    for candidate in got:
        if any(hmac.compare_digest(candidate.encode(), key.encode()) for key in keys):
            return None
    return _error(400, "unauthorised", "API key missing or invalid", got_count=len(got))


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
    ops: list[Any] = Field(default_factory=lambda: ["agent", "env"] * W.DEFAULT_MAX_STEPS)
    record: RecordSpec = Field(default_factory=RecordSpec)
    on_done: str = "reset"
    safety: SafetySpec = Field(default_factory=SafetySpec)
    training_session_id: str | None = None
    synth_base_url: str | None = None


# --------------------------------------------------------------------------------------- inference url


def chat_completions_url(inference_url: str) -> str:
    """Append /v1/chat/completions unless the path has it; keep the query (and repair `?cid=x/v1/...`)."""
    parts = urlsplit(inference_url)
    path, query = parts.path, parts.query
    if "/" in query and ("/v1" in query or "/chat" in query):
        cut = query.find("/")
        query, stray = query[:cut], query[cut:]
        if not path.rstrip("/").endswith("/chat/completions"):
            path = path.rstrip("/") + stray
    stripped = path.rstrip("/")
    if not stripped.endswith("/chat/completions"):
        stripped += "/chat/completions" if stripped.endswith("/v1") else "/v1/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, stripped, query, parts.fragment))


def correlation_id(inference_url: str, policy_config: dict[str, Any]) -> str | None:
    if policy_config.get("trace_correlation_id"):
        return str(policy_config["trace_correlation_id"])
    query = parse_qs(urlsplit(inference_url).query)
    for key in ("cid", "trace", "trace_correlation_id"):
        if query.get(key):
            return query[key][0].split("/")[0]
    return None


# ------------------------------------------------------------------------------------------- decisions


def split_of(seed: int, requested: Any) -> str:
    if requested in ("train", "eval"):
        return str(requested)
    if requested not in (None, "", "default"):
        raise W.WorldError(f"env.config.split must be 'train' or 'eval', got {requested!r}")
    return "eval" if seed >= EVAL_SEED_START else "train"


def decision_from_message(message: dict[str, Any]) -> tuple[list[str], list[dict[str, Any]], bool]:
    """A policy message -> (actions, tool_calls in synth's {tool, args} shape, valid). Tool calls win over
    text; an unknown action in a tool call is dropped; nothing usable -> ([], [], False)."""
    actions: list[str] = []
    calls: list[dict[str, Any]] = []
    for call in (message.get("tool_calls") or [])[:MAX_TOOL_CALLS]:
        function = call.get("function") or {}
        try:
            args = json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            args = {}
        if not isinstance(args, dict):
            args = {}
        calls.append({"tool": function.get("name"), "args": args})
        if function.get("name") != "act":
            continue
        raw = args.get("actions", [args["action"]] if "action" in args else [])
        for item in raw if isinstance(raw, list) else [raw]:
            action = W.action_from_token(item)
            if action is not None:
                actions.append(action)
    if not calls:
        actions = W.actions_from_text(str(message.get("content") or ""))
        if actions:
            calls.append({"tool": "act", "args": {"actions": actions}, "source": "text"})
    actions = actions[: W.MAX_ACTIONS_PER_DECISION]
    return actions, calls, bool(actions)


def assistant_turn(message: dict[str, Any]) -> dict[str, Any]:
    """The policy's message as the conversation keeps it: its text exactly (so the next prompt extends the
    sampled tokens), and its tool calls."""
    turn: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        turn["tool_calls"] = message["tool_calls"]
    return turn


# ------------------------------------------------------------------------------------------------- app


def descriptor() -> dict[str, Any]:
    return {
        "id": APP_ID,
        "name": "Craftworld (multi-step)",
        "description": "Gather and craft in a small text world; achievements in Crafter's chains.",
        "version": VERSION,
    }


def dataset_info() -> dict[str, Any]:
    return {
        "id": "craftworld-worlds",
        "name": "Seeded craftworld rings",
        "version": VERSION,
        "splits": ["train", "eval"],
        "default_split": "train",
        "eval_seed_start": EVAL_SEED_START,
    }


def task_info_for(seed: int, split: str | None) -> dict[str, Any]:
    world = W.make_world(seed, split_of(seed, split))
    return {
        "task": descriptor(),
        "environment": APP_ID,
        "dataset": {**dataset_info(), "split": world.split},
        "rubric": RUBRIC,
        "inference": {"supports_proxy": False, "tools": [ACT_TOOL]},
        "limits": LIMITS,
        "task_metadata": {"seed": seed, "split": world.split, "start_area": world.area, "ring": world.ring},
        "action_space": {"type": "tool_call", "tools": ["act"], "actions": list(W.ACTIONS)},
        "observation": {"type": "text", "prompt": W.observation_text(world)},
        "achievements": list(W.ACHIEVEMENTS),
    }


def create_app() -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if app.state.http is not None:
            await app.state.http.aclose()

    app = FastAPI(title="posttrain craftworld task app", version=VERSION, lifespan=lifespan)
    app.state.http = None

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        failure = auth_failure(request)  # an unauthenticated caller learns nothing about the schema
        if failure is not None:
            return failure
        problems = [{"loc": list(e.get("loc", [])), "msg": e.get("msg", "")} for e in exc.errors()]
        return _error(422, "invalid_request", "malformed request", problems=problems)

    async def client() -> httpx.AsyncClient:
        if app.state.http is None:
            app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
        return app.state.http

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict[str, Any]:
        return {"status": "ok", "service": APP_ID}

    @app.get("/health")
    async def health(request: Request) -> Any:
        return auth_failure(request) or {"healthy": True, "service": APP_ID, "auth": {"required": True}}

    @app.get("/info")
    async def info(request: Request) -> Any:
        return auth_failure(request) or {
            "service": {"task": descriptor(), "version": VERSION},
            "dataset": dataset_info(),
            "rubrics": RUBRIC,
            "inference": {"supports_proxy": False, "tools": [ACT_TOOL]},
            "limits": LIMITS,
        }

    @app.get("/task_info")
    async def task_info(
        request: Request,
        seed: Annotated[list[int] | None, Query()] = None,
        seeds: str | None = Query(default=None),
        split: str | None = Query(default=None),
    ) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        wanted = list(seed or [])
        try:
            wanted += [int(s) for s in (seeds or "").split(",") if s.strip()]
        except ValueError:
            return _error(422, "invalid_request", "seeds must be a comma-separated list of integers")
        if not wanted:
            return {"taskset": {**descriptor(), "dataset": dataset_info(), "rubric": RUBRIC}}
        try:
            infos = [task_info_for(s, split) for s in wanted]
        except W.WorldError as exc:
            return _error(422, "invalid_env_config", str(exc))
        return infos[0] if len(infos) == 1 else infos

    @app.post("/rollout")
    async def rollout(request: Request, body: RolloutRequest) -> Any:
        return auth_failure(request) or await run_rollout(body, await client())

    @app.post("/done")
    async def done(request: Request) -> Any:
        return auth_failure(request) or {"ok": True, "service": APP_ID}

    return app


class _PolicyError(Exception):
    def __init__(self, response: JSONResponse):
        self.response = response


async def _ask_policy(
    http: httpx.AsyncClient, url: str, payload: dict[str, Any], timeout: float
) -> dict[str, Any]:
    try:
        response = await http.post(url, json=payload, timeout=timeout)
    except httpx.HTTPError as exc:
        raise _PolicyError(
            _error(502, "inference_unreachable", f"policy inference call failed: {type(exc).__name__}")
        ) from exc
    if response.status_code >= 400:
        raise _PolicyError(
            _error(
                502,
                "inference_failed",
                f"policy inference returned HTTP {response.status_code}",
                upstream_status=response.status_code,
                upstream_body=response.text[:500],
            )
        )
    try:
        choice = response.json()["choices"][0]
        message = choice.get("message") or {}
        assert isinstance(message, dict)
    except Exception as exc:
        raise _PolicyError(
            _error(502, "inference_bad_response", "policy inference returned no choice")
        ) from exc
    return {"message": message, "finish_reason": choice.get("finish_reason")}


async def run_rollout(body: RolloutRequest, http: httpx.AsyncClient) -> Any:  # noqa: C901 (one episode)
    if body.mode not in ("rl", "eval"):
        return _error(422, "invalid_request", f"mode must be 'rl' or 'eval', got {body.mode!r}")
    seed = body.env.seed if body.env.seed is not None else 0
    if seed < 0:
        return _error(422, "invalid_request", "env.seed must be >= 0")
    env_config = dict(body.env.config or {})
    policy_config = dict(body.policy.config or {})
    try:
        world = W.make_world(seed, split_of(seed, env_config.get("split")), env_config)
        settings = W.step_rewards_from(policy_config, env_config)
    except W.WorldError as exc:
        return _error(422, "invalid_env_config", str(exc))
    bad_ops = [op for op in body.ops if op not in ("agent", "env", "policy")]
    if bad_ops:
        return _error(422, "invalid_request", f"ops must be 'agent' or 'env', got {bad_ops[0]!r}")
    inference_url = policy_config.get("inference_url")
    if not inference_url or not isinstance(inference_url, str):
        return _error(400, "missing_inference_url", "policy.config.inference_url is required")
    cid = correlation_id(inference_url, policy_config)
    if body.mode == "rl" and not cid:
        return _error(
            400, "missing_correlation_id", "mode 'rl' needs ?cid=<id> in policy.config.inference_url"
        )
    url = chat_completions_url(inference_url)

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": str(policy_config.get("system_prompt") or SYSTEM_PROMPT)},
        {"role": "user", "content": W.observation_text(world)},
    ]
    payload_base: dict[str, Any] = {"model": policy_config.get("model") or "policy", **DEFAULT_SAMPLING}
    for key in FORWARDED_POLICY_KEYS:
        if policy_config.get(key) is not None:
            payload_base[key] = policy_config[key]
    if body.mode == "eval" and "temperature" not in policy_config:
        payload_base["temperature"] = 0.0
    if policy_config.get("use_tools", True):
        payload_base["tools"] = [ACT_TOOL]
        payload_base["tool_choice"] = policy_config.get("tool_choice", "auto")
    timeout = min(float(body.safety.max_time_s), float(policy_config.get("timeout_s", 300.0)))
    deadline = time.monotonic() + float(body.safety.max_time_s)

    steps: list[dict[str, Any]] = []
    decision_samples: list[dict[str, Any]] = []
    credited: dict[str, int] = {}
    pending: dict[str, Any] | None = None
    ops_executed = invalid = 0
    total_reward = stepwise_sum = indicator_sum = 0.0
    events: list[dict[str, Any]] = []
    env_ms = 0.0
    max_ops = min(int(body.safety.max_ops), len(body.ops), 2 * world.max_steps)
    for op in body.ops[:max_ops]:
        if world.done or time.monotonic() > deadline:
            break
        ops_executed += 1
        if op in ("agent", "policy"):
            try:
                reply = await _ask_policy(http, url, {**payload_base, "messages": messages}, timeout)
            except _PolicyError as err:
                if not steps:  # nothing ran: synth's Crafter answers an error too
                    return err.response
                break
            actions, calls, valid = decision_from_message(reply["message"])
            messages.append(assistant_turn(reply["message"]))
            pending = {"actions": actions, "calls": calls, "valid": valid, "reply": reply}
            continue
        if pending is None:  # an env op with no decision to apply
            continue
        obs_before = W.observation_dict(world)
        started = time.perf_counter()
        outcome = W.step(world, pending["actions"] or ["noop"])
        env_ms += (time.perf_counter() - started) * 1000.0
        invalid += 0 if pending["valid"] else 1
        text = W.observation_text(world, outcome)
        tool_calls = pending["reply"]["message"].get("tool_calls") or []
        if tool_calls:
            for call in tool_calls[:MAX_TOOL_CALLS]:
                messages.append({"role": "tool", "tool_call_id": call.get("id") or "act", "content": text})
        else:
            messages.append({"role": "user", "content": text})
        total_reward += outcome["reward"]
        turn = len(steps) + 1
        info: dict[str, Any] = {
            "results": outcome["results"],
            "invalid_action": not pending["valid"],
            "finish_reason": pending["reply"]["finish_reason"],
            "achievements": sorted(world.seen),
            "meta": {"inference_url": inference_url},
        }
        if settings.active:
            stepwise = W.stepwise_reward(settings, outcome["all"], outcome["unique"], credited)
            stepwise["decision_index"] = turn
            info["stepwise"] = stepwise
            info["meta"]["decision_rewards"] = {
                "turn": turn,
                "ach_delta": len(outcome["all"]),
                "unique_delta": len(outcome["unique"]),
                "all": list(outcome["all"]),
                "unique": list(outcome["unique"]),
            }
            stepwise_sum += stepwise["reward"]
            indicator_sum += stepwise["indicator"]
            decision_samples.append(
                {
                    "decision_index": turn,
                    "indicator": stepwise["indicator"],
                    "r_i": stepwise["reward"],
                    "base": stepwise["base_reward"],
                    "strategy": settings.strategy,
                    "actions": pending["actions"],
                }
            )
        steps.append(
            {
                "obs": obs_before,
                "tool_calls": pending["calls"],
                "reward": outcome["reward"],
                "done": world.done,
                "truncated": world.steps >= world.max_steps and "collect_diamond" not in world.seen,
                "info": info,
            }
        )
        events.append(
            {
                "type": "decision",
                "turn": turn,
                "actions": pending["actions"],
                "tool_calls": pending["calls"],
                "reward": outcome["reward"],
                "achievements": {"all": outcome["all"], "unique": outcome["unique"]},
                **({"stepwise_reward": info["stepwise"]["reward"]} if settings.active else {}),
            }
        )
        pending = None
    if not steps:
        return _error(500, "no_steps_executed", "the rollout ran no env step (ops need 'agent' then 'env')")

    unlocked = sorted(world.seen)
    details: dict[str, Any] = {
        "seed": seed,
        "split": world.split,
        "turns": len(steps),
        "invalid_actions": invalid,
        "achievements": unlocked,
        "unique_achievements_total": len(unlocked),
        "env_ms": round(env_ms, 3),
    }
    if settings.active:
        details["stepwise"] = {
            **settings.summary(),
            "indicator_sum": indicator_sum,
            "reward_sum": stepwise_sum,
            "new_achievements_total": len(unlocked),
            "unique_achievements_total": len(unlocked),
            "unique_achievements": unlocked,
            "final_achievements": unlocked,
        }
    trajectory = {
        "env_id": f"{APP_ID}::{world.split}::{seed}",
        "policy_id": body.policy.policy_id or body.policy.policy_name or "policy",
        "steps": steps,
        "final": {"observation": W.observation_dict(world), "reward": total_reward},
        "length": len(steps),
        "inference_url": inference_url,
        "decision_samples": decision_samples if settings.active else None,
    }
    trace = None
    if body.record.return_trace:
        trace = {
            "session_id": cid or body.run_id,
            "created_at": time.time(),
            "metadata": {"task_id": APP_ID, "seed": seed, "task_split": world.split,
                         "model": payload_base["model"], "run_id": body.run_id,
                         "total_reward": total_reward, "achievements": unlocked},
            "event_history": events,
        }  # fmt: skip
        if body.record.trace_format in ("full", "structured"):
            trace["markov_blanket_message_history"] = messages
    return {
        "run_id": body.run_id,
        "trajectories": [trajectory] if body.record.trajectories else [],
        "branches": {},
        "metrics": {
            "episode_returns": [total_reward],
            "mean_return": total_reward,
            "num_steps": len(steps),
            "num_episodes": 1,
            "outcome_score": len(unlocked) / len(W.ACHIEVEMENTS),
            "events_score": sum(1 for s in steps if s["reward"] > 0) / len(steps),
            "details": details,
        },
        "aborted": False,
        "ops_executed": ops_executed,
        "trace_correlation_id": cid,
        "trace": trace,
        "pipeline_metadata": {
            "inference_url": inference_url,
            "trace_correlation_id": cid,
            "task_id": APP_ID,
            "split": world.split,
            "seed": seed,
            "model": payload_base["model"],
            "request_id": str(uuid.uuid4()),
        },
    }


app = create_app()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description="posttrain craftworld task app (synth task-app contract)")
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    parser.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "warning"))
    args = parser.parse_args(argv)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))  # bind first: the address printed is the one served (also --port 0)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    print(
        f"posttrain craftworld task app {VERSION}: listening on http://{shown}:{sock.getsockname()[1]} "
        f"({len(allowed_keys())} API key(s) configured)",
        file=sys.stderr,
        flush=True,
    )
    uvicorn.Server(uvicorn.Config(app, log_level=args.log_level)).run(sockets=[sock])


if __name__ == "__main__":
    main()
