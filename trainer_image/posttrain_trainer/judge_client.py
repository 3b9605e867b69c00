"""The trainer's LLM-judge client: rubric scoring of an episode's outcome and events (the trainer blends the
scores into the reward with posttrain.api.reward.blend_reward; judging.py decides what is judged).

JudgeClient talks to any OpenAI-compatible chat endpoint: a self-hosted judge (`serve --role judge`, the
rollout image) or the providers synth's [judge.options].provider names (openai, groq, gemini through their
OpenAI-compatible APIs), key from an environment variable (mounted from a Secret). A concurrency limit, a
retry budget and an overall timeout per score: a slow or broken judge yields None, never an exception or a
stall. httpx only: it lives in the trainer image, its only user.

Rubric ([judge.options.rubric_overrides.event|outcome], or the task app's /task_info rubric): {goal_text,
aggregation ("weighted_sum"), criteria: [{id, weight, scale: "binary"|"bounded", description}]}. The judge is
asked for JSON {"criteria": {id: score}, "score": total}; per-criterion scores (binary -> 0/1, bounded -> [0,
1]) are aggregated as sum(weight * score); a reply with only "score" uses that. Unparsable -> None."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from posttrain.api.judge_settings import JudgeSettings

PROVIDERS: dict[str, tuple[str, str]] = {
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
    "groq": ("https://api.groq.com/openai/v1", "GROQ_API_KEY"),
    "gemini": ("https://generativelanguage.googleapis.com/v1beta/openai", "GEMINI_API_KEY"),
}
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


# -- rubric ----------------------------------------------------------------------------------------------


@dataclass
class Criterion:
    id: str
    weight: float = 1.0
    scale: str = "bounded"  # "binary" | "bounded"
    description: str = ""


@dataclass
class Rubric:
    goal_text: str = ""
    aggregation: str = "weighted_sum"
    criteria: list[Criterion] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Rubric:
        data = data or {}
        crit = []
        for i, c in enumerate(data.get("criteria") or []):
            crit.append(
                Criterion(
                    id=str(c.get("id") or f"c{i}"),
                    weight=float(c.get("weight", 1.0)),
                    scale=str(c.get("scale") or "bounded").lower(),
                    description=str(c.get("description") or ""),
                )
            )
        return cls(
            goal_text=str(data.get("goal_text") or ""),
            aggregation=str(data.get("aggregation") or "weighted_sum"),
            criteria=crit,
        )


def _clip(value: float, scale: str) -> float:
    if scale == "binary":
        return 1.0 if value >= 0.5 else 0.0
    return min(1.0, max(0.0, value))


def aggregate(rubric: Rubric, per_criterion: dict[str, float]) -> float | None:
    """weighted_sum over the rubric's criteria (every criterion must be scored); "mean" also accepted."""
    if not rubric.criteria:
        return None
    values = []
    for c in rubric.criteria:
        if c.id not in per_criterion:
            return None
        values.append((c.weight, _clip(per_criterion[c.id], c.scale)))
    if rubric.aggregation == "mean":
        total_w = sum(w for w, _ in values)
        return sum(w * v for w, v in values) / total_w if total_w else None
    return sum(w * v for w, v in values)


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_THINK = re.compile(r"<think>.*?(</think>|$)", re.S | re.I)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        f = float(value)
        return f if math.isfinite(f) else None
    if isinstance(value, str):
        try:
            f = float(value.strip())
        except ValueError:
            return None
        return f if math.isfinite(f) else None
    if isinstance(value, dict):
        for key in ("score", "value"):
            if key in value:
                return _number(value[key])
    return None


def _json_candidates(text: str) -> list[Any]:
    out = []
    for block in _FENCE.findall(text):
        with contextlib.suppress(ValueError):
            out.append(json.loads(block))
    # every balanced {...} region, outermost first
    starts = [i for i, ch in enumerate(text) if ch == "{"]
    for start in starts:
        depth = 0
        for j in range(start, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    with contextlib.suppress(ValueError):
                        out.append(json.loads(text[start : j + 1]))
                    break
    return out


def parse_judgement(text: str | None, rubric: Rubric | None = None) -> float | None:
    """The judge's score from its reply; None when it cannot be read."""
    if not text or not isinstance(text, str):
        return None
    text = _THINK.sub("", text).strip()
    if not text:
        return None
    rubric = rubric or Rubric()
    for cand in _json_candidates(text):
        if not isinstance(cand, dict):
            continue
        crit = cand.get("criteria") or cand.get("scores")
        if isinstance(crit, dict) and rubric.criteria:
            per = {k: _number(v) for k, v in crit.items()}
            per = {k: v for k, v in per.items() if v is not None}
            agg = aggregate(rubric, per)
            if agg is not None:
                return agg
        if isinstance(crit, list) and rubric.criteria:
            per = {}
            for item in crit:
                if isinstance(item, dict) and "id" in item and _number(item) is not None:
                    per[str(item["id"])] = _number(item)
            agg = aggregate(rubric, per)
            if agg is not None:
                return agg
        for key in ("score", "total", "reward", "overall"):
            if key in cand:
                value = _number(cand[key])
                if value is not None:
                    return value
    value = _number(text)  # a bare number
    return value


def build_messages(
    rubric: Rubric, subject: str, content: Any, *, kind: str = "outcome"
) -> list[dict[str, str]]:
    crit = "\n".join(
        f'- "{c.id}" (weight {c.weight:g}, {"0 or 1" if c.scale == "binary" else "a number from 0 to 1"}): '
        f"{c.description}"
        for c in rubric.criteria
    )
    if crit:
        ask = (
            'Reply with only a JSON object {"criteria": {"<id>": <score>, ...}, "score": <weighted total>} '
            "scoring every criterion."
        )
    else:
        ask = 'Reply with only a JSON object {"score": <number from 0 to 1>}.'
    system = "You are a strict, consistent evaluator of an AI agent's work. Score only what is asked. " + ask
    body = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    user = f"Goal: {rubric.goal_text or '(not given)'}\n"
    if crit:
        user += f"Criteria:\n{crit}\n"
    user += f"\n{kind.capitalize()} to score ({subject}):\n{body}\n\n{ask}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


# -- client ----------------------------------------------------------------------------------------------


class JudgeClient:
    """Async rubric judge over an OpenAI-compatible /chat/completions endpoint.

    base_url: ".../v1" (a self-hosted rollout server: "http://host:port/v1"; "http://host:port" also works)
    or a provider name ("openai", "groq", "gemini"). Every scoring call returns within `timeout` seconds
    (retries included) and yields None on timeout, transport errors, HTTP errors or unparsable replies."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        max_concurrency: int = 8,
        retries: int = 2,
        *,
        temperature: float = 0.0,
        max_tokens: int = 512,
        backoff_s: float = 0.5,
        transport=None,
    ):
        provider = PROVIDERS.get(base_url.lower()) if "://" not in base_url else None
        if provider:
            base_url, default_env = provider
            api_key_env = api_key_env or default_env
        base_url = base_url.rstrip("/")
        if not base_url.endswith("/v1") and "/v1" not in base_url.split("://", 1)[-1]:
            base_url += "/v1"
        self.base_url = base_url
        self.model = model
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.retries = max(0, int(retries))
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.backoff_s = backoff_s
        self.max_concurrency = max(1, int(max_concurrency))
        # one semaphore per event loop: an asyncio.Semaphore binds to the loop that first waits on it, and
        # a caller may score under several loops (one asyncio.run per iteration): a shared one would fail
        # every contended call outside its first loop
        self._sems: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._transport = transport
        self.stats = {"calls": 0, "timeouts": 0, "errors": 0, "unparsable": 0}

    @classmethod
    def from_settings(cls, settings: JudgeSettings, base_url: str | None = None, **kw) -> JudgeClient:
        """From the job's typed judge settings (provider, model, timeout_s, max_concurrency, api_key_env)."""
        return cls(
            base_url or str(settings.provider or "openai"),
            str(settings.model),
            api_key_env=settings.api_key_env,
            timeout=float(settings.timeout_s),
            max_concurrency=int(settings.max_concurrency),
            **kw,
        )

    def _semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        sem = self._sems.get(loop)
        if sem is None:
            sem = self._sems[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

    def _headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def complete(self, messages: list[dict[str, str]]) -> str | None:
        """The judge's reply text (None on any failure or after the timeout)."""
        self.stats["calls"] += 1
        try:
            return await asyncio.wait_for(self._complete(messages), timeout=self.timeout)
        except TimeoutError:
            self.stats["timeouts"] += 1
            return None
        except Exception:  # noqa: BLE001 - a judge never breaks the trainer
            self.stats["errors"] += 1
            return None

    async def _complete(self, messages: list[dict[str, str]]) -> str | None:
        import httpx

        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        async with (
            self._semaphore(),
            httpx.AsyncClient(timeout=self.timeout, transport=self._transport) as http,
        ):
            for attempt in range(self.retries + 1):
                try:
                    r = await http.post(
                        f"{self.base_url}/chat/completions", json=body, headers=self._headers()
                    )
                except httpx.TransportError:
                    if attempt >= self.retries:
                        raise
                else:
                    if r.status_code == 200:
                        choices = r.json().get("choices") or []
                        return (choices[0].get("message") or {}).get("content") if choices else None
                    if r.status_code not in RETRY_STATUS or attempt >= self.retries:
                        self.stats["errors"] += 1
                        return None
                await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))
        return None

    async def score(self, rubric: Rubric | dict[str, Any] | None, content: Any, *, kind: str = "outcome",
                    subject: str = "episode") -> float | None:  # fmt: skip
        rubric = rubric if isinstance(rubric, Rubric) else Rubric.from_dict(rubric)
        text = await self.complete(build_messages(rubric, subject, content, kind=kind))
        if text is None:
            return None
        value = parse_judgement(text, rubric)
        if value is None:
            self.stats["unparsable"] += 1
        return value

    async def score_outcome(self, rubric: Rubric | dict[str, Any] | None, outcome: Any) -> float | None:
        return await self.score(rubric, outcome, kind="outcome", subject="final result of the episode")

    async def score_events(
        self, rubric: Rubric | dict[str, Any] | None, events: Sequence[Any]
    ) -> list[float | None]:
        """One score per event (step), scored concurrently under the concurrency limit."""
        return list(
            await asyncio.gather(
                *(self.score(rubric, e, kind="event", subject=f"step {i}") for i, e in enumerate(events))
            )
        )

    async def judge_episode(
        self,
        rubrics: dict[str, Rubric | dict[str, Any] | None],
        outcome: Any = None,
        events: Sequence[Any] | None = None,
        *,
        score_outcome: bool = True,
        score_events: bool = True,
    ) -> dict[str, Any]:
        """The outcome score and one score per event, each against its rubric (rubrics["outcome"|"event"])."""
        result: dict[str, Any] = {"outcome_score": None, "event_scores": []}
        tasks = []
        if score_outcome and outcome is not None:
            tasks.append(("outcome_score", self.score_outcome(rubrics.get("outcome"), outcome)))
        if score_events and events:
            tasks.append(("event_scores", self.score_events(rubrics.get("event"), events)))
        values = await asyncio.gather(*(t for _, t in tasks))
        for (key, _), value in zip(tasks, values, strict=True):
            result[key] = value
        return result
