"""The RL reward with an LLM judge: the trainer's RolloutClient against the real math task app (a process on
127.0.0.1), a scripted OpenAI-compatible policy and a scripted judge (one uvicorn server on 127.0.0.1, so the
judge's verdict and latency are under the test's control; the judge client itself is tested against a
served vLLM model in test_rollout_server.py).

What must hold: with [rubric] weights and a [judge], every training episode is sent to the judge (its
submitted answer is in the prompt), the judge's score replaces the task app's outcome_score and the reward
is synth's blend; the judge answers every rollout of every iteration, under the trainer's one loop per job
and under a new loop per iteration; a judge slower than its timeout never holds an iteration past about
twice that timeout, and a rollout it could not score fails (counted in judge_failed, out of its group,
against the error budget) instead of taking the task app's score; eval rollouts are not judged; no [judge]
-> env return only; without rubric_overrides the judge scores against the task app's /task_info rubric."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, HTTPException, Request
from fixtures.loopback import served
from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer.judging import EpisodeJudge, episode_for_judge, judge_base_url
from posttrain_trainer.rl import sequences_from_results
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    RolloutClient,
    RolloutLoop,
    plan_rollouts,
)
from posttrain_trainer.task_rubric import judge_rubrics

ANSWER_MARK = "posttrain-judge-test"


class Scripted:
    """Policy (`/policy/v1/chat/completions`) and judge (`/judge/v1/chat/completions`) in one app."""

    def __init__(self) -> None:
        self.judge_score = 0.7
        self.judge_delay = 0.0
        self.judge_prompts: list[str] = []
        self.judge_rejects = 0  # the next N judge requests get HTTP 400 (not retried)
        self.judge_replies: Counter[str] = Counter()  # judge requests answered with a score, by model
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
            if self.judge_rejects > 0:
                self.judge_rejects -= 1
                raise HTTPException(400, "rejected by the test")
            if self.judge_delay:
                await asyncio.sleep(self.judge_delay)
            self.judge_replies[body["model"]] += 1
            reply = json.dumps(
                {"criteria": {"last_number_correct": self.judge_score}, "score": self.judge_score}
            )
            return {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}


@pytest.fixture(scope="module")
def scripted() -> Iterator[tuple[Scripted, str]]:
    state = Scripted()
    with served(state.app) as base:
        yield state, base


def rl_config(
    judge_url: str | None,
    timeout_s: float = 5.0,
    max_concurrency: int = 8,
    model: str = "judge",
    overrides: bool = True,
) -> dict[str, Any]:
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
                "model": model,
                "max_concurrency": max_concurrency,
                "outcome": True,
                "event": False,
                "base_url": judge_url,
                "rubric_overrides": None if not overrides else {
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


def rollout_client(config: dict[str, Any], math_taskapp: Any) -> RolloutClient:
    """As the trainer builds it (rl.RLRun.make_judge): the typed judge settings, each judged score's rubric
    (its override, else the task app's /task_info rubric), the judge, the blend."""
    settings = JudgeSettings.resolve(config)
    rubrics = judge_rubrics(
        settings, task_url=math_taskapp.url, headers={"X-API-Key": math_taskapp.api_key}, seed=0
    )
    judge = EpisodeJudge.from_settings(settings, rubrics=rubrics)
    return RolloutClient(
        task_url=math_taskapp.url,
        settings=RolloutSettings.from_config(config),
        model="policy",
        api_key=math_taskapp.api_key,
        weights=settings.blend(),
        judge=judge,
    )


def collect(config: dict[str, Any], math_taskapp: Any, base: str, mode: str = "rl"):
    client = rollout_client(config, math_taskapp)
    judge = client.judge
    specs = plan_rollouts("judgetest", 0, [3, 4], 2, [f"{base}/policy"])
    started = time.monotonic()
    results = asyncio.run(client.collect(specs, mode=mode, want_tokens=False))
    return results, judge, time.monotonic() - started


def test_judge_config_rules():
    blend = {"rubric": {"enabled": True, "weights": {"env": 0.5, "outcome": 0.5, "event": 0.0}}}
    assert not JudgeSettings.resolve(blend).enabled  # no [judge]
    assert not JudgeSettings.resolve({**blend, "judge": {"options": {"provider": "openai"}}}).enabled  # no model
    disabled = {**blend, "judge": {"enabled": False, "options": {"provider": "openai", "model": "m"}}}
    assert not JudgeSettings.resolve(disabled).enabled
    # the blend gives the judge nothing to do -> not called
    assert not JudgeSettings.resolve({"judge": {"options": {"provider": "openai", "model": "m"}}}).enabled
    settings = JudgeSettings.resolve({**blend, "judge": {"timeout_s": 9, "options": {"provider": "groq", "model": "m"}}})
    assert settings.timeout_s == 9 and settings.outcome is True and settings.event is False
    assert judge_base_url(settings, None) == "groq"
    hosted = JudgeSettings(provider="self-hosted", model="m")
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
    assert judge.stats == {"judged": 4, "failed": 0}
    assert len(state.judge_prompts) == 4 and all(ANSWER_MARK in p for p in state.judge_prompts)
    assert "last_number_correct" in state.judge_prompts[0]  # the rubric override reached the judge
    for r in results:
        assert r.outcome_score == pytest.approx(0.7)
        assert r.reward == pytest.approx(0.5 * r.env_return + 0.5 * 0.7)


def test_without_overrides_the_judge_scores_against_the_task_apps_rubric(math_taskapp, scripted):
    """No [judge.options].rubric_overrides: the rubric the real math task app's /task_info returns reaches
    the judge's prompt (synth's behaviour), and the record says where it came from."""
    state, base = scripted
    state.judge_delay, state.judge_score = 0.0, 0.7
    state.judge_prompts.clear()
    client = rollout_client(rl_config(f"{base}/judge", overrides=False), math_taskapp)
    assert client.judge.rubrics.record()["source"] == "task_info"
    specs = plan_rollouts("judgerubric", 0, [3, 4], 2, [f"{base}/policy"])
    results = asyncio.run(client.collect(specs, want_tokens=False))
    assert all(r.ok for r in results), [r.error for r in results]
    assert len(state.judge_prompts) == 4
    for prompt in state.judge_prompts:  # the math app's criterion, by id and by its description
        assert "last_number_correct" in prompt and "exact result of the arithmetic problem" in prompt
        assert "Answer the arithmetic question." not in prompt  # the override's goal is not there
    assert all(r.outcome_score == pytest.approx(0.7) for r in results)


def test_slow_judge_fails_its_rollouts_within_timeout(math_taskapp, scripted):
    state, base = scripted
    state.judge_delay = 5.0
    try:
        results, judge, seconds = collect(rl_config(f"{base}/judge", timeout_s=0.5), math_taskapp, base)
    finally:
        state.judge_delay = 0.0
    assert judge.stats["failed"] == 4 and judge.stats["judged"] == 0
    assert seconds < 4.0, f"a 5 s judge held the iteration {seconds:.1f} s (timeout 0.5 s)"
    # never the task app's outcome_score in the judge's place: each rollout fails, named as a judge failure
    assert all(not r.ok and r.judge_failed and r.error.startswith("RuntimeError: judge:") for r in results)
    _, stats = sequences_from_results(results)
    assert stats["judge_failed"] == 4 and stats["failed"] == 4
    with pytest.raises(RolloutBudgetExceeded, match="judge: no outcome score"):
        ErrorBudget(0.25).check(len(results), [r.error for r in results])


@pytest.mark.parametrize("loop_per", ["job", "iteration"])
def test_judge_answers_every_rollout_of_every_iteration(math_taskapp, scripted, loop_per):
    """6 rollouts per iteration under a judge concurrency of 2 (so calls queue on its semaphore), 3
    iterations: under the trainer's one loop per job, and under a new loop per iteration (asyncio.run),
    the judge server answers all 6 every time and every reward carries its score."""
    state, base = scripted
    state.judge_delay, state.judge_score = 0.05, 0.7
    model = f"judge-loop-per-{loop_per}"  # replies are counted by model: late replies of other tests differ
    client = rollout_client(rl_config(f"{base}/judge", max_concurrency=2, model=model), math_taskapp)
    replies = []
    with RolloutLoop() as loop:
        for iteration in range(3):
            before = state.judge_replies[model]
            specs = plan_rollouts("judgeloops", iteration, [3, 4, 5], 2, [f"{base}/policy"])
            if loop_per == "job":
                results = loop.collect(client, specs, want_tokens=False)
            else:
                results = asyncio.run(client.collect(specs, want_tokens=False))
            replies.append(state.judge_replies[model] - before)
            assert [r.error for r in results if not r.ok] == [], f"iteration {iteration}"
            assert all(r.outcome_score == pytest.approx(0.7) for r in results)
    state.judge_delay = 0.0
    assert replies == [6, 6, 6]
    assert client.judge.stats == {"judged": 18, "failed": 0}
    assert client.judge.client.stats["errors"] == 0


def test_judge_failures_leave_their_group_and_are_counted(math_taskapp, scripted):
    """The judge rejects 2 of 6 requests: those 2 rollouts fail as judge failures (visible in the stats);
    the other members of their groups train on judge scores only."""
    state, base = scripted
    state.judge_delay, state.judge_score, state.judge_rejects = 0.0, 0.7, 2
    client = rollout_client(rl_config(f"{base}/judge", max_concurrency=1), math_taskapp)
    specs = plan_rollouts("judgefail", 0, [3, 4, 5], 2, [f"{base}/policy"])
    with RolloutLoop() as loop:
        results = loop.collect(client, specs, want_tokens=False)
    state.judge_rejects = 0
    failed = [r for r in results if not r.ok]
    assert len(failed) == 2 and all(r.judge_failed for r in failed)
    assert all("judge: no outcome score" in r.error for r in failed)
    assert all(r.outcome_score == pytest.approx(0.7) for r in results if r.ok)
    _, stats = sequences_from_results(results)
    assert stats["judge_failed"] == 2 and stats["failed"] == 2 and stats["rollouts"] == 6
    assert client.judge.stats == {"judged": 4, "failed": 2}
    with pytest.raises(RolloutBudgetExceeded, match="2 of 6 rollouts failed"):
        ErrorBudget(0.25).check(len(results), [r.error for r in failed])
    ErrorBudget(0.5).check(len(results), [r.error for r in failed])  # within a looser budget: trains on


def test_eval_rollouts_and_jobs_without_judge_are_not_judged(math_taskapp, scripted):
    state, base = scripted
    state.judge_prompts.clear()
    results, judge, _ = collect(rl_config(f"{base}/judge"), math_taskapp, base, mode="eval")
    assert all(r.ok for r in results) and state.judge_prompts == [] and judge.stats["judged"] == 0
    results, judge, _ = collect(rl_config(None), math_taskapp, base)
    assert judge is None
    for r in results:  # synth: rubric scoring is off without [judge] -> env return only
        assert r.reward == pytest.approx(r.env_return)
