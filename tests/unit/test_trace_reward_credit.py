"""A task app that reports its event rewards only through its v3 trace: the craftworld
app's answers with every step's info.meta.decision_rewards moved into the trace as synth's tracer rows
(event_rewards: achievement_delta / unique_achievement_delta per turn), returned only when the trainer asks
with record.return_trace. The trainer (RolloutClient.collect) must ask for it when step rewards are on and
credit each decision exactly as it does from info.meta."""

from __future__ import annotations

import asyncio
import json

import httpx
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer.rollouts import RolloutClient, plan_rollouts

from tests.unit.test_multiturn_credit import CONFIG, SCRIPTS, World, _episodes


class TraceOnlyWorld(World):
    asked: list[dict] = []

    async def route(self, request: httpx.Request) -> httpx.Response:
        response = await super().route(request)
        if request.url.path != "/rollout":
            return response
        body, data = json.loads(request.content), response.json()
        type(self).asked.append(body["record"])
        rows = []
        for step in data["trajectories"][0]["steps"]:
            block = (step.get("info") or {}).get("meta", {}).pop("decision_rewards", None)
            if block:
                turn = int(block["turn"])
                rows.append({"turn_number": turn, "reward_value": block["ach_delta"], "reward_type": "achievement_delta",
                             "annotation": {"achievements": block.get("all") or []}})  # fmt: skip
                rows.append({"turn_number": turn, "reward_value": block["unique_delta"],
                             "reward_type": "unique_achievement_delta", "annotation": {"achievements": block.get("unique") or []}})  # fmt: skip
        trace = {"session_id": body["run_id"], "event_rewards": rows}
        data["trace"] = trace if body["record"].get("return_trace") else None
        return httpx.Response(200, json=data)


def test_rewards_reported_only_in_the_trace_get_the_same_credit():
    direct = [r.decision_rewards for r in _episodes(SCRIPTS)]
    assert direct == [[1, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]]
    world = TraceOnlyWorld(SCRIPTS)
    TraceOnlyWorld.asked = []
    client = RolloutClient(task_url="http://task.test", settings=RolloutSettings.from_config(CONFIG), model="m", api_key="k",
                           transport=httpx.MockTransport(world.route))
    specs = plan_rollouts("run", 0, [0], len(SCRIPTS), ["http://policy.test"])

    async def go():
        return await client.collect(specs)

    results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results]
    assert all(record["return_trace"] is True for record in TraceOnlyWorld.asked), TraceOnlyWorld.asked
    assert [r.decision_rewards for r in results] == direct
