"""Pure parts of the RL rollout client: cid format, request shape, mask building, reward weights, budget."""

from __future__ import annotations

import pytest
from posttrain.api.rollout_settings import RolloutSettings
from posttrain_trainer.rollouts import (
    ErrorBudget,
    RolloutBudgetExceeded,
    build_rollout_request,
    build_sequences,
    episode_return,
    inference_url,
    make_cid,
    plan_rollouts,
    run_tag,
)

CONFIG = {
    "rollout": {
        "env_name": "math",
        "policy_name": "math-single-step",
        "max_turns": 2,
        "max_concurrent_rollouts": 16,
        "env_config": {"difficulty": "medium"},
        "policy_config": {"temperature": 1.0, "max_tokens": 48},
    },
    "training": {"async_semaphore_max": 4, "max_turns": 2},
}


def test_cid_and_inference_url():
    run = run_tag("demo-rl", "1234abcd-5678-90ef-0000-000000000000")
    assert run == "demo-rl-1234abcd"
    cid = make_cid(run, 3, 17, 5)
    assert cid == "trace_demo-rl-1234abcd-it3-s17-r5"  # synth's apps require the trace_ prefix
    assert make_cid("a b/c", 0, 1, 0, kind="ev") == "trace_a-b-c-ev0-s1-r0"
    assert inference_url("http://127.0.0.1:9000/", cid) == (
        "http://127.0.0.1:9000/v1/chat/completions?cid=trace_demo-rl-1234abcd-it3-s17-r5"
    )


def test_plan_rollouts_groups_and_round_robin():
    specs = plan_rollouts("r", 2, [10, 11], 3, ["http://a", "http://b"])
    assert [(s.seed, s.group, s.index) for s in specs] == [
        (10, 0, 0), (10, 0, 1), (10, 0, 2), (11, 1, 0), (11, 1, 1), (11, 1, 2)
    ]  # fmt: skip
    assert [s.endpoint for s in specs] == ["http://a", "http://b"] * 3
    assert specs[4].cid == "trace_r-it2-s11-r1"
    with pytest.raises(ValueError):
        plan_rollouts("r", 0, [1], 2, [])


def test_request_shape_follows_synth():
    body = build_rollout_request(
        settings=RolloutSettings.from_config(CONFIG),
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        run_id="x-it0-s7-r0",
        seed=7,
        url="U?cid=x",
    )
    assert body["mode"] == "rl"
    assert body["env"] == {"env_name": "math", "seed": 7, "config": {"difficulty": "medium"}}
    cfg = body["policy"]["config"]
    assert cfg["inference_url"] == "U?cid=x"
    assert cfg["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert cfg["temperature"] == 1.0 and cfg["max_tokens"] == 48 and cfg["max_turns"] == 2
    assert body["policy"]["policy_name"] == "math-single-step"
    assert body["ops"] == ["agent", "env", "agent", "env"]
    assert body["record"]["trajectories"] is True
    ev = build_rollout_request(
        settings=RolloutSettings.from_config(CONFIG),
        model="m",
        run_id="e",
        seed=1,
        url="U",
        mode="eval",
        policy_overrides={"temperature": 0.0},
    )
    assert ev["mode"] == "eval" and ev["policy"]["config"]["temperature"] == 0.0


def test_semaphore_is_the_smaller_cap():
    assert RolloutSettings.from_config(CONFIG).concurrency == 4
    assert RolloutSettings.from_config({"rollout": {"max_concurrent_rollouts": 3}}).concurrency == 3
    assert RolloutSettings.from_config({}).concurrency == 8


def test_single_turn_sequence():
    caps = [{"prompt_token_ids": [1, 2, 3], "completion_token_ids": [7, 8], "logprobs": [-0.5, -0.25]}]
    (seq,) = build_sequences(caps)
    assert seq.prompt_ids == [1, 2, 3]
    assert seq.completion_ids == [7, 8]
    assert seq.completion_mask == [1, 1]
    assert seq.sampling_logprobs == [-0.5, -0.25]


def test_multi_turn_masks_env_tokens():
    caps = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "logprobs": [-1.0, -1.0]},
        # second prompt = first prompt + completion + env/tool tokens [90, 91]
        {
            "prompt_token_ids": [1, 2, 3, 4, 90, 91],
            "completion_token_ids": [5],
            "logprobs": [{"logprob": -2.0}],
        },
    ]
    (seq,) = build_sequences(caps)
    assert seq.prompt_ids == [1, 2]
    assert seq.completion_ids == [3, 4, 90, 91, 5]
    assert seq.completion_mask == [1, 1, 0, 0, 1]
    assert seq.sampling_logprobs == [-1.0, -1.0, 0.0, 0.0, -2.0]
    assert seq.policy_tokens == 3


def test_multi_turn_history_rewritten_starts_new_sequence():
    caps = [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]},
        {"prompt_token_ids": [1, 2, 9, 5], "completion_token_ids": [6]},  # history does not match
        {"prompt_token_ids": [], "completion_token_ids": [6]},  # ignored: no prompt
        {"prompt_token_ids": [1], "completion_token_ids": []},  # no policy token: dropped
    ]
    seqs = build_sequences(caps)
    assert [(s.prompt_ids, s.completion_ids, s.completion_mask) for s in seqs] == [
        ([1, 2], [3, 4], [1, 1]),
        ([1, 2, 9, 5], [6], [1]),
    ]
    assert seqs[0].sampling_logprobs == [0.0, 0.0]  # absent logprobs -> zeros (diagnostics only)


def test_episode_return_fallbacks():
    assert episode_return({"metrics": {"episode_returns": [0.5], "mean_return": 9}}) == 0.5
    assert episode_return({"metrics": {"mean_return": 0.25}}) == 0.25
    steps = {"trajectories": [{"steps": [{"reward": 1.0}, {"reward": 0.5}, {"reward": None}]}]}
    assert episode_return(steps) == 1.5


def test_error_budget():
    budget = ErrorBudget(0.25)
    assert budget.allowed(16) == 4
    budget.check(16, ["e"] * 4)
    with pytest.raises(RolloutBudgetExceeded, match="5 of 16 rollouts failed"):
        budget.check(16, ["HTTP 502"] * 5)
    with pytest.raises(RolloutBudgetExceeded):
        ErrorBudget(1.0).check(2, ["a", "b"])  # nothing succeeded
    ErrorBudget(0.0).check(8, [])
    with pytest.raises(RolloutBudgetExceeded):
        ErrorBudget(0.0).check(8, ["x"])
    assert ErrorBudget.from_settings(RolloutSettings.from_config({"rollout": {"error_budget": 0.5}})).fraction == 0.5
    with pytest.raises(ValueError):
        ErrorBudget(1.5)


# -- truncation, empty responses, retention (pure parts) ----------------------------------------------


def _result(group: int, index: int, reward: float, finish: str | None, tokens: list[int]):
    from posttrain_trainer.rollouts import EpisodeSequence, RolloutResult, RolloutSpec

    spec = RolloutSpec(seed=group, group=group, index=index, cid=f"c{group}-{index}", endpoint="http://p")
    seqs = [EpisodeSequence([1, 2], list(tokens), [1] * len(tokens))] if tokens else []
    return RolloutResult(spec=spec, ok=True, reward=reward, sequences=seqs, finish_reasons=[finish])


def test_finish_reason_marks_truncated_and_empty():
    cut = _result(0, 0, 0.0, "length", [5, 6])
    done = _result(0, 1, 1.0, "stop", [7])
    empty = _result(0, 2, 0.0, "stop", [])
    assert (cut.truncated, done.truncated, empty.truncated) == (True, False, False)
    assert (cut.empty, done.empty, empty.empty) == (False, False, True)


def test_overlong_treatments_and_empty_response_in_group():
    import math

    from posttrain_trainer import gspo
    from posttrain_trainer.rl import sequences_from_results

    results = [
        _result(0, 0, 1.0, "stop", [7]),  # right
        _result(0, 1, 0.0, "length", [5, 6, 5]),  # cut at max_tokens
        _result(0, 2, 0.0, "stop", []),  # empty response: scored 0, stays in the group
    ]
    three = gspo.ragged_group_advantages([1.0, 0.0, 0.0], [0, 0, 0])
    assert not math.isclose(three[0], gspo.ragged_group_advantages([1.0, 0.0], [0, 0])[0])

    keep, stats = sequences_from_results(results, overlong="keep")
    assert [(s.completion_ids, round(s.advantage, 6)) for s in keep] == [
        ([7], round(three[0], 6)),
        ([5, 6, 5], round(three[1], 6)),
    ]
    assert stats["truncated"] == 1 and stats["empty_responses"] == 1 and stats["failed"] == 0

    masked, stats = sequences_from_results(results, overlong="mask")
    assert [(s.completion_ids, round(s.advantage, 6)) for s in masked] == [([7], round(three[0], 6))]
    assert stats["truncated"] == 1 and stats["train_sequences"] == 1

    penalised, _ = sequences_from_results(results, overlong="penalty", overlong_penalty=-0.5)
    shaped = gspo.ragged_group_advantages([1.0, -0.5, 0.0], [0, 0, 0])
    assert [round(s.advantage, 6) for s in penalised] == [round(shaped[0], 6), round(shaped[1], 6)]
    assert penalised[1].advantage < keep[1].advantage  # the cut response is pushed down further
    assert penalised[1].reward == 0.0  # the reported reward stays the task's


def test_overlong_config_is_checked():
    from posttrain_trainer.rl_config import parse_rl_config
    from pydantic import ValidationError

    assert parse_rl_config({}).overlong == "keep"
    cfg = parse_rl_config({"training": {"overlong": "penalty", "overlong_penalty": -0.25}})
    assert (cfg.overlong, cfg.overlong_penalty) == ("penalty", -0.25)
    with pytest.raises(ValidationError, match="overlong"):
        parse_rl_config({"training": {"overlong": "chop"}})
    with pytest.raises(ValidationError, match="overlong_penalty"):
        parse_rl_config({"training": {"overlong_penalty": 1.0}})


def test_checkpoint_retention_rule():
    from posttrain.api.settings import settings_for
    from posttrain_trainer.checkpoint import checkpoints_to_delete

    assert checkpoints_to_delete([2, 4, 6, 8], [2, 4, 6, 8], keep=2) == [2, 4]
    # incomplete ones (a job died while saving) go when older than the newest complete one
    assert checkpoints_to_delete([2, 4], [2, 3, 4, 5], keep=1) == [2, 3]
    assert checkpoints_to_delete([2, 4], [2, 4], keep=0) == []  # 0 keeps every checkpoint
    assert checkpoints_to_delete([], [3], keep=1) == []
    assert settings_for("rl", {}).keep_checkpoints == 3
    assert settings_for("sft", {"training": {"keep_checkpoints": 5}}).keep_checkpoints == 5


def test_weight_version_retention_rule():
    from posttrain.api.settings import settings_for
    from posttrain_trainer.weightsync import versions_to_delete

    assert versions_to_delete([1, 2, 3, 4], keep=2, served=4) == [1, 2]
    assert versions_to_delete([1, 2, 3, 4], keep=1, served=2) == [1, 3]  # never the served version
    assert versions_to_delete([1, 2, 3], keep=0, served=3) == []
    assert settings_for("rl", {}).keep_weight_versions == 2
    assert settings_for("rl", {"training": {"keep_weight_versions": 1}}).keep_weight_versions == 1
