"""The evaluation's rollouts: every (seed, sample) as one POST /rollout in eval mode, `concurrency` at a time,
each answer turned into trace rows as it arrives (written at once: a long evaluation loses nothing when it
stops), with a progress bar on stderr. A failed rollout becomes an error row; the others go on."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from posttrain.api.urls import CID_PREFIX, IDLE_CONNECTION_EXPIRY_S
from posttrain.evaluation.traces import error_row, rows_from_response
from posttrain.taskapp_client import auth_headers, rollout_request

MAX_RESPONSE_BYTES = 32 * 1024 * 1024


@dataclass
class EvalPlan:
    task_url: str
    api_key: str | None
    inference_url: str  # OpenAI-compatible base (…/v1 is appended by the task app when missing)
    model: str
    seeds: list[int]
    samples: int = 1  # rollouts per seed (pass@k needs several)
    split: str | None = None  # env.config.split
    env_name: str = "default"
    policy_name: str = "policy"
    env_config: dict[str, Any] = field(default_factory=dict)
    policy_config: dict[str, Any] = field(default_factory=dict)
    concurrency: int = 8
    timeout_s: float = 600.0
    max_turns: int = 1
    task_id: str | None = None
    ops: list[str] | None = None  # the request's ops verbatim (synth's [eval].ops), else [agent, env] x max_turns
    record: dict[str, Any] = field(default_factory=dict)  # merged into the request's record (return_trace, ...)
    judges: list[Any] = field(default_factory=list)  # posttrain.evaluation.judges.Judge, scored per rollout


def _request(plan: EvalPlan, seed: int, sample: int) -> dict[str, Any]:
    cid = f"{CID_PREFIX}eval-{uuid.uuid4().hex[:12]}"
    env_config = dict(plan.env_config)
    if plan.split:
        env_config["split"] = plan.split
    sep = "&" if "?" in plan.inference_url else "?"
    request = rollout_request(
        seed=seed, inference_url=f"{plan.inference_url}{sep}cid={cid}", model=plan.model,
        env_name=plan.env_name, policy_name=plan.policy_name, mode="eval", env_config=env_config,
        policy_config=plan.policy_config, run_id=cid, max_turns=plan.max_turns,
    )  # fmt: skip
    if plan.ops:
        request["ops"] = list(plan.ops)
    request["record"].update(plan.record)
    return request


async def _one(http: httpx.AsyncClient, plan: EvalPlan, seed: int, sample: int) -> list[dict[str, Any]]:
    try:
        response = await http.post(f"{plan.task_url.rstrip('/')}/rollout", json=_request(plan, seed, sample))
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise ValueError(f"response of {len(response.content)} bytes")
        if response.status_code >= 400:
            detail = response.text[:300].replace("\n", " ")
            raise ValueError(f"HTTP {response.status_code}: {detail}")
        body = response.json()
        if not isinstance(body, dict) or not isinstance(body.get("metrics"), dict):
            raise ValueError("the response has no metrics")
    except (httpx.HTTPError, ValueError) as err:
        return [error_row(seed=seed, split=plan.split, model=plan.model, sample=sample,
                          error=f"{type(err).__name__}: {err}")]  # fmt: skip
    rows = rows_from_response(body, seed=seed, split=plan.split, model=plan.model, sample=sample,
                              task_id=plan.task_id)  # fmt: skip
    trace = body.get("trace") if isinstance(body.get("trace"), dict) else None
    for row in rows:
        if trace is not None:
            row["trace"] = trace  # the task app's v3 trace: for --sqlite, never into the JSONL
        if plan.judges:
            from posttrain.evaluation.judges import score

            scores, errors = await asyncio.to_thread(score, plan.judges, seed, body, row)
            row["metadata"]["judge_scores"] = scores
            for line in errors:
                print(line, file=sys.stderr)
    return rows


async def _run(plan: EvalPlan, on_rows: Callable[[list[dict[str, Any]]], None], progress: Any) -> None:
    semaphore = asyncio.Semaphore(plan.concurrency)
    limits = httpx.Limits(max_connections=plan.concurrency * 2, keepalive_expiry=IDLE_CONNECTION_EXPIRY_S)
    headers = auth_headers(plan.api_key)
    async with httpx.AsyncClient(timeout=plan.timeout_s, limits=limits, headers=headers) as http:

        async def task(seed: int, sample: int) -> None:
            async with semaphore:
                rows = await _one(http, plan, seed, sample)
            on_rows(rows)
            progress.update(1)

        await asyncio.gather(*(task(seed, s) for seed in plan.seeds for s in range(plan.samples)))


def collect(
    plan: EvalPlan, on_rows: Callable[[list[dict[str, Any]]], None], *, show_progress: bool = True
) -> float:
    """Run every rollout of the plan; rows go to on_rows as they come. Returns the seconds it took."""
    from tqdm import tqdm

    started = time.monotonic()
    total = len(plan.seeds) * plan.samples
    with tqdm(total=total, desc=f"eval {plan.model}", unit="rollout", file=sys.stderr,
              disable=not show_progress, dynamic_ncols=True) as progress:  # fmt: skip
        asyncio.run(_run(plan, on_rows, progress))
    return time.monotonic() - started
