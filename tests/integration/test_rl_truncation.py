"""Truncated and empty responses through the trainer's RolloutClient, the real math task app (a process on
127.0.0.1) and the real rollout server (posttrain_rollout.server on uvicorn, 127.0.0.1), which records each
call's finish_reason in its captures.

Two upstreams behind the rollout server:
  - a scripted OpenAI-compatible model, so that a group holds exactly one right answer, one response cut
    at max_tokens (finish_reason "length") and one empty response (no completion token): no model can be
    made to produce an empty response on demand;
  - real vLLM (CPU) on the tiny model (marked vllm): with max_tokens 3 its finish_reason decides which
    rollouts are truncated.

What must hold: the finish_reason reaches the trainer; an empty response is scored and stays in its group
(its reward enters the group's advantages, it trains no token); [training].overlong keep / mask / penalty
treat the truncated rollout as documented; the counts reach the iteration stats."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from posttrain.api.rollout_settings import RolloutSettings
from posttrain.localhost import free_port
from posttrain_rollout.server import Proxy, create_app
from posttrain_trainer import gspo
from posttrain_trainer.rl import sequences_from_results
from posttrain_trainer.rollouts import RolloutClient, RolloutLoop, plan_rollouts

QUESTION = re.compile(r"What is (-?\d+) ([-+*]) (-?\d+)\?")
RAMBLE = "Let me think about this step by step, first I look at the"  # cut before any number


def _serve(app: Any) -> tuple[uvicorn.Server, threading.Thread, str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started, "server did not start"
    return server, thread, f"http://127.0.0.1:{port}"


def scripted_model() -> FastAPI:
    """Per question, the k-th call answers right (stop), then rambles to max_tokens (length), then says
    nothing (stop, no token): with group size 3 every group holds one of each."""
    app = FastAPI()
    calls: Counter[str] = Counter()

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        question = body["messages"][-1]["content"]
        a, op, b = QUESTION.search(question).groups()
        answer = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        kind = calls[question] % 3
        calls[question] += 1
        text, tokens, finish = [
            (str(answer), [11, 12], "stop"),
            (RAMBLE, [21] * int(body.get("max_tokens") or 8), "length"),
            ("", [], "stop"),
        ][kind]
        return {
            "id": "cmpl-scripted",
            "object": "chat.completion",
            "model": body.get("model"),
            "prompt_token_ids": [1, 2, 3],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "token_ids": tokens,
                    "logprobs": {"content": [{"token": "t", "logprob": -0.5} for _ in tokens]},
                    "finish_reason": finish,
                }
            ],
        }

    return app


@pytest.fixture(scope="module")
def scripted_rollout_server(tmp_path_factory) -> Iterator[str]:
    model, model_thread, model_url = _serve(scripted_model())
    proxy = Proxy(model_url, served_model_name="scripted", run_dir=tmp_path_factory.mktemp("proxy"))
    rollout, rollout_thread, rollout_url = _serve(create_app(proxy))
    try:
        yield rollout_url
    finally:
        for server, thread in ((rollout, rollout_thread), (model, model_thread)):
            server.should_exit = True
            thread.join(10)


def _config(max_tokens: int) -> dict[str, Any]:
    return {
        "rollout": {
            "env_name": "math",
            "policy_name": "math-single-step",
            "max_turns": 1,
            "env_config": {"difficulty": "easy"},
            "policy_config": {"temperature": 1.0, "max_tokens": max_tokens},
        },
        "training": {"batch_size": 2, "group_size": 3},
    }


def _collect(
    config, math_taskapp, endpoint: str, seeds: list[int], group: int, run: str, model: str = "policy"
):
    client = RolloutClient(
        task_url=math_taskapp.url, settings=RolloutSettings.from_config(config), model=model, api_key=math_taskapp.api_key
    )
    with RolloutLoop() as loop:
        return loop.collect(client, plan_rollouts(run, 0, seeds, group, [endpoint]))


def test_empty_response_stays_in_its_group_and_overlong_is_treated(math_taskapp, scripted_rollout_server):
    results = _collect(_config(6), math_taskapp, scripted_rollout_server, [3, 4], 3, "trunc")
    assert [r.error for r in results if not r.ok] == []  # the empty response is no longer a failed rollout
    by_kind = {"right": [], "cut": [], "empty": []}
    for r in results:
        kind = "empty" if r.empty else "cut" if r.truncated else "right"
        by_kind[kind].append(r)
    assert {k: len(v) for k, v in by_kind.items()} == {"right": 2, "cut": 2, "empty": 2}
    assert all(
        r.finish_reasons == ["length"] and r.sequences[0].completion_ids == [21] * 6 for r in by_kind["cut"]
    )
    assert all(
        r.finish_reasons == ["stop"] and r.sequences == [] and r.reward == 0.0 for r in by_kind["empty"]
    )
    assert all(r.reward == 1.0 for r in by_kind["right"]) and all(r.reward == 0.0 for r in by_kind["cut"])

    # the group's advantages are over all three members: the empty response's 0 counts
    three = gspo.ragged_group_advantages([1.0, 0.0, 0.0], [0, 0, 0])[0]
    seqs, stats = sequences_from_results(results, overlong="keep")
    assert stats["truncated"] == 2 and stats["empty_responses"] == 2 and stats["failed"] == 0
    assert (
        sorted(round(s.advantage, 6) for s in seqs if s.completion_ids == [11, 12]) == [round(three, 6)] * 2
    )
    assert sum(1 for s in seqs if s.completion_ids == [21] * 6) == 2  # keep: the cut response trains

    masked, stats = sequences_from_results(results, overlong="mask")
    assert [s.completion_ids for s in masked] == [[11, 12], [11, 12]] and stats["train_sequences"] == 2
    assert all(round(s.advantage, 6) == round(three, 6) for s in masked)  # its reward still counts

    penalised, _ = sequences_from_results(results, overlong="penalty", overlong_penalty=-1.0)
    cut_adv = gspo.ragged_group_advantages([1.0, -1.0, 0.0], [0, 0, 0])[1]
    assert [round(s.advantage, 6) for s in penalised if s.completion_ids == [21] * 6] == [
        round(cut_adv, 6)
    ] * 2


@pytest.mark.vllm
def test_vllm_finish_reason_decides_truncation(math_taskapp, policy_server, vllm_model_dir):
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(vllm_model_dir).eos_token_id
    model = policy_server.served_model_name
    results = _collect(_config(3), math_taskapp, policy_server.url, [1, 2, 3, 4], 2, "vllmtrunc", model)
    assert [r.error for r in results if not r.ok] == []
    for r in results:
        (reason,) = r.finish_reasons
        tokens = r.sequences[0].completion_ids if r.sequences else []
        assert reason in ("length", "stop")
        assert r.truncated == (reason == "length") == (len(tokens) == 3 and tokens[-1] != eos), (
            reason,
            tokens,
        )
    assert sum(r.truncated for r in results) >= 1
