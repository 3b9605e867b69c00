"""The multi-turn credit path, end to end in one process: the craftworld app's own episodes (its run_rollout,
a scripted policy behind httpx.MockTransport that records token captures the way the rollout server does,
with a toy chat template) -> the trainer's RolloutClient.collect (decision_rewards, build_sequences) ->
sequences_from_results (group advantage + per-decision credit) -> gspo_terms. Guards for the failure modes a
multi-step run that does not learn is suspected of: a sign error, the reward of step t on the tokens of turn
t + 1, environment tokens trained, a split episode credited differently from a merged one; and, on the real
world under a uniform policy, the expected per-state gradient of every action has the sign of its true
advantage."""

from __future__ import annotations

import asyncio
import importlib.util
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer import gspo, step_rewards
from posttrain_trainer.rl import sequences_from_results
from posttrain_trainer.rollouts import RolloutClient, plan_rollouts

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "taskapps" / "craftworld"
START, END = 1000, 1001
ROLES = {"system": 1002, "user": 1003, "assistant": 1004, "tool": 1005}
CONFIG = {
    "rollout": {
        "env_name": "craftworld",
        "max_turns": 3,
        "env_config": {"max_steps_per_episode": 3},
        "policy_config": {"temperature": 1.0, "tool_choice": "none", "use_tools": False},
    },
    "training": {
        "step_rewards_enabled": True,
        "step_rewards_mode": "decision_stepwise",
        "event_rewards_kind": "unique",
    },
}
# seed 0 starts in the forest; its ring goes on to the plains, then the lake
SCRIPTS = [
    ["collect_wood", "collect_sapling", "move"],  # 2 achievements, at decisions 0 and 1
    ["move", "move", "collect_drink"],  # 1, earned at the last decision after two moves to the lake
    ["collect_drink", "move", "collect_wood"],  # 0: nothing to drink in the forest, no wood in the plains
    ["collect_wood", "collect_wood", "collect_wood"],  # 1, at decision 0; the repeats earn nothing
]


def _load_app():
    spec = importlib.util.spec_from_file_location("craftworld_taskapp_credit", APP_DIR / "app.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["craftworld_taskapp_credit"] = module
    spec.loader.exec_module(module)
    return module


app = _load_app()


def _render(messages: list[dict[str, Any]]) -> list[int]:
    """A toy chat template: [START, role] + characters + [END] per message."""
    out: list[int] = []
    for m in messages:
        out += [START, ROLES[m["role"]], *(ord(c) for c in m.get("content") or ""), END]
    return out


class World:
    """The task app and a scripted policy server with token captures, behind one MockTransport each."""

    def __init__(self, scripts: list[list[str]], rewrite_history_at: int | None = None):
        self.scripts = scripts
        self.rewrite_history_at = rewrite_history_at  # this call's prompt drops the history: a new sequence
        self.captures: dict[str, list[dict[str, Any]]] = {}
        self.policy = httpx.AsyncClient(transport=httpx.MockTransport(self._chat))

    async def _chat(self, request: httpx.Request) -> httpx.Response:
        cid = request.url.params["cid"]
        body = json.loads(request.content)
        calls = self.captures.setdefault(cid, [])
        action = self.scripts[int(cid.rsplit("-r", 1)[1])][len(calls)]
        prompt = _render(body["messages"]) + [START, ROLES["assistant"]]
        if len(calls) == self.rewrite_history_at:
            prompt = [7, *prompt[-40:]]
        completion = [ord(c) for c in action] + [END]
        calls.append({"prompt_token_ids": prompt, "completion_token_ids": completion,
                      "logprobs": [-0.5] * len(completion), "finish_reason": "stop"})  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": action}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice]})

    async def route(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/rollout":
            data = await app.run_rollout(app.RolloutRequest(**json.loads(request.content)), self.policy)
            return httpx.Response(200, json=data)
        if request.method == "POST" and request.url.path == "/v1/captures":  # the trainer takes a batch
            cids = json.loads(request.content)["cids"]
            return httpx.Response(200, json={"captures": {c: self.captures.pop(c) for c in cids}, "refusals": {}})
        cid = request.url.path.rsplit("/", 1)[1]
        if request.method == "DELETE":
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(200, json=self.captures[cid])


def _episodes(scripts: list[list[str]], rewrite_history_at: int | None = None):
    world = World(scripts, rewrite_history_at)
    client = RolloutClient(task_url="http://task.test", settings=RolloutSettings.from_config(CONFIG), model="m", api_key="k",
                           transport=httpx.MockTransport(world.route))
    specs = plan_rollouts("run", 0, [0], len(scripts), ["http://policy.test"])

    async def go():
        return await client.collect(specs)

    results = asyncio.run(go())
    assert all(r.ok for r in results), [r.error for r in results]
    return results


def _trained(results):
    """(training sequence, the episode sequence it came from) in sequences_from_results' order."""
    seqs, _ = sequences_from_results(results)
    episode_seqs = [s for r in results for s in r.sequences]
    assert len(seqs) == len(episode_seqs)
    return list(zip(seqs, episode_seqs, strict=True))


def _per_call(pair) -> dict[int, set[float]]:
    """The advantages of each call's policy tokens (one value per call when the credit is per decision)."""
    seq, episode_seq = pair
    out: dict[int, set[float]] = {}
    for adv, call, m in zip(seq.token_advantages, episode_seq.call_index, seq.completion_mask, strict=True):
        if m:
            out.setdefault(call, set()).add(round(adv, 6))
    return out


def test_credit_lands_on_the_tokens_of_the_decision_that_earned_it():
    results = _episodes(SCRIPTS)
    assert [r.reward for r in results] == [2.0, 1.0, 0.0, 1.0]
    assert [r.decision_rewards for r in results] == [[1, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 0]]
    pairs = _trained(results)
    assert len(pairs) == 4  # every episode's three calls extend each other: one sequence each
    seqs = [seq for seq, _ in pairs]
    adv = []
    for (seq, episode_seq), script in zip(pairs, SCRIPTS, strict=True):
        per_call = _per_call((seq, episode_seq))
        assert sorted(per_call) == [0, 1, 2] and all(len(v) == 1 for v in per_call.values())
        adv.append([per_call[c].pop() for c in range(3)])
        # policy tokens are exactly the sampled action texts + end of turn; the observations between are
        # in the sequence with mask 0 (never trained)
        sampled = [t for t, m in zip(seq.completion_ids, seq.completion_mask, strict=True) if m]
        assert sampled == [t for a in script for t in [*(ord(c) for c in a), END]]
        glue = [t for t, m in zip(seq.completion_ids, seq.completion_mask, strict=True) if not m]
        calls = zip(episode_seq.call_index, seq.completion_mask, strict=True)
        assert ROLES["user"] in glue and all(c == -1 for c, m in calls if not m)
    best, late, none, once = adv
    # the reward of decision t is on decision t's tokens (return-to-go: and on the decisions before it)
    assert once[0] > max(once[1], once[2])  # off by one would credit the idle repeat at t = 1
    assert best[0] > best[1] > best[2]
    # the drink's decision gains most; the moves that led to the lake are not blamed for the idle turns
    assert late[2] > late[1] > late[0] == 0
    assert all(a < 0 for a in none) and max(none) < min(once[0], best[2], late[0])
    # the sign reaches the gradient: at ratio 1, -dloss/dlogp of every policy token has its advantage's sign
    batch = gspo.collate_sequences([s.prompt_ids for s in seqs], [s.completion_ids for s in seqs],
                                   [s.completion_mask for s in seqs], 0)  # fmt: skip
    logp = torch.full(batch.loss_mask.shape, -1.0, requires_grad=True)
    token_adv = batch.completion_values([s.token_advantages for s in seqs])
    loss = gspo.gspo_terms(logp, logp.detach(), token_adv, batch.loss_mask, variant="token").loss
    (grad,) = torch.autograd.grad(loss, logp)
    on = batch.loss_mask.bool()
    assert torch.equal(torch.sign(-grad[on]), torch.sign(token_adv[on]))
    assert torch.all(grad[~on] == 0)


def test_a_split_episode_gets_the_credit_of_a_merged_one():
    merged = _trained(_episodes(SCRIPTS))
    split = _trained(_episodes(SCRIPTS, rewrite_history_at=2))
    assert len(split) == 8  # each episode: calls 0-1, then call 2 from its own (rewritten) prompt
    for k in range(4):
        whole = _per_call(merged[k])
        parts = {**_per_call(split[2 * k]), **_per_call(split[2 * k + 1])}
        assert parts == whole
        assert split[2 * k + 1][1].call_index == [2] * len(SCRIPTS[k][2] + "x")  # the action + end of turn


ACTIONS = ("move", "collect_wood", "collect_sapling", "collect_drink")


@pytest.mark.parametrize("seed", [0, 1, 2, 14, 8, 7])  # starts: forest, plains, lake, mine, cave, quarry
def test_expected_first_decision_gradient_has_the_sign_of_the_true_advantage(seed):
    """Every 3-decision episode of the four actions (a uniform policy, exactly) as one group: summed over the
    episodes, the first decision's token advantage times d log pi / d logit (tabular softmax) is the expected
    policy gradient; each action's must have the sign of its true advantage Q(s0, a) - V(s0)."""
    W = app.W
    settings = step_rewards.StepRewardSettings(enabled=True, mode="decision_stepwise")
    episodes = list(itertools.product(ACTIONS, repeat=3))
    returns, per_decision = [], []
    for script in episodes:
        world = W.make_world(seed, "train", {"max_steps_per_episode": 3})
        blocks = []
        for action in script:
            out = W.step(world, [action])
            blocks.append({"ach_delta": len(out["all"]), "unique_delta": len(out["unique"]),
                           "all": out["all"], "unique": out["unique"]})  # fmt: skip
        returns.append(float(len(world.seen)))
        per_decision.append(step_rewards.decision_rewards(blocks, settings))
    advantages = gspo.ragged_group_advantages(returns, [0] * len(episodes))
    credits = step_rewards.group_decision_credit([step_rewards.returns_to_go(d) for d in per_decision])
    summed = {a: 0.0 for a in ACTIONS}
    q = {a: 0.0 for a in ACTIONS}
    for script, ret, adv, credit in zip(episodes, returns, advantages, credits, strict=True):
        summed[script[0]] += step_rewards.token_advantages(adv, credit, [0])[0]
        q[script[0]] += ret / 16
    baseline = sum(summed.values()) / len(ACTIONS)  # d log pi(a) / d logit_b = 1[a = b] - 1/4
    gradient = {a: summed[a] - baseline for a in ACTIONS}
    true_advantage = {a: q[a] - sum(q.values()) / len(ACTIONS) for a in ACTIONS}
    assert any(abs(v) > 0.01 for v in true_advantage.values())  # a start from which something is reachable
    for a in ACTIONS:
        if abs(true_advantage[a]) > 1e-9:
            assert (gradient[a] > 0) == (true_advantage[a] > 0), (W.make_world(seed, "train").area, a,
                                                                  gradient, true_advantage)  # fmt: skip
