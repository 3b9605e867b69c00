"""Seeded sampling: the seed a rollout server derives for each captured request (posttrain_rollout.seeding),
what the proxy sends vLLM (against an in-process fake of vLLM; real vLLM: tests/integration/
test_rollout_seed.py), and the job seed's way from the TOML to the server's --seed
(posttrain.api.sampling_seed)."""

from __future__ import annotations

import asyncio

import pytest
from posttrain.api.sampling_seed import job_seed, seed_args
from posttrain.api.vision import rollout_server_args
from posttrain_rollout import seeding
from posttrain_rollout.__main__ import build_parser

from tests.unit.test_rollout_proxy import make


def test_the_run_independent_part_of_a_trainer_cid():
    assert seeding.call_key("trace_demo-rl-1a2b3c4d-it3-s17-r2") == "it3-s17-r2"
    assert seeding.call_key("trace_demo-rl-1a2b3c4d-ev14-s1000005-r0") == "ev14-s1000005-r0"
    assert seeding.call_key("trace_eval-4f9c0a1b2e") == "trace_eval-4f9c0a1b2e"  # another shape: whole


def test_a_rerun_samples_with_the_same_seeds_and_everything_else_differs():
    seed = seeding.request_seed
    # same job seed and rollout, another run (uid): the same seed
    assert seed(1234, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 0) == seed(1234, "trace_demo-rl-bbbbbbbb-it1-s8-r3", 0)
    base = seed(1234, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 0)
    others = [
        seed(1235, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 0),  # another job seed
        seed(1234, "trace_demo-rl-aaaaaaaa-it1-s8-r4", 0),  # another rollout of the group
        seed(1234, "trace_demo-rl-aaaaaaaa-it1-s9-r3", 0),  # another group
        seed(1234, "trace_demo-rl-aaaaaaaa-it2-s8-r3", 0),  # another iteration
        seed(1234, "trace_demo-rl-aaaaaaaa-ev1-s8-r3", 0),  # an evaluation
        seed(1234, "trace_demo-rl-aaaaaaaa-it1-s8-r3", 1),  # the episode's next turn
    ]
    assert len({base, *others}) == 7
    # vLLM seeds n > 1 samples with seed + index, and takes int64
    assert all(0 <= s < 2**62 for s in [base, *others])


def test_call_counter_counts_per_cid_and_forgets_the_oldest():
    counter = seeding.CallCounter(max_cids=2)
    assert [counter.next("a"), counter.next("a"), counter.next("b"), counter.next("a")] == [0, 1, 0, 2]
    counter.next("c")  # "b" is now the oldest: forgotten
    assert counter.next("a") == 3 and counter.next("b") == 0


def test_the_proxy_seeds_captured_requests_that_name_no_seed(tmp_path):
    calls: list = []

    async def scenario():
        _, http = make(calls, run_dir=tmp_path, seed=7)
        for _ in range(2):  # two turns of one episode
            await http.post("/v1/chat/completions?cid=trace_j-1234abcd-it1-s5-r0", json={"messages": []})
        await http.post("/v1/completions?cid=trace_j-1234abcd-it1-s5-r1", json={"prompt": "x"})
        await http.post("/v1/chat/completions?cid=trace_j-1234abcd-it1-s5-r2", json={"messages": [], "seed": 3})
        await http.post("/v1/chat/completions", json={"messages": []})  # no cid: not a rollout, untouched

    asyncio.run(scenario())
    sent = [body.get("seed") for _, body in calls]
    cid = "trace_j-1234abcd-it1-s5-r0"
    assert sent == [seeding.request_seed(7, cid, 0), seeding.request_seed(7, cid, 1),
                    seeding.request_seed(7, "it1-s5-r1", 0), 3, None]  # fmt: skip


def test_without_a_job_seed_nothing_is_seeded(tmp_path):
    calls: list = []

    async def scenario():
        _, http = make(calls, run_dir=tmp_path)
        await http.post("/v1/chat/completions?cid=trace_j-1234abcd-it1-s5-r0", json={"messages": []})

    asyncio.run(scenario())
    assert "seed" not in calls[0][1]


@pytest.mark.parametrize(
    "config,seed",
    [({}, 0), ({"training": {"seed": 42}}, 42), ({"algorithm": {"seed": 9}}, 9),
     ({"training": {"seed": 5}, "algorithm": {"seed": 9}}, 5)],
)  # fmt: skip
def test_the_job_seed_reaches_the_policy_servers_flags(config, seed):
    assert job_seed(config) == seed
    args = rollout_server_args(config)
    assert args[args.index("--seed") + 1] == str(seed) and seed_args(config) == ["--seed", str(seed)]
    parsed = build_parser().parse_args(["serve", "--model", "m", *args])
    assert parsed.seed == seed


def test_the_operators_rollout_deployment_carries_the_jobs_seed():
    """[training] seed = 7 travels in the RLJob's training.extras and reaches the policy server's command."""
    from fixtures.jobs import RL_SPEC
    from posttrain.controller import render

    from tests.unit.test_render import SETTINGS, TARGET, by, rljob

    def command(job) -> list[str]:
        out = render.render_rljob(job, SETTINGS, TARGET)
        return by(out.children, "Deployment", "rollout")["spec"]["template"]["spec"]["containers"][0]["command"]

    base = rljob()
    seeded = rljob(training={**RL_SPEC["training"], "extras": {"seed": 7}})
    assert command(base)[-2:] == ["--seed", "0"] and command(seeded)[-2:] == ["--seed", "7"]
