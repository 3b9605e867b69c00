"""The RL reward with an LLM judge: the trainer's RolloutClient against the real math task app (a process on
127.0.0.1), a scripted OpenAI-compatible policy and a scripted judge (one uvicorn server on 127.0.0.1, so the
judge's verdict and latency are under the test's control; the judge client itself is tested against a
served vLLM model in test_rollout_server.py).

What must hold: with [rubric] weights and a [judge], every training episode is sent to the judge (its
submitted answer is in the prompt), the judge's score replaces the task app's outcome_score and the reward
is synth's blend; a judge slower than its timeout never holds an iteration past about twice that timeout and
the task app's scores stand; eval rollouts are not judged; no [judge] -> env return only."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from posttrain_trainer.judging import EpisodeJudge, episode_for_judge, judge_base_url, judge_options
from posttrain_trainer.rollouts import RolloutClient, plan_rollouts, rubric_weights

ANSWER_MARK = "posttrain-judge-test"


class Scripted:
    """Policy (`/policy/v1/chat/completions`) and judge (`/judge/v1/chat/completions`) in one app."""

    def __init__(self) -> None:
        self.judge_score = 0.7
        self.judge_delay = 0.0
        self.judge_prompts: list[str] = []
        self.app = FastAPI()

        @self.app.post("/policy/v1/chat/completions")
        async def policy(request: Request) -> dict[str, Any]:
            body = await request.json()
            n = int(body.get("n") or 1)
            text = f"I think the answer is 7. ({ANSWER_MARK})"
            return {
                "id": "cmpl-1",
                "object": "chat.completion",
                "model": body.get("model"),
                "choices": [
                    {"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
                    for i in range(n)
                ],
            }

        @self.app.delete("/policy/v1/captures/{cid}")
        async def drop(cid: str) -> dict[str, Any]:
            return {"deleted": cid}

        @self.app.post("/judge/v1/chat/completions")
        async def judge(request: Request) -> dict[str, Any]:
            body = await request.json()
            self.judge_prompts.append(body["messages"][-1]["content"])
            if self.judge_delay:
                await asyncio.sleep(self.judge_delay)
            reply = json.dumps(
                {"criteria": {"last_number_correct": self.judge_score}, "score": self.judge_score}
            )
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Scripted, str]]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    state = Scripted()
    server = uvicorn.Server(uvicorn.Config(state.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "scripted policy/judge server did not start"
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def rl_config(judge_url: str | None, timeout_s: float = 5.0) -> dict[str, Any]:
    config: dict[str, Any] = {
        "rollout": {"env_name": "math", "policy_name": "math-single-step", "max_turns": 1},
        "training": {"batch_size": 2, "group_size": 2},
        "rubric": {"enabled": True, "weights": {"env": 0.5, "outcome": 0.5, "event": 0.0}},
    }
    if judge_url:
        config["judge"] = {
            "timeout_s": timeout_s,
            "options": {
                "provider": "self-hosted",
                "model": "judge",
                "outcome": True,
                "event": False,
                "base_url": judge_url,
                "rubric_overrides": {
                    "outcome": {
                        "goal_text": "Answer the arithmetic question.",
                        "criteria": [
                            {
                                "id": "last_number_correct",
                                "weight": 1.0,
                                "scale": "bounded",
                                "description": "the last number is the right answer",
                            },
                        ],
                    }
                },  # fmt: skip
            },
        }
    return config


def collect(config: dict[str, Any], math_taskapp: Any, base: str, mode: str = "rl"):
    weights = rubric_weights(config)
    judge = EpisodeJudge.from_config(config, weights)
    client = RolloutClient(
        task_url=math_taskapp.url, config=config, model="policy", api_key=math_taskapp.api_key, judge=judge
    )
    specs = plan_rollouts("judgetest", 0, [3, 4], 2, [f"{base}/policy"])
    started = time.monotonic()
    results = asyncio.run(client.collect(specs, mode=mode, want_tokens=False))
    return results, judge, time.monotonic() - started


def test_judge_config_rules():
    weights = {"env": 0.5, "outcome": 0.5, "event": 0.0}
    assert judge_options({}, weights) is None
    assert judge_options({"judge": {"options": {"provider": "openai"}}}, weights) is None  # no model
    assert (
        judge_options({"judge": {"enabled": False, "options": {"provider": "openai", "model": "m"}}}, weights)
        is None
    )
    # rubric weights give the judge nothing to do -> not called
    assert judge_options({"judge": {"options": {"provider": "openai", "model": "m"}}}, {"env": 1.0}) is None
    options = judge_options(
        {"judge": {"timeout_s": 9, "options": {"provider": "groq", "model": "m"}}}, weights
    )
    assert options["timeout_s"] == 9 and options["outcome"] is True and options["event"] is False
    assert judge_base_url(options, None) == "groq"
    hosted = {"provider": "self-hosted", "model": "m"}
    assert judge_base_url(hosted, {"judge": "http://j.ns.svc:8000"}) == "http://j.ns.svc:8000"
    with pytest.raises(ValueError, match="no judge endpoint"):
        judge_base_url(hosted, {})
    outcome, events = episode_for_judge(
        {
            "trajectories": [
                {
                    "steps": [
                        {
                            "obs": {"q": "1+1"},
                            "tool_calls": [{"args": {"answer": "2"}}],
                            "reward": 1.0,
                            "done": True,
                        }
                    ],
                    "final": {"reward": 1.0},
                }
            ]
        }  # fmt: skip
    )
    assert outcome["steps"] == 1 and '"2"' in outcome["last_action"] and events[0]["reward"] == 1.0
    assert episode_for_judge({"trajectories": []}) == (None, [])


def test_judge_score_replaces_outcome_and_is_blended(math_taskapp, scripted):
    state, base = scripted
    state.judge_delay, state.judge_score = 0.0, 0.7
    state.judge_prompts.clear()
    results, judge, _ = collect(rl_config(f"{base}/judge"), math_taskapp, base)
    assert all(r.ok for r in results), [r.error for r in results]
    assert judge.stats == {"judged": 4, "fallback": 0}
    assert len(state.judge_prompts) == 4 and all(ANSWER_MARK in p for p in state.judge_prompts)
    assert "last_number_correct" in state.judge_prompts[0]  # the rubric override reached the judge
    for r in results:
        assert r.outcome_score == pytest.approx(0.7)
        assert r.reward == pytest.approx(0.5 * r.env_return + 0.5 * 0.7)


def test_slow_judge_falls_back_to_task_app_scores_within_timeout(math_taskapp, scripted):
    state, base = scripted
    state.judge_delay = 5.0
    try:
        results, judge, seconds = collect(rl_config(f"{base}/judge", timeout_s=0.5), math_taskapp, base)
    finally:
        state.judge_delay = 0.0
    assert all(r.ok for r in results)
    assert judge.stats["fallback"] == 4 and judge.stats["judged"] == 0
    assert seconds < 4.0, f"a 5 s judge held the iteration {seconds:.1f} s (timeout 0.5 s)"
    for r in results:  # the task app's own outcome_score (its rubric: the answer's correctness) stands
        assert r.outcome_score == pytest.approx(r.env_return)
        assert r.reward == pytest.approx(0.5 * r.env_return + 0.5 * r.outcome_score)


def test_eval_rollouts_and_jobs_without_judge_are_not_judged(math_taskapp, scripted):
    state, base = scripted
    state.judge_prompts.clear()
    results, judge, _ = collect(rl_config(f"{base}/judge"), math_taskapp, base, mode="eval")
    assert all(r.ok for r in results) and state.judge_prompts == [] and judge.stats["judged"] == 0
    results, judge, _ = collect(rl_config(None), math_taskapp, base)
    assert judge is None
    for r in results:  # synth: rubric scoring is off without [judge] -> env return only
        assert r.reward == pytest.approx(r.env_return)
