"""The craftworld task app (examples/taskapps/craftworld): its world and rewards (pure) and its HTTP contract
in process, the policy a scripted chat-completions app reached through the task app's own HTTP client (an
ASGI transport). The rollout against real vLLM is in tests/integration/test_rl_multiturn.py."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "taskapps" / "craftworld"


def _load():
    spec = importlib.util.spec_from_file_location("craftworld_taskapp", APP_DIR / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["craftworld_taskapp"] = module
    spec.loader.exec_module(module)
    return module


taskapp = _load()
W = taskapp.W
KEY = "sk_env_unit_craftworld_1"
CID = "job-abc-it0-s3-r0"
INFERENCE = f"http://policy.test/v1/chat/completions?cid={CID}"
STEPWISE = {"enabled": True, "mode": "decision_stepwise", "strategy": "consistent", "indicator_lambda": 1.0}


# -- pure: the world -----------------------------------------------------------------------------------


def test_worlds_are_seeded_and_splits_differ():
    a, b = W.make_world(3, "train"), W.make_world(3, "train")
    assert (a.ring, a.area) == (b.ring, b.area)
    assert sorted(a.ring) == sorted(W.AREAS)
    rings = {tuple(W.make_world(s, "train").ring) for s in range(20)}
    assert len(rings) > 10
    assert any(W.make_world(s, "eval").ring != W.make_world(s, "train").ring for s in range(5))


def _goto(world, area):
    while world.area != area:
        W.apply_action(world, "move")


def test_crafting_chain_needs_its_inputs():
    world = W.make_world(0, "train")
    _goto(world, "quarry")
    assert W.apply_action(world, "collect_stone")["ok"] is False  # no pickaxe yet
    assert W.apply_action(world, "place_table")["message"].startswith("place_table needs 2 wood")
    _goto(world, "forest")
    for _ in range(4):
        assert W.apply_action(world, "collect_wood")["achievement"] == "collect_wood"
    assert W.apply_action(world, "place_table")["ok"]
    assert W.apply_action(world, "make_wood_pickaxe")["ok"]
    _goto(world, "quarry")
    assert W.apply_action(world, "collect_stone")["ok"] and W.apply_action(world, "collect_coal")["ok"]
    assert world.inventory == {"wood": 1, "table": 1, "wood_pickaxe": 1, "stone": 1, "coal": 1}


def test_observation_shows_the_area_and_the_legal_actions_last():
    world = W.make_world(0, "train", {"max_steps_per_episode": 3})
    _goto(world, "forest")
    text = W.observation_text(world)
    assert "Area: forest (wood, sapling)" in text and "Step 1/3" in text
    assert text.splitlines()[-1] == "Legal actions: move, collect_wood, collect_sapling."
    W.step(world, ["collect_wood", "collect_wood"])
    after = W.observation_text(world, W.step(world, ["collect_sapling"]))
    assert after.splitlines()[0] == "Result: collect_sapling done. New: collect_sapling."
    assert after.splitlines()[-1] == "Legal actions: move, collect_wood, collect_sapling, place_table."
    _goto(world, "plains")
    # crafting needs no area
    assert W.observation_text(world).splitlines()[-1] == "Legal actions: move, place_table."


def test_step_separates_absolute_and_unique_achievements():
    world = W.make_world(0, "train", {"max_steps_per_episode": 3})
    _goto(world, "forest")
    first = W.step(world, ["collect_wood", "collect_wood", "collect_sapling"])
    assert first["all"] == ["collect_wood", "collect_wood", "collect_sapling"]
    assert first["unique"] == ["collect_wood", "collect_sapling"] and first["reward"] == 2.0
    second = W.step(world, ["collect_wood"])
    assert second["all"] == ["collect_wood"] and second["unique"] == [] and second["reward"] == 0.0
    assert not second["done"]
    assert W.step(world, ["noop"])["done"]  # max_steps_per_episode reached
    assert world.counts == {"collect_wood": 3, "collect_sapling": 1}


def test_text_and_numbered_actions():
    assert W.actions_from_text("I will take action 2 now") == ["collect_wood"]
    assert W.actions_from_text("Move!") == ["move"]
    assert W.actions_from_text("place table") == []  # names are one word: place_table
    assert W.actions_from_text("99 bottles") == []
    assert W.action_from_token(13) == "collect_diamond" and W.action_from_token(True) is None


def test_step_rewards_block_lookup_and_errors():
    assert W.step_rewards_from({}, {}).active is False
    env = {"step_rewards": STEPWISE}
    assert W.step_rewards_from({}, env).active
    policy = {"step_rewards": {"enabled": True, "mode": "off"}}
    assert W.step_rewards_from(policy, env).active is False  # policy.config wins, as in synth's Crafter
    with pytest.raises(W.WorldError, match="step_rewards.mode"):
        W.step_rewards_from({}, {"step_rewards": {"mode": "sometimes"}})
    with pytest.raises(W.WorldError, match="step_rewards.strategy"):
        W.step_rewards_from({}, {"step_rewards": {"strategy": "other"}})
    with pytest.raises(W.WorldError, match="max_steps_per_episode"):
        W.make_world(0, "train", {"max_steps_per_episode": 0})


def test_stepwise_strategies():
    simple = W.step_rewards_from({}, {"step_rewards": {**STEPWISE, "indicator_lambda": 0.5}})
    counts: dict[str, int] = {}
    out = W.stepwise_reward(simple, ["collect_wood", "collect_wood"], ["collect_wood"], counts)
    assert out["reward"] == 0.5 and out["indicator"] == 1
    assert W.stepwise_reward(simple, ["collect_wood"], [], counts)["reward"] == 0.0
    weighted = W.step_rewards_from(
        {},
        {"step_rewards": {**STEPWISE, "strategy": "per_achievement",
                          "weights": {"collect_wood": 0.8}, "k_limits": {"collect_wood": 2}}},
    )  # fmt: skip
    counts = {}
    first = W.stepwise_reward(weighted, ["collect_wood", "collect_wood", "collect_sapling"], [], counts)
    assert first["reward"] == pytest.approx(0.8 + 0.8 + 1.0)
    assert first["credited_achievements"] == ["collect_wood", "collect_wood", "collect_sapling"]
    again = W.stepwise_reward(weighted, ["collect_wood", "collect_sapling"], [], counts)
    assert again["reward"] == 0.0  # wood capped at k = 2, sapling at the default 1


# -- HTTP, with a scripted policy ------------------------------------------------------------------------


class Oracle:
    """A chat-completions app that plays a shadow copy of the seed's world well (so rewards are known) and
    records every request. mode: "tools" (act tool calls) | "text" (a number in plain text)."""

    def __init__(self, seed: int, split: str = "train", mode: str = "tools", max_steps: int = 10):
        self.world = W.make_world(seed, split, {"max_steps_per_episode": max_steps})
        self.mode = mode
        self.requests: list[dict[str, Any]] = []
        self.app = FastAPI()

        @self.app.post("/v1/chat/completions")
        async def chat(request: Request) -> Any:
            body = await request.json()
            body["_query"] = dict(request.query_params)
            self.requests.append(body)
            actions = self.plan()
            W.step(self.world, actions)
            if self.mode == "text":
                message = {"role": "assistant", "content": f"I pick {W.ACTIONS.index(actions[0])}."}
            else:
                args = json.dumps({"actions": actions})
                message = {"role": "assistant", "content": None,
                           "tool_calls": [{"id": f"call{len(self.requests)}", "type": "function",
                                           "function": {"name": "act", "arguments": args}}]}  # fmt: skip
            return {"id": "x", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}

    def plan(self) -> list[str]:
        """Up to 4 actions, simulated on a copy: the first new achievement that is legal, else wood, else move."""
        import copy

        sim, out = copy.deepcopy(self.world), []
        for _ in range(W.MAX_ACTIONS_PER_DECISION if self.mode == "tools" else 1):
            legal = W.legal_actions(sim)
            new = [a for a in W.ACHIEVEMENTS if a in legal and a not in sim.seen and a not in out]
            if new:
                choice = new[-1]  # the deepest in the chain
            elif "collect_wood" in legal and sim.inventory.get("wood", 0) < 4:
                choice = "collect_wood"
            elif "collect_stone" in legal and sim.inventory.get("stone", 0) < 2:
                choice = "collect_stone"
            else:
                choice = "move"
            W.apply_action(sim, choice)
            out.append(choice)
        return out


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    monkeypatch.delenv("ENVIRONMENT_API_KEY_ALIASES", raising=False)


def _client(oracle: Oracle | None = None) -> TestClient:
    app = taskapp.create_app()
    if oracle is not None:
        app.state.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=oracle.app))
    return TestClient(app)


def _body(seed: int = 3, turns: int = 10, env_config: dict | None = None, **over: Any) -> dict[str, Any]:
    body = {
        "run_id": CID,
        "mode": "rl",
        "env": {"env_name": "craftworld", "seed": seed, "config": env_config or {}},
        "policy": {"policy_name": "craftworld-react",
                   "config": {"model": "m", "inference_url": INFERENCE, "temperature": 0.7}},
        "ops": ["agent", "env"] * turns,
        "record": {"trajectories": True},
    }  # fmt: skip
    body.update(over)
    return body


def _post(client: TestClient, body: dict[str, Any]) -> httpx.Response:
    return client.post("/rollout", json=body, headers={"X-API-Key": KEY})


def test_auth_and_task_info(env_key, monkeypatch):
    with _client() as client:
        assert client.get("/").json() == {"status": "ok", "service": "craftworld"}
        assert client.get("/health").status_code == 400
        assert client.get("/health", headers={"Authorization": f"Bearer {KEY}"}).json()["healthy"]
        info = client.get("/task_info", params={"seed": 4}, headers={"X-API-Key": KEY}).json()
        assert info["environment"] == "craftworld" and info["task"]["id"] == "craftworld"
        assert info["rubric"]["outcome"]["criteria"] and info["rubric"]["events"]["criteria"]
        assert info["limits"]["max_turns"] == W.DEFAULT_MAX_STEPS
        assert info["action_space"]["tools"] == ["act"]
        many = client.get("/task_info", params={"seeds": ",".join(map(str, range(10)))},
                          headers={"X-API-Key": KEY}).json()  # fmt: skip
        assert [t["task_metadata"]["seed"] for t in many] == list(range(10))
        assert client.post("/rollout", json=_body(), headers={"X-API-Key": "nope"}).status_code == 400
    monkeypatch.delenv("ENVIRONMENT_API_KEY")
    with _client() as client:
        assert client.get("/health", headers={"X-API-Key": KEY}).status_code == 503


def test_multi_step_rollout_with_decision_rewards(env_key):
    oracle = Oracle(seed=3)
    with _client(oracle) as client:
        response = _post(client, _body(seed=3, env_config={"step_rewards": STEPWISE}))
    assert response.status_code == 200, response.text
    data = response.json()
    (trajectory,) = data["trajectories"]
    steps = trajectory["steps"]
    assert len(steps) == trajectory["length"] == len(oracle.requests) == 10
    assert (
        trajectory["inference_url"] == INFERENCE and data["pipeline_metadata"]["inference_url"] == INFERENCE
    )
    assert data["trace_correlation_id"] == CID
    unique_total = 0
    for turn, step in enumerate(steps, start=1):
        assert step["info"]["meta"]["inference_url"] == INFERENCE
        decision = step["info"]["meta"]["decision_rewards"]
        assert decision["turn"] == turn and decision["ach_delta"] == len(decision["all"])
        assert decision["unique_delta"] == len(decision["unique"]) == step["reward"]
        assert step["tool_calls"][0]["tool"] == "act" and step["tool_calls"][0]["args"]["actions"]
        assert step["info"]["stepwise"]["reward"] == (1.0 if decision["unique"] else 0.0)
        unique_total += decision["unique_delta"]
    assert any(s["info"]["meta"]["decision_rewards"]["ach_delta"] > s["info"]["meta"]["decision_rewards"]
               ["unique_delta"] for s in steps)  # fmt: skip
    # the oracle reaches deep into the chain in 10 turns of up to 4 actions
    assert sorted(oracle.world.seen) == data["metrics"]["details"]["achievements"]
    assert {"place_table", "make_wood_pickaxe", "collect_stone"} <= oracle.world.seen
    metrics = data["metrics"]
    assert metrics["episode_returns"] == [float(unique_total)] == [metrics["mean_return"]]
    assert metrics["num_steps"] == 10 and metrics["num_episodes"] == 1
    assert metrics["outcome_score"] == pytest.approx(unique_total / len(W.ACHIEVEMENTS))
    assert 0 < metrics["events_score"] <= 1
    assert metrics["details"]["stepwise"]["indicator_sum"] == sum(1 for s in steps if s["reward"] > 0)
    assert len(trajectory["decision_samples"]) == 10
    # the policy saw the whole conversation each turn, tools offered, sampling and cid forwarded
    first, last = oracle.requests[0], oracle.requests[-1]
    assert first["_query"] == {"cid": CID} and first["temperature"] == 0.7 and first["model"] == "m"
    assert first["tools"][0]["function"]["name"] == "act" and first["tool_choice"] == "auto"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert len(first["messages"][0]["content"]) < 300  # a line or two: the observation carries the rest
    start = W.make_world(3, "train")
    assert first["messages"][1]["content"].endswith(f"Legal actions: {', '.join(W.legal_actions(start))}.")
    assert all(m["content"].splitlines()[-1].startswith("Legal actions: move")
               for m in last["messages"] if m["role"] in ("user", "tool"))  # fmt: skip
    assert len(last["messages"]) == 2 + 2 * 9 and last["messages"][2]["role"] == "assistant"
    assert last["messages"][3]["role"] == "tool" and last["messages"][3]["tool_call_id"] == "call1"
    assert last["messages"][: len(first["messages"])] == first["messages"]
    assert data["trace"] is None


def test_step_rewards_off_means_no_decision_rewards_and_policy_block_wins(env_key):
    with _client(Oracle(seed=1)) as client:
        data = _post(client, _body(seed=1, turns=3)).json()
    steps = data["trajectories"][0]["steps"]
    assert len(steps) == 3 and all("decision_rewards" not in s["info"]["meta"] for s in steps)
    assert (
        data["trajectories"][0]["decision_samples"] is None and "stepwise" not in data["metrics"]["details"]
    )
    body = _body(seed=1, turns=3, env_config={"step_rewards": {**STEPWISE, "enabled": False}})
    body["policy"]["config"]["step_rewards"] = {**STEPWISE, "strategy": "per_achievement"}
    with _client(Oracle(seed=1)) as client:
        data = _post(client, body).json()
    assert data["metrics"]["details"]["stepwise"]["strategy"] == "per_achievement"


def test_text_replies_traces_and_episode_end(env_key):
    oracle = Oracle(seed=5, mode="text", max_steps=4)
    body = _body(seed=5, turns=8, env_config={"max_steps_per_episode": 4, "step_rewards": STEPWISE},
                 record={"trajectories": True, "return_trace": True, "trace_format": "full"})  # fmt: skip
    with _client(oracle) as client:
        data = _post(client, body).json()
    steps = data["trajectories"][0]["steps"]
    assert len(steps) == 4 and steps[-1]["done"] and steps[-1]["truncated"]  # max_steps_per_episode
    assert all(s["tool_calls"][0]["source"] == "text" for s in steps)
    assert [m["role"] for m in oracle.requests[1]["messages"]] == ["system", "user", "assistant", "user"]
    trace = data["trace"]
    assert trace["session_id"] == CID and len(trace["event_history"]) == 4
    assert trace["metadata"]["total_reward"] == data["metrics"]["mean_return"]
    assert trace["markov_blanket_message_history"][2]["content"].startswith("I pick")
    assert data["ops_executed"] == 8


def test_unusable_reply_is_an_invalid_noop(env_key):
    app = taskapp.create_app()

    async def handler(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": "zzz"}
        return httpx.Response(200, json={"choices": [{"message": message, "finish_reason": "length"}]})

    app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    with TestClient(app) as client:
        data = _post(client, _body(seed=2, turns=2)).json()
    steps = data["trajectories"][0]["steps"]
    assert [s["info"]["invalid_action"] for s in steps] == [True, True]
    assert steps[0]["tool_calls"] == [] and data["metrics"]["details"]["invalid_actions"] == 2
    assert steps[0]["info"]["finish_reason"] == "length" and data["metrics"]["mean_return"] == 0.0


def test_rejections(env_key):
    with _client(Oracle(seed=0)) as client:
        no_cid = _body()
        no_cid["policy"]["config"]["inference_url"] = "http://policy.test/v1"
        assert _post(client, no_cid).json()["detail"]["error"]["code"] == "missing_correlation_id"
        assert _post(client, _body(ops=["agent", "jump"])).status_code == 422
        assert _post(client, _body(ops=["env"])).json()["detail"]["error"]["code"] == "no_steps_executed"
        bad = _post(client, _body(env_config={"step_rewards": {"mode": "always"}}))
        assert bad.status_code == 422 and "step_rewards.mode" in bad.text
        assert _post(client, {"run_id": "x"}).status_code == 422

    async def down(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, text="overloaded")

    app = taskapp.create_app()
    app.state.http = httpx.AsyncClient(transport=httpx.MockTransport(down))
    with TestClient(app) as client:
        failed = _post(client, _body())
    assert failed.status_code == 502 and failed.json()["detail"]["error"]["upstream_status"] == 503


def test_eval_split_and_tools_off(env_key):
    seed = taskapp.EVAL_SEED_START + 7
    oracle = Oracle(seed=seed, split="eval")
    body = _body(seed=seed, turns=2, mode="eval")
    body["policy"]["config"]["use_tools"] = False
    body["policy"]["config"]["structured_outputs"] = {"choice": ["move", "noop"]}
    del body["policy"]["config"]["temperature"]
    with _client(oracle) as client:
        data = _post(client, body).json()
    assert data["metrics"]["details"]["split"] == "eval"
    assert "tools" not in oracle.requests[0] and oracle.requests[0]["temperature"] == 0.0
    assert oracle.requests[0]["structured_outputs"] == {"choice": ["move", "noop"]}  # forwarded as given
    assert re.match(r"craftworld::eval::\d+", data["trajectories"][0]["env_id"])
