"""Seeded sampling on real vLLM (CPU backend, the tiny model) behind real rollout servers: with the job's seed
(`serve --seed`), a sampled request (temperature 1) of a rerun (another run's cid, the same rollout) returns
the same tokens; another rollout, another turn of the same episode, or another job seed returns others.
The derivation itself: tests/unit/test_sampling_seed.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fixtures.vllm import STOP_GRACE_S, start_rollout_server
from posttrain import reaper
from posttrain.localhost import stop_group

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def seeded_servers(vllm_model_dir, tmp_path_factory):
    """Two policy servers on the same weights, job seeds 1234 and 1235 (started side by side)."""
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(
            lambda seed: start_rollout_server(Path(vllm_model_dir), tmp_path_factory.mktemp(f"seed-{seed}"),
                                              extra=["--seed", str(seed)]),
            (1234, 1235),
        ))  # fmt: skip
    try:
        yield [server for _, server in started]
    finally:
        for proc, _ in started:
            stop_group(proc, STOP_GRACE_S)
            reaper.unwatch(proc.pid)


def sample(server, cid: str) -> list[int]:
    body = {"model": server.served_model_name, "messages": PROMPT, "max_tokens": 24, "temperature": 1.0,
            "top_p": 1.0, "ignore_eos": True}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", params={"cid": cid}, json=body, timeout=300)
    assert r.status_code == 200, r.text
    captured = httpx.get(f"{server.url}/v1/captures/{cid}", timeout=30).json()
    assert captured[-1]["completion_token_ids"] == r.json()["choices"][0]["token_ids"]
    return r.json()["choices"][0]["token_ids"]


def test_same_seed_same_rollout_same_tokens_else_different(seeded_servers):
    first, other_seed = seeded_servers
    run_a = sample(first, "trace_demo-rl-aaaaaaaa-it1-s8-r3")
    run_b = sample(first, "trace_demo-rl-bbbbbbbb-it1-s8-r3")  # a rerun: another uid, the same rollout
    assert len(run_a) == 24 and run_a == run_b
    assert sample(first, "trace_demo-rl-aaaaaaaa-it1-s8-r3") != run_a  # the episode's next turn
    assert sample(first, "trace_demo-rl-aaaaaaaa-it1-s8-r4") != run_a  # another rollout of the group
    assert sample(other_seed, "trace_demo-rl-cccccccc-it1-s8-r3") != run_a  # another job seed
    # and that other server repeats itself too
    assert sample(other_seed, "trace_demo-rl-dddddddd-it1-s8-r3") == sample(
        other_seed, "trace_demo-rl-eeeeeeee-it1-s8-r3"
    )
