"""posttrain_trainer.judge_client without a model: the reply parser, rubric aggregation, and the client's
retry/timeout paths over a mock transport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from posttrain.api.judge_settings import JudgeSettings
from posttrain_trainer.judge_client import (
    JudgeClient,
    Rubric,
    aggregate,
    build_messages,
    parse_judgement,
)

RUBRIC = Rubric.from_dict(
    {
        "goal_text": "solve it",
        "aggregation": "weighted_sum",
        "criteria": [
            {"id": "correct", "weight": 0.7, "scale": "binary", "description": "right answer"},
            {"id": "concise", "weight": 0.3, "scale": "bounded", "description": "short"},
        ],
    }
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"score": 0.8}', 0.8),
        ('Sure! ```json\n{"score": "0.25"}\n``` done', 0.25),
        ('<think>hmm {"score": 0.1}</think>{"score": 0.9}', 0.9),
        ('prefix {"total": 1} suffix', 1.0),
        ("0.5", 0.5),
        ("no idea", None),
        ("", None),
        (None, None),
        ('{"score": "high"}', None),
        ('{"score": NaN}', None),
        ("{broken json", None),
        ("<think>never closed", None),
    ],
)
def test_parse_judgement(text, expected):
    assert parse_judgement(text) == expected


def test_parse_with_rubric_criteria():
    text = '{"criteria": {"correct": 1, "concise": 0.5}, "score": 42}'
    assert parse_judgement(text, RUBRIC) == pytest.approx(0.7 + 0.15)
    listed = '{"criteria": [{"id": "correct", "score": 0.2}, {"id": "concise", "score": 2}]}'
    assert parse_judgement(listed, RUBRIC) == pytest.approx(0.0 + 0.3)  # binary rounds, bounded clips
    partial = '{"criteria": {"correct": 1}, "score": 0.4}'
    assert parse_judgement(partial, RUBRIC) == 0.4  # incomplete criteria: fall back to the total


def test_aggregate_mean_and_empty():
    assert aggregate(Rubric(), {}) is None
    mean = Rubric.from_dict(
        {"aggregation": "mean", "criteria": [{"id": "a", "weight": 1}, {"id": "b", "weight": 3}]}
    )
    assert aggregate(mean, {"a": 1.0, "b": 0.0}) == 0.25


def test_messages_mention_every_criterion():
    msgs = build_messages(RUBRIC, "episode", {"answer": 4})
    assert (
        "correct" in msgs[1]["content"]
        and "concise" in msgs[1]["content"]
        and '"answer": 4' in msgs[1]["content"]
    )


def _transport(replies):
    calls = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(json.loads(request.content))
        reply = replies[min(len(calls) - 1, len(replies) - 1)]
        if isinstance(reply, float):
            await asyncio.sleep(reply)
            return httpx.Response(200, json={"choices": [{"message": {"content": '{"score": 1}'}}]})
        if isinstance(reply, int):
            return httpx.Response(reply, json={"error": "x"})
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})

    return httpx.MockTransport(handler), calls


def test_client_retries_then_scores():
    transport, calls = _transport([503, 429, '{"score": 0.6}'])
    client = JudgeClient("http://judge:8000", "m", retries=2, backoff_s=0.001, transport=transport)
    assert client.base_url == "http://judge:8000/v1"
    assert asyncio.run(client.score_outcome(None, "answer")) == 0.6
    assert len(calls) == 3 and calls[0]["model"] == "m"


def test_client_gives_up_and_non_retryable():
    transport, calls = _transport([503])
    client = JudgeClient("http://judge/v1", "m", retries=1, backoff_s=0.001, transport=transport)
    assert asyncio.run(client.score_outcome(None, "x")) is None and len(calls) == 2
    transport, calls = _transport([400])
    client = JudgeClient("http://judge/v1", "m", retries=3, backoff_s=0.001, transport=transport)
    assert asyncio.run(client.score_outcome(None, "x")) is None and len(calls) == 1


def test_client_timeout_returns_none_quickly():
    transport, _ = _transport([5.0])
    client = JudgeClient("http://judge/v1", "m", timeout=0.2, transport=transport)

    async def timed():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        value = await client.score_outcome(None, "x")
        return value, loop.time() - t0

    value, seconds = asyncio.run(timed())
    assert value is None and seconds < 1.0 and client.stats["timeouts"] == 1


def test_client_unparsable_and_episode():
    transport, _ = _transport(["blah blah"])
    client = JudgeClient("http://judge/v1", "m", transport=transport)
    out = asyncio.run(client.judge_episode({}, outcome="o", events=["a", "b"]))
    assert out == {"outcome_score": None, "event_scores": [None, None]}
    assert client.stats["unparsable"] == 3


def test_provider_names(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", "k")
    client = JudgeClient("groq", "llama")
    assert client.base_url == "https://api.groq.com/openai/v1" and client._headers() == {
        "Authorization": "Bearer k"
    }
    assert JudgeClient("gemini", "g").base_url.endswith("/v1beta/openai")
    settings = JudgeSettings(provider="openai", model="gpt", timeout_s=5, max_concurrency=3, api_key_env="K")
    client = JudgeClient.from_settings(settings)
    assert (client.timeout, client.max_concurrency, client.api_key_env) == (5.0, 3, "K")
    assert client.base_url == "https://api.openai.com/v1"
