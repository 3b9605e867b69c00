"""Step and event rewards in the trainer (pure parts): the settings from the TOML, the step_rewards block in
the rollout request, decision rewards (unique/absolute, consistent/per_achievement), group credit, per-token
advantages on the tokens each decision sampled, and GSPO-token with per-token advantages."""

from __future__ import annotations

import pytest
import torch
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer import gspo
from posttrain_trainer.rl import sequences_from_results
from posttrain_trainer.rollouts import (
    EpisodeSequence,
    RolloutResult,
    RolloutSpec,
    build_rollout_request,
    build_sequences,
)
from posttrain_trainer.step_rewards import (
    StepRewardSettings,
    decision_meta,
    decision_rewards,
    group_decision_credit,
    returns_to_go,
    token_advantages,
)

SHAPED = {  # synth's crafter_rl_stepwise_shaped.toml [training] step-reward keys
    "step_rewards_enabled": True,
    "step_rewards_mode": "decision_stepwise",
    "step_rewards_indicator_lambda": 0.5,
    "step_rewards_beta": 0.0,
    "event_rewards_kind": "unique",
    "step_rewards_strategy": "per_achievement",
    "step_rewards_weights": {"collect_wood": 0.8, "collect_stone": 1.0},
    "step_rewards_k_limits": {"collect_wood": 4, "collect_stone": 3},
}
ROLLOUT = {"env_name": "craftworld", "policy_name": "p", "max_turns": 3, "env_config": {"max_steps": 3}}


def _request(training: dict, env_config: dict | None = None) -> dict:
    rollout = {**ROLLOUT, **({"env_config": env_config} if env_config is not None else {})}
    config = {"rollout": rollout, "training": training}
    return build_rollout_request(settings=RolloutSettings.from_config(config), model="m", run_id="r", seed=1, url="http://p/v1?cid=r")


def test_request_carries_the_step_rewards_block():
    body = _request(SHAPED)
    block = body["env"]["config"]["step_rewards"]
    assert block == {
        "enabled": True, "mode": "decision_stepwise", "strategy": "per_achievement", "indicator_lambda": 0.5,
        "step_beta": 0.0, "event_rewards_kind": "unique",
        "weights": {"collect_wood": 0.8, "collect_stone": 1.0}, "k_limits": {"collect_wood": 4, "collect_stone": 3},
    }  # fmt: skip
    assert body["env"]["config"]["max_steps"] == 3 and body["ops"] == ["agent", "env"] * 3
    # every key changes the request
    for key, value in [("step_rewards_indicator_lambda", 2.0), ("step_rewards_beta", 0.3),
                       ("step_rewards_strategy", "consistent"), ("event_rewards_kind", "absolute"),
                       ("step_rewards_mode", "env_sparse"), ("step_rewards_enabled", False),
                       ("step_rewards_weights", {"x": 1.0}), ("step_rewards_k_limits", {"x": 2})]:  # fmt: skip
        assert _request({**SHAPED, key: value})["env"]["config"]["step_rewards"] != block, key
    # not configured: nothing sent; the nested [training.rewards] form wins over the flat one
    assert "step_rewards" not in _request({})["env"]["config"]
    nested = _request({**SHAPED, "rewards": {"step_rewards_indicator_lambda": 3.0}})
    assert nested["env"]["config"]["step_rewards"]["indicator_lambda"] == 3.0
    # the TOML's own [rollout.env_config.step_rewards] keys win
    own = _request(SHAPED, {"step_rewards": {"indicator_lambda": 9.0}})
    assert own["env"]["config"]["step_rewards"]["indicator_lambda"] == 9.0
    assert own["env"]["config"]["step_rewards"]["strategy"] == "per_achievement"


def test_settings_are_checked():
    with pytest.raises(ValueError, match="step_rewards_strategy"):
        StepRewardSettings.from_config({"training": {"step_rewards_strategy": "greedy"}})
    with pytest.raises(ValueError, match="event_rewards_kind"):
        StepRewardSettings.from_config({"training": {"event_rewards_kind": "some"}})
    assert StepRewardSettings.from_config({"training": {"step_rewards_enabled": True}}).active
    off = {"step_rewards_enabled": True, "step_rewards_mode": "off"}
    assert not StepRewardSettings.from_config({"training": off}).active


BLOCKS = [
    {"turn": 1, "ach_delta": 2, "unique_delta": 1, "all": ["collect_wood", "collect_wood"], "unique": ["collect_wood"]},
    {"turn": 2, "ach_delta": 1, "unique_delta": 0, "all": ["collect_wood"], "unique": []},
    None,
    {"turn": 4, "ach_delta": 1, "unique_delta": 1, "all": ["collect_stone"], "unique": ["collect_stone"]},
]  # fmt: skip


def _settings(**over) -> StepRewardSettings:
    training = {"step_rewards_enabled": True, "step_rewards_mode": "decision_stepwise", **over}
    return StepRewardSettings.from_config({"training": training})


def test_decision_rewards_unique_absolute_and_strategies():
    assert decision_rewards(BLOCKS, _settings()) == [1.0, 0.0, 0.0, 1.0]
    assert decision_rewards(BLOCKS, _settings(event_rewards_kind="absolute")) == [1.0, 1.0, 0.0, 1.0]
    assert decision_rewards(BLOCKS, _settings(step_rewards_indicator_lambda=0.5)) == [0.5, 0.0, 0.0, 0.5]
    weighted = _settings(**{k: v for k, v in SHAPED.items() if k != "event_rewards_kind"},
                         event_rewards_kind="absolute")  # fmt: skip
    # absolute: wood twice then once more (k = 4), 0.8 each, times lambda 0.5; stone 1.0 * 0.5
    assert decision_rewards(BLOCKS, weighted) == pytest.approx([0.8, 0.4, 0.0, 0.5])
    capped = _settings(step_rewards_strategy="per_achievement", event_rewards_kind="absolute")
    assert decision_rewards(BLOCKS, capped) == [1.0, 0.0, 0.0, 1.0]  # k defaults to 1 per achievement


def test_decision_meta_reads_each_step():
    response = {"trajectories": [{"steps": [{"info": {"meta": {"decision_rewards": b}}} if b else {"info": {}}
                                            for b in BLOCKS]}]}  # fmt: skip
    assert decision_meta(response) == BLOCKS
    assert decision_meta({}) == [] and decision_meta({"trajectories": [{"steps": [{"info": None}]}]}) == [
        None
    ]


def test_credit_returns_to_go_and_tokens():
    assert returns_to_go([1.0, 0.0, 2.0]) == [3.0, 2.0, 2.0]
    credit = group_decision_credit([[3.0, 2.0, 2.0], [0.0, 0.0]])
    # each turn against the same turn of the other rollout; the third turn only one rollout reached
    assert credit[0][0] == pytest.approx(1.0) and credit[1][0] == pytest.approx(-1.0)
    assert credit[0][1] == pytest.approx(1.0) and credit[1][1] == pytest.approx(-1.0)
    assert credit[0][2] == 0.0
    assert group_decision_credit([[1.0, 1.0], [1.0]]) == [[0.0, 0.0], [0.0]]


def test_rollouts_that_all_did_the_same_get_no_credit():
    # a first decision's return-to-go holds the whole episode, a last one's almost nothing: pooled over turns
    # that would credit every first decision and blame every last, although no rollout did better than another
    assert group_decision_credit([[2.0, 1.0, 0.0]] * 4) == [[0.0, 0.0, 0.0]] * 4
    credit = group_decision_credit([[2.0, 1.0, 0.0], [2.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert credit[0][2] < 0 < credit[1][2] and credit[0][0] == credit[1][0] > 0 > credit[2][0]
    assert token_advantages(0.5, [1.0, -1.0], [0, 0, -1, 1, 2]) == [1.5, 1.5, 0.5, -0.5, 0.5]


def test_captured_tokens_know_their_decision():
    caps = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]},
        {"prompt_token_ids": [1, 2, 3, 4, 90, 91], "completion_token_ids": [5]},
        {"prompt_token_ids": [7], "completion_token_ids": [8]},  # history rewritten: a new sequence
    ]
    first, second = build_sequences(caps)
    assert first.completion_mask == [1, 1, 0, 0, 1] and first.call_index == [0, 0, -1, -1, 1]
    assert second.call_index == [2]


def _result(
    group: int, index: int, reward: float, decisions: list[float], seq: EpisodeSequence
) -> RolloutResult:
    spec = RolloutSpec(seed=group, group=group, index=index, cid=f"c{group}-{index}", endpoint="http://p")
    return RolloutResult(spec=spec, ok=True, reward=reward, sequences=[seq], finish_reasons=["stop"],
                         turns=len(decisions), decision_rewards=decisions)  # fmt: skip


def test_sequences_get_per_decision_credit():
    seq = EpisodeSequence([1], [3, 4, 90, 5], [1, 1, 0, 1], call_index=[0, 0, -1, 1])
    # same episode return (advantage 0); return-to-go: good [1, 0], late [1, 1] -> the late unlock's decision
    # gains credit over good's idle second decision; both first decisions have the same return-to-go: none
    good = _result(0, 0, 1.0, [1.0, 0.0], seq)
    late = _result(0, 1, 1.0, [0.0, 1.0], seq)
    seqs, stats = sequences_from_results([good, late])
    assert len(seqs) == 2 and all(s.advantage == 0.0 for s in seqs)
    g, lt = seqs[0].token_advantages, seqs[1].token_advantages
    assert g[0] == g[1] == lt[0] == lt[1] == 0.0 and lt[3] > 0 > g[3] and g[2] == 0.0
    assert (
        stats["mean_turns"] == 2
        and stats["decision_rewards_nonzero"] == 2
        and stats["decision_reward_sum"] == 2
    )
    # step rewards off: no credit, uniform group skipped as before
    plain = [_result(0, i, 1.0, [], seq) for i in range(2)]
    assert sequences_from_results(plain)[0] == []


def test_gspo_token_accepts_per_token_advantages():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, requires_grad=True)
    old = logits.detach().clone()
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0, 0.0]])
    seq_adv = torch.tensor([1.0, -1.0])
    uniform = seq_adv.unsqueeze(-1).expand(2, 5).clone()
    a = gspo.gspo_terms(logits, old, seq_adv, mask, variant="token").loss
    b = gspo.gspo_terms(logits, old, uniform, mask, variant="token").loss
    assert torch.allclose(a, b)
    (grad_a,) = torch.autograd.grad(a, logits)
    varied = uniform.clone()
    varied[0, 0] = 3.0
    (grad_v,) = torch.autograd.grad(gspo.gspo_terms(logits, old, varied, mask, variant="token").loss, logits)
    assert not torch.allclose(grad_a[0, 0], grad_v[0, 0]) and torch.allclose(grad_a[1], grad_v[1])
    with pytest.raises(ValueError, match="GSPO-token"):
        gspo.gspo_terms(logits, old, uniform, mask, variant="sequence")


def test_validate_rejects_an_unknown_strategy_naming_the_field():
    from pathlib import Path

    from posttrain.api.convert import load
    from posttrain.errors import UserError

    base = (Path(__file__).resolve().parents[2] / "examples" / "craftworld_rl_stepwise.toml").read_text()
    load(base, file="cw.toml")
    with pytest.raises(UserError) as err:
        load(
            base.replace('step_rewards_strategy = "per_achievement"', 'step_rewards_strategy = "greedy"'),
            file="cw.toml",
        )
    assert "cw.toml:54: training.step_rewards_strategy" in str(err.value)
