"""The RL trainer's task-app client: /rollout requests in synth's shape, exact tokens from the rollout server's
captures, rewards blended with judge scores, and an error budget.

Per rollout: POST {task_app}/rollout (mode rl) with policy.config.inference_url =
`<policy base>/v1/chat/completions?cid=trace_<run>-it<k>-s<seed>-r<i>`; the task app calls the policy through that
URL, the rollout server records every call under the cid; the trainer then GETs /v1/captures/{cid} on the same
policy server (then DELETEs it) and trains on exactly those token ids (never re-tokenised text).

Multi-turn episodes: calls are merged into one sequence while each call's prompt starts with the previous
call's prompt + completion; the tokens in between (tool results, env observations, chat-template glue) join
the completion with mask 0, so only policy-sampled tokens carry loss. When a later prompt does not extend the
earlier text token for token (a template that drops earlier reasoning, a truncated history), a new sequence
starts; every sequence of an episode gets the episode's advantage. Each completion token remembers the
policy call (the decision) that sampled it, for per-decision credit (step_rewards.py).

Step rewards: the TOML's step_rewards_* settings go to the task app as env.config.step_rewards (as synth's
backend sends them); each step's info.meta.decision_rewards becomes a per-decision reward on the result
(step_rewards.decision_rewards), which rl.py turns into per-token credit.

Reward (synth's rubric formula): total = w_env * episode_return + w_event * events_score + w_outcome *
outcome_score, weights from the job's judge settings (job.settings.judge: [judge] reward_blend, or [rubric]
enabled with [rubric.weights], when a [judge] is configured; synth blends nothing without one), else env
only. Scores come from the LLM judge (judging.EpisodeJudge) when one is called (a rollout it cannot score
fails), else from the task app's metrics (outcome_score, events_score); the formula is
posttrain.api.reward.blend_reward.

finish_reason: every captured call's finish_reason (the rollout server records vLLM's) is kept on the result;
a call that stopped at max_tokens ("length") makes the rollout truncated, which rl.py treats by
[training].overlong. An empty response (a call that sampled no token) is scored like any other and stays in
its group; it has no token to train.

Error budget: a failed rollout (HTTP error, invalid response, no capture, judge failure) is dropped, its
group trains on the rest; when more than `rollout.error_budget` (fraction of the iteration's rollouts,
default 0.25) fail, or no rollout at all succeeds, RolloutBudgetExceeded ends the job with the collected error messages."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import math
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.api import traces
from posttrain.api.model_ids import uid8
from posttrain.api.reward import blend_reward
from posttrain.api.rollout_settings import DEFAULT_ERROR_BUDGET, DEFAULT_TIMEOUT_S, RolloutSettings  # noqa: F401
from posttrain.api.urls import CID_PREFIX, IDLE_CONNECTION_EXPIRY_S, check_url, join_url

from posttrain_trainer.capture_batches import DEFAULT_BATCH as DEFAULT_CAPTURE_BATCH
from posttrain_trainer.capture_batches import CaptureBatches, Taken
from posttrain_trainer.server_auth import TOKEN_ENV
from posttrain_trainer.step_rewards import decision_meta, decision_rewards
from posttrain_trainer.trace_rewards import trace_blocks

# rollouts in flight per HTTP client (RolloutClient.collect: why several)
CONNECTIONS_PER_CLIENT = 16

CHAT_PATH = "/v1/chat/completions"
TRUNCATED = "length"  # the OpenAI/vLLM finish_reason of a response cut at max_tokens
_CID_SAFE = re.compile(r"[^A-Za-z0-9._-]+")
CID_MAC_HEX = 20  # hex digits of a signed cid's mac (posttrain_rollout.captures.CID_MAC_HEX)


SERVERS_READY_TIMEOUT_S = 1800.0  # a cold vLLM compile on a slow CPU took minutes; whoever started us decides


class ServersNotReady(RuntimeError):
    """A rollout server did not answer /health in time."""


def wait_for_servers(
    urls: Sequence[str], timeout_s: float = SERVERS_READY_TIMEOUT_S, interval_s: float = 1.0
) -> float:
    """Wait until every rollout server's /health answers (below 500); the seconds waited. In a cluster the trainer
    pod's initContainer has already waited (one request each here); a local run starts the trainer while vLLM
    boots, so that the model load and vLLM's start overlap. Nothing of a server's answer is echoed."""
    import httpx

    started = time.monotonic()
    deadline = started + timeout_s
    for url in urls:
        while True:
            try:
                # 200: serving; 5xx: vLLM still starting; another answer: a server without /health, up
                if httpx.get(f"{url.rstrip('/')}/health", timeout=5.0).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise ServersNotReady(f"rollout server {url} not ready after {timeout_s:.0f} s (GET /health)")
            time.sleep(interval_s)
    return time.monotonic() - started


class RolloutBudgetExceeded(RuntimeError):
    """More task-app rollouts failed in one iteration than the error budget allows."""


# -- pure helpers ---------------------------------------------------------------------------------------


def run_tag(name: str, uid: str) -> str:
    """The run part of a correlation id: `<job name>-<uid8>`, only URL-safe characters."""
    tag = f"{name}-{uid8(uid)}"
    return _CID_SAFE.sub("-", tag).strip("-") or "run"


def make_cid(run: str, iteration: int, seed: int, index: int, *, kind: str = "it") -> str:
    """`trace_<run>-it<k>-s<seed>-r<i>` (training) or `trace_<run>-ev<k>-s<seed>-r<i>` (evaluation): synth's
    task apps require the `trace_` prefix (posttrain.api.urls.CID_PREFIX). With the job's rollout token
    (server_auth.TOKEN_ENV) the cid is signed, `trace_<run>-m<mac>-it<k>-...`: unguessable, and the only
    kind of cid the job's rollout servers capture under (posttrain_rollout.captures.signed_cid)."""
    head = f"{CID_PREFIX}{_CID_SAFE.sub('-', run)}"
    tail = f"{kind}{int(iteration)}-s{int(seed)}-r{int(index)}"
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        return f"{head}-{tail}"
    mac = hmac.new(token.encode(), f"{head}-{tail}".encode(), hashlib.sha256).hexdigest()[:CID_MAC_HEX]
    return f"{head}-m{mac}-{tail}"


def inference_url(base: str, cid: str, path: str = CHAT_PATH) -> str:
    return f"{base.rstrip('/')}{path}?cid={cid}"


def build_rollout_request(
    *,
    settings: RolloutSettings,
    model: str,
    run_id: str,
    seed: int,
    url: str,
    mode: str = "rl",
    policy_overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The body of a task app's POST /rollout, as synth's RolloutRequest shapes it, from the job's resolved
    settings (job.settings.rollout): the env (name, seed, env_config), the policy (name, sampling config with
    the inference URL), the ops (agent/env per turn), what to record, and the safety limits."""
    policy_config = {"model": settings.served_model_name or model, **settings.policy_config}
    policy_config.update(policy_overrides or {})
    policy_config["inference_url"] = url
    return {
        "run_id": run_id,
        "mode": mode,
        "env": {
            "env_name": settings.env_name,
            "seed": int(seed),
            "config": dict(settings.env_config),
        },
        "policy": {"policy_name": settings.policy_name, "config": policy_config},
        "ops": list(settings.ops) * settings.max_turns,
        "record": {
            "trajectories": True,
            "logprobs": False,
            "value": False,
            # the v3 trace carries event rewards a task app reports only there (trace_rewards.py)
            "return_trace": bool(settings.step_rewards.active),
            "trace_format": "compact",
        },
        "on_done": "reset",
        "safety": {"max_ops": 100000, "max_time_s": float(settings.timeout_s)},
        "training_session_id": None,
        "synth_base_url": None,
    }


def episode_return(response: dict[str, Any]) -> float:
    """metrics.episode_returns[0], else metrics.mean_return, else the sum of step rewards."""
    metrics = response.get("metrics") or {}
    returns = metrics.get("episode_returns")
    if isinstance(returns, list) and returns:
        return float(returns[0])
    if metrics.get("mean_return") is not None:
        return float(metrics["mean_return"])
    total = 0.0
    for trajectory in response.get("trajectories") or []:
        for step in trajectory.get("steps") or []:
            total += float(step.get("reward") or 0.0)
    return total


@dataclass
class EpisodeSequence:
    """One training sequence of an episode: the first call's prompt; the completion is every later token
    (policy tokens mask 1, env/tool/template tokens mask 0); sampling logprobs per completion token (0.0 for
    non-policy tokens; logprobs_captured is False when a call's logprobs were missing or not finite), the
    behaviour policy under old_logprobs = "sampler" (offpolicy.py) and measured against the trainer's always;
    the weight version that served each call; per completion token, the index of the episode's policy call
    that sampled it (-1 for tokens between calls); the image URLs the sequence's prompt holds placeholders for,
    in order (a vision policy: the trainer rebuilds their pixel values with the model's processor)."""

    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    completion_mask: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    weight_versions: list[Any] = field(default_factory=list)
    logprobs_captured: bool = True
    call_index: list[int] = field(default_factory=list)
    images: list[str] = field(default_factory=list)

    @property
    def policy_tokens(self) -> int:
        return int(sum(self.completion_mask))

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": self.prompt_ids,
            "completion_ids": self.completion_ids,
            "completion_mask": self.completion_mask,
            "sampling_logprobs": self.sampling_logprobs,
            "weight_versions": self.weight_versions,
            "logprobs_captured": self.logprobs_captured,
            "call_index": self.call_index,
            "images": self.images,
        }


def _logprob_list(entry: dict[str, Any], n: int) -> list[float]:
    raw = entry.get("logprobs")
    if not isinstance(raw, list) or len(raw) != n:
        return [0.0] * n
    out = []
    for value in raw:
        if isinstance(value, dict):  # {"logprob": x, ...}
            value = value.get("logprob")
        try:
            out.append(float(value) if value is not None and math.isfinite(float(value)) else 0.0)
        except (TypeError, ValueError):
            out.append(0.0)
    return out


def _logprobs_complete(entry: dict[str, Any], n: int) -> bool:
    """True when the capture holds one finite logprob per completion token."""
    raw = entry.get("logprobs")
    if not isinstance(raw, list) or len(raw) != n:
        return False
    for value in raw:
        if isinstance(value, dict):
            value = value.get("logprob")
        try:
            if value is None or not math.isfinite(float(value)):
                return False
        except (TypeError, ValueError):
            return False
    return True


def build_sequences(captures: Sequence[dict[str, Any]]) -> list[EpisodeSequence]:
    """Captures of one episode (call order) -> training sequences with a policy-token mask."""
    sequences: list[EpisodeSequence] = []
    current: EpisodeSequence | None = None
    call = -1
    for entry in captures:
        prompt = [int(t) for t in entry.get("prompt_token_ids") or []]
        completion = [int(t) for t in entry.get("completion_token_ids") or []]
        logprobs = _logprob_list(entry, len(completion))
        captured = _logprobs_complete(entry, len(completion))
        version = entry.get("weight_version")
        images = [str(u) for u in entry.get("images") or []]
        if not prompt:
            continue
        call += 1
        if current is not None:
            so_far = current.prompt_ids + current.completion_ids
            if len(prompt) >= len(so_far) and prompt[: len(so_far)] == so_far:
                glue = prompt[len(so_far) :]
                current.completion_ids += glue + completion
                current.completion_mask += [0] * len(glue) + [1] * len(completion)
                current.sampling_logprobs += [0.0] * len(glue) + logprobs
                current.weight_versions.append(version)
                current.logprobs_captured = current.logprobs_captured and captured
                current.call_index += [-1] * len(glue) + [call] * len(completion)
                current.images = images  # the longer prompt repeats the earlier images, then adds its own
                continue
            sequences.append(current)
        current = EpisodeSequence(
            prompt_ids=prompt,
            completion_ids=list(completion),
            completion_mask=[1] * len(completion),
            sampling_logprobs=logprobs,
            weight_versions=[version],
            logprobs_captured=captured,
            call_index=[call] * len(completion),
            images=images,
        )
    if current is not None:
        sequences.append(current)
    return [s for s in sequences if s.policy_tokens > 0]


class ErrorBudget:
    """Allows up to floor(fraction * total) failed rollouts per iteration (at least `min_failures`)."""

    def __init__(self, fraction: float = DEFAULT_ERROR_BUDGET, min_failures: int = 0):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"error_budget must be a fraction in [0, 1], got {fraction}")
        self.fraction = float(fraction)
        self.min_failures = int(min_failures)

    @classmethod
    def from_settings(cls, settings: RolloutSettings) -> ErrorBudget:
        return cls(settings.error_budget)

    def allowed(self, total: int) -> int:
        return max(self.min_failures, int(math.floor(self.fraction * total + 1e-9)))

    def check(self, total: int, errors: Sequence[str]) -> None:
        """Raise RolloutBudgetExceeded when the failures exceed the budget or nothing succeeded."""
        failed = len(errors)
        if total and (failed > self.allowed(total) or failed >= total):
            shown = "; ".join(sorted(set(errors))[:5])
            raise RolloutBudgetExceeded(
                f"{failed} of {total} rollouts failed (budget {self.allowed(total)}, "
                f"rollout.error_budget = {self.fraction}): {shown}"
            )


# -- the async client ----------------------------------------------------------------------------------


@dataclass
class RolloutSpec:
    seed: int
    group: int  # index of the seed within the iteration (rollouts of one group share a seed)
    index: int  # member of the group
    cid: str
    endpoint: str  # policy server base URL


@dataclass
class RolloutResult:
    spec: RolloutSpec
    ok: bool
    error: str | None = None
    env_return: float = 0.0
    outcome_score: float | None = None
    events_score: float | None = None
    reward: float = 0.0
    sequences: list[EpisodeSequence] = field(default_factory=list)
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)
    judge_failed: bool = False  # the judge could not score it (judging.py: such a rollout fails)
    finish_reasons: list[str | None] = field(default_factory=list)  # per captured policy call
    turns: int = 0  # steps of the trajectory (decisions the environment applied)
    decision_rewards: list[float] = field(default_factory=list)  # per decision, when step rewards are on
    trace: dict[str, Any] = field(default_factory=dict)  # bounded messages and steps for the trace store

    @property
    def truncated(self) -> bool:
        """A policy call of the episode stopped at max_tokens (vLLM's finish_reason "length")."""
        return TRUNCATED in self.finish_reasons

    @property
    def empty(self) -> bool:
        """The policy was called but sampled no token (an empty response)."""
        return bool(self.finish_reasons) and not self.sequences


def plan_rollouts(
    run: str,
    iteration: int,
    seeds: Sequence[int],
    group_size: int,
    endpoints: Sequence[str],
    *,
    kind: str = "it",
) -> list[RolloutSpec]:
    """seeds x group_size rollouts, group after group; endpoints round-robin over rollouts."""
    if not endpoints:
        raise ValueError("no policy endpoint to roll out against")
    specs = []
    for g, seed in enumerate(seeds):
        for i in range(group_size):
            n = len(specs)
            specs.append(
                RolloutSpec(
                    seed=int(seed),
                    group=g,
                    index=i,
                    cid=make_cid(run, iteration, seed, i, kind=kind),
                    endpoint=endpoints[n % len(endpoints)],
                )
            )
    return specs


def api_headers(api_key: str | None) -> dict[str, str]:
    if not api_key:
        return {}
    return {"X-API-Key": api_key, "Authorization": f"Bearer {api_key}"}


class RolloutLoop:
    """One event loop for all of a job's rollouts (asyncio.Runner): the judge client's semaphore and any
    connection state made in one iteration stay valid in the next, which they would not under a new loop
    per iteration. `with RolloutLoop() as loop: loop.collect(client, specs)`."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()

    def collect(
        self, client: RolloutClient, specs: Sequence[RolloutSpec], **kwargs: Any
    ) -> list[RolloutResult]:
        return self._runner.run(client.collect(specs, **kwargs))

    def close(self) -> None:
        self._runner.close()

    def __enter__(self) -> RolloutLoop:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class RolloutClient:
    """Async client over one task app and the policy servers; a job runs it under one RolloutLoop."""

    def __init__(
        self,
        *,
        task_url: str,
        settings: RolloutSettings,
        model: str,
        api_key: str | None = None,
        api_key_env: str = "ENVIRONMENT_API_KEY",
        concurrency: int | None = None,
        timeout_s: float | None = None,
        retries: int = 1,
        weights: dict[str, float] | None = None,
        judge: Any = None,
        transport: Any = None,
    ):
        self.task_url = check_url(task_url).rstrip("/")  # posttrain.api.urls' rule, as the operator's
        self.settings = settings  # the job's resolved settings.rollout
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get(api_key_env)
        self.concurrency = concurrency or settings.concurrency
        self.timeout_s = float(timeout_s or settings.timeout_s)
        self.retries = retries
        self.weights = dict(weights) if weights else {"env": 1.0, "event": 0.0, "outcome": 0.0}
        self.judge = judge  # judging.EpisodeJudge: scores training episodes with an LLM judge
        self.step_rewards = settings.step_rewards
        self.capture_batch = DEFAULT_CAPTURE_BATCH  # cids per POST /v1/captures (capture_batches)
        self.connections_per_client = CONNECTIONS_PER_CLIENT  # rollouts in flight per HTTP client (collect)
        self.transport = transport  # an httpx transport for every call (tests: in-process task app and servers)

    async def collect(
        self,
        specs: Sequence[RolloutSpec],
        *,
        mode: str = "rl",
        want_tokens: bool = True,
        policy_overrides: dict[str, Any] | None = None,
    ) -> list[RolloutResult]:
        import httpx

        semaphore = asyncio.Semaphore(max(1, self.concurrency))
        # httpcore's pool scans all its connections, for each idle one, on every request it starts or ends:
        # its CPU grows with the square of the connections (a hundred rollouts in flight cost the demo's
        # trainer tens of CPU seconds a run). So the rollouts in flight are spread over several clients of
        # a few connections each, a rollout taking the least busy; and the pool keeps what it opened
        # (httpcore closes idle connections whenever it holds more than max_keepalive in all).
        shards = max(1, math.ceil(self.concurrency / self.connections_per_client))
        per_client = max(4, math.ceil(self.concurrency / shards))
        limits = httpx.Limits(
            max_connections=per_client, max_keepalive_connections=per_client, keepalive_expiry=IDLE_CONNECTION_EXPIRY_S
        )
        async with contextlib.AsyncExitStack() as stack:
            clients = [
                await stack.enter_async_context(
                    httpx.AsyncClient(timeout=self.timeout_s, limits=limits, transport=self.transport)
                )
                for _ in range(shards)
            ]
            in_flight = [0] * shards
            batches = CaptureBatches(clients[0], batch=self.capture_batch)

            async def one(spec: RolloutSpec) -> RolloutResult:
                async with semaphore:
                    shard = in_flight.index(min(in_flight))
                    in_flight[shard] += 1
                    try:
                        result = await self._run_one(clients[shard], spec, mode, policy_overrides)
                    finally:
                        in_flight[shard] -= 1
                await batches.add(spec.endpoint, spec.cid)  # a failed rollout's captures are dropped too
                return result

            results = list(await asyncio.gather(*(one(s) for s in specs)))
            await batches.flush()
            return [self._with_captures(r, batches.taken(r.spec.cid), want_tokens) for r in results]

    async def _post_rollout(self, http, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        last: Exception | None = None
        for attempt in range(self.retries + 1):
            try:
                response = await http.post(
                    join_url(self.task_url, "/rollout"), json=body, headers=api_headers(self.api_key)
                )
            except httpx.TransportError as err:  # connection reset, timeout: retry
                last = err
                await asyncio.sleep(0.5 * (attempt + 1))
                continue
            if response.status_code >= 400:
                detail = response.text[:300].replace("\n", " ")
                raise RuntimeError(f"task app /rollout HTTP {response.status_code}: {detail}")
            data = response.json()
            if not isinstance(data, dict):
                raise RuntimeError("task app /rollout returned a non-object")
            return data
        raise RuntimeError(f"task app /rollout unreachable: {type(last).__name__}: {last}")

    async def _run_one(self, http, spec, mode, policy_overrides) -> RolloutResult:
        """The episode and its reward; its tokens come after, with its batch's captures (_with_captures)."""
        started = time.perf_counter()
        url = inference_url(spec.endpoint, spec.cid)
        body = build_rollout_request(
            settings=self.settings,
            model=self.model,
            run_id=spec.cid,
            seed=spec.seed,
            url=url,
            mode=mode,
            policy_overrides=policy_overrides,
        )
        result = RolloutResult(spec=spec, ok=False)
        try:
            data = await self._post_rollout(http, body)
            if data.get("aborted"):
                raise RuntimeError("task app reported the rollout aborted")
            metrics = data.get("metrics") or {}
            result.env_return = episode_return(data)
            result.outcome_score = _maybe_float(metrics.get("outcome_score"))
            result.events_score = _maybe_float(metrics.get("events_score"))
            if self.judge is not None and mode == "rl":
                verdict = await self.judge.score(data)
                if verdict.failure is not None:
                    result.judge_failed = True
                    raise RuntimeError(f"judge: {verdict.failure}")
                if verdict.outcome_score is not None:
                    result.outcome_score = verdict.outcome_score
                if verdict.events_score is not None:
                    result.events_score = verdict.events_score
            result.reward = blend_reward(
                result.env_return, result.outcome_score, result.events_score, self.weights
            )
            result.details = {
                k: metrics.get(k) for k in ("mean_return", "num_steps") if metrics.get(k) is not None
            }
            blocks = decision_meta(data)
            result.turns = len(blocks)
            if self.step_rewards.active:
                if not any(blocks):  # rewards reported only through the v3 trace: the same credit
                    blocks = trace_blocks(data, len(blocks))[: len(blocks)] or blocks
                result.decision_rewards = decision_rewards(blocks, self.step_rewards)
            result.trace = {
                "steps": traces.trajectory_steps(data, result.decision_rewards),
                "achievements_count": traces.achievements_count(data),
            }
            result.ok = True
        except Exception as err:
            result.error = f"{type(err).__name__}: {err}"
        result.seconds = time.perf_counter() - started
        return result

    @staticmethod
    def _with_captures(result: RolloutResult, taken: Taken, want_tokens: bool) -> RolloutResult:
        """The rollout's policy calls, as its server captured them: the tokens and log-probabilities to
        train on (want_tokens; none is a failed rollout), else only the trace's messages."""
        if not result.ok:
            return result
        captures = taken.entries or []
        if want_tokens:
            if taken.entries is None or not captures:
                result.ok = False
                result.error = (
                    f"CaptureError: {taken.error or f'no policy call captured under cid {result.spec.cid}'}"
                )
                return result
            result.finish_reasons = [entry.get("finish_reason") for entry in captures]
            # an empty response (no completion token) is still scored: it stays in its group's
            # advantages and simply has no token to train
            result.sequences = build_sequences(captures)
        result.trace["messages"] = traces.conversation(captures)
        result.trace["weight_versions"] = [entry.get("weight_version") for entry in captures][:1000]
        result.trace["episode_tokens"] = sum(
            len(entry.get("prompt_token_ids") or []) + len(entry.get("completion_token_ids") or [])
            for entry in captures[-1:]
        )
        return result


def _maybe_float(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None
