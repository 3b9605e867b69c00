"""Seeded sampling on real vLLM (CPU backend, the tiny model) behind real rollout servers: with the job's seed
(`serve --seed`), a sampled request (temperature 1) of a rerun (another run's cid, the same rollout) returns
the same tokens; another rollout, another turn of the same episode, or another job seed returns others.
The derivation itself: tests/unit/test_sampling_seed.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from fixtures.vllm import STOP_GRACE_S, start_rollout_server
from posttrain import reaper
from posttrain.localhost import stop_group
from posttrain_rollout.seeding import request_seed

pytestmark = pytest.mark.vllm

PROMPT = [{"role": "user", "content": "Name three colours."}]


JOB_SEED = 1234


@pytest.fixture(scope="module")
def seeded_server(vllm_model_dir, tmp_path_factory):
    """A policy server with the job seed 1234 (one server: another job's seed is a request seed below)."""
    proc, server = start_rollout_server(Path(vllm_model_dir), tmp_path_factory.mktemp("seeded"),
                                        extra=["--seed", str(JOB_SEED)])  # fmt: skip
    try:
        yield server
    finally:
        stop_group(proc, STOP_GRACE_S)
        reaper.unwatch(proc.pid)


def sample(server, cid: str, seed: int | None = None) -> list[int]:
    body = {"model": server.served_model_name, "messages": PROMPT, "max_tokens": 24, "temperature": 1.0,
            "top_p": 1.0, "ignore_eos": True, **({"seed": seed} if seed is not None else {})}  # fmt: skip
    r = httpx.post(f"{server.url}/v1/chat/completions", params={"cid": cid}, json=body, timeout=300)
    assert r.status_code == 200, r.text
    captured = httpx.get(f"{server.url}/v1/captures/{cid}", timeout=30).json()
    assert captured[-1]["completion_token_ids"] == r.json()["choices"][0]["token_ids"]
    return r.json()["choices"][0]["token_ids"]


def test_same_seed_same_rollout_same_tokens_else_different(seeded_server):
    run_a = sample(seeded_server, "trace_demo-rl-aaaaaaaa-it1-s8-r3")
    run_b = sample(seeded_server, "trace_demo-rl-bbbbbbbb-it1-s8-r3")  # a rerun: another uid, the same rollout
    assert len(run_a) == 24 and run_a == run_b
    assert sample(seeded_server, "trace_demo-rl-aaaaaaaa-it1-s8-r3") != run_a  # the episode's next turn
    assert sample(seeded_server, "trace_demo-rl-aaaaaaaa-it1-s8-r4") != run_a  # another rollout of the group
    # the proxy's seed is exactly the derivation's: the same tokens when a request carries that seed itself
    # (a request's own seed wins), and another job seed's derivation samples others
    own = request_seed(JOB_SEED, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 0)
    assert sample(seeded_server, "trace_demo-rl-ffffffff-it2-s1-r0", seed=own) == run_a
    other_job = request_seed(JOB_SEED + 1, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 0)
    assert sample(seeded_server, "trace_demo-rl-gggggggg-it2-s1-r0", seed=other_job) != run_a


def test_the_engine_core_was_forked(seeded_server):
    """One CPU worker runs inside vLLM's engine core, which the API server forks (vllm_plugins.fork_engine_core):
    the samples above came from a forked engine."""
    log = seeded_server.log_path.read_text(errors="replace")
    assert "vLLM's engine core starts by fork" in log, log[-3000:]


def test_the_engine_core_counted_logprob_ranks_eagerly(seeded_server):
    """The samples above carried logprobs, which vLLM ranks with a torch.compile'd count: on a CPU the engine
    core counts them eagerly (vllm_plugins.eager_logprob_ranks), so no request compiled anything."""
    log = seeded_server.log_path.read_text(errors="replace")
    assert re.search(r"\(EngineCore pid=\d+\).*vLLM's logprob ranks are counted eagerly", log), log[-3000:]
