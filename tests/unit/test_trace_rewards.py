"""Event rewards reported only through a v3 trace: trace_rewards turns synth's compact
`decision_rewards` and `event_rewards` rows into the same per-decision blocks as info.meta.decision_rewards,
so step_rewards.decision_rewards credits them exactly alike."""

from __future__ import annotations

from posttrain_trainer.step_rewards import StepRewardSettings, decision_meta, decision_rewards
from posttrain_trainer.trace_rewards import trace_blocks


def _settings(**kw) -> StepRewardSettings:
    return StepRewardSettings(**{"enabled": True, "strategy": "per_achievement", "indicator_lambda": 1.0, **kw})


def _steps(blocks):
    return {"trajectories": [{"steps": [{"info": {"meta": {"decision_rewards": b}} if b else {}} for b in blocks]}]}


META = [None, {"turn": 1, "ach_delta": 1, "unique_delta": 1, "all": ["collect_wood"], "unique": ["collect_wood"]},
        None, {"turn": 3, "ach_delta": 2, "unique_delta": 1, "all": ["collect_wood", "place_table"],
               "unique": ["place_table"]}]  # fmt: skip


def test_compact_decision_rewards_credit_as_info_meta_does():
    compact = {"trace": {"session_id": "s", "decision_rewards": [
        {"turn": 0, "ach_delta": 0, "unique_delta": 0, "achievements": [], "unique_achievements": []},
        {"turn": 1, "ach_delta": 1, "unique_delta": 1, "achievements": ["collect_wood"], "unique_achievements": ["collect_wood"]},
        {"turn": 3, "ach_delta": 2, "unique_delta": 1, "achievements": ["collect_wood", "place_table"],
         "unique_achievements": ["place_table"]}]}}  # fmt: skip
    for settings in (_settings(), _settings(strategy="consistent"), _settings(event_kind="absolute")):
        want = decision_rewards(decision_meta(_steps(META)), settings)
        got = decision_rewards(trace_blocks(compact, 4), settings)
        assert got == want, (settings, got, want)
    assert decision_rewards(trace_blocks(compact, 4), _settings()) == [0.0, 1.0, 0.0, 1.0]


def test_event_reward_rows_from_the_tracer_credit_alike():
    rows = [
        {"turn_number": 2, "reward_value": 1.0, "reward_type": "achievement_delta", "annotation": {"achievements": ["collect_wood"]}},
        {"turn_number": 2, "reward_value": 1.0, "reward_type": "unique_achievement_delta", "annotation": {"achievements": ["collect_wood"]}},
        {"turn_number": 4, "reward_value": 2.0, "reward_type": "achievement_delta", "annotation": {"achievements": ["collect_wood", "place_table"]}},
        {"turn_number": 4, "reward_value": 1.0, "reward_type": "unique_achievement_delta", "annotation": {"achievements": ["place_table"]}},
    ]  # fmt: skip
    full = {"trace": {"session_trace": {"session_id": "s", "event_rewards": rows}}}
    blocks = trace_blocks(full, 4)  # turns counted from 1: turn 4 is the 4th of 4 decisions
    assert [b and b["turn"] for b in blocks] == [None, 2, None, 4]
    for settings in (_settings(), _settings(strategy="consistent"), _settings(event_kind="absolute")):
        assert decision_rewards(blocks, settings) == decision_rewards(decision_meta(_steps(META)), settings)


def test_a_trace_without_rewards_gives_nothing_and_odd_rows_are_skipped():
    assert trace_blocks({"trace": None}, 3) == []
    assert trace_blocks({"trace": {"session_id": "s", "event_history": []}}, 3) == []
    odd = {"trace": {"event_rewards": [{"turn_number": "x", "reward_value": 1}, {"turn_number": 0, "reward_value": float("nan")},
                                       {"turn_number": 1, "reward_value": 3, "reward_type": "shaped", "key": "k"}]}}  # fmt: skip
    blocks = trace_blocks(odd, 2)
    assert blocks[0] == {"turn": 0, "ach_delta": 0, "unique_delta": 0, "all": [], "unique": []}
    assert blocks[1]["all"] == ["k", "k", "k"] and blocks[1]["unique_delta"] == 3
