"""DAPO (`[algorithm] variety = "dapo"`): its token-level loss worked out by hand, its overlong shaping, its
dynamic sampling, and the config that asks for it."""

from __future__ import annotations

import math

import pytest
import torch
from posttrain.api.convert import toml_to_cr
from posttrain.api.settings import DAPOSettings, settings_for
from posttrain_trainer.gspo import gspo_terms, overlong_shaping
from posttrain_trainer.rl import (
    ITERATION_EVENT_FIELDS,
    groups_with_signal,
    iteration_record,
    refill_groups,
    sample_with_signal,
    sequences_from_results,
)
from posttrain_trainer.rollouts import EpisodeSequence, RolloutResult, RolloutSpec


def test_dapo_token_level_loss_by_hand():
    # Two sequences: seq 0 has 2 policy tokens (A = +1), seq 1 has 3 (A = -1); eps_low 0.2, eps_high 0.28.
    # Per-token ratios r_t = exp(logp - old):
    #   seq 0: r = 1.5 -> clipped to 1.28, min(1.5, 1.28) = 1.28 (clipped);  r = 1.0 -> 1.0
    #   seq 1: r = 0.5 -> clip 0.8, min(-0.5, -0.8) = -0.8 (clipped);  r = 1.2 -> min(-1.2, -1.2) = -1.2;
    #          r = 1.0 -> -1.0
    # Token-level: every policy token of the batch weighs the same: J = (1.28 + 1.0 - 0.8 - 1.2 - 1.0) / 5
    # = -0.72 / 5 = -0.144, loss = -J = 0.144. (Averaging per sequence first, as GSPO-token does, would
    # give -((1.28 + 1.0) / 2 + (-0.8 - 1.2 - 1.0) / 3) / 2 = -0.07: the long response would weigh less.)
    # Gradients d loss / d logp_t = -A r_t / 5 where the unclipped branch is the min, else 0:
    #   seq 0: [0 (clipped), -1 * 1.0 / 5 = -0.2, 0 (masked)]; seq 1: [0 (clipped), 1.2 / 5 = 0.24, 1.0 / 5 = 0.2]
    old = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0]])
    log_r = torch.tensor([[math.log(1.5), 0.0, 0.0], [math.log(0.5), math.log(1.2), 0.0]])
    logp = (old + log_r).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    terms = gspo_terms(logp, old, torch.tensor([1.0, -1.0]), mask, 0.2, 0.28, variant="dapo")
    assert terms.loss.item() == pytest.approx(0.144, abs=1e-6)
    terms.loss.backward()
    assert logp.grad.flatten().tolist() == pytest.approx([0.0, -0.2, 0.0, 0.0, 0.24, 0.2], abs=1e-6)
    # diagnostics: the share of each sequence's tokens that were clipped
    assert terms.clipped.tolist() == pytest.approx([1 / 2, 1 / 3])
    # across micro-batches the normaliser is the mini-batch's token count: 10 tokens halve the loss
    half = gspo_terms(logp.detach(), old, torch.tensor([1.0, -1.0]), mask, 0.2, 0.28, variant="dapo", num_tokens=10)
    assert half.loss.item() == pytest.approx(0.072, abs=1e-6)


def test_overlong_shaping_ramps_over_the_last_tokens():
    # max_tokens 100, ramp 20: no penalty up to 80 tokens, then linear to the full penalty at 100
    assert overlong_shaping(80, 100, 20, -1.0) == 0.0
    assert overlong_shaping(90, 100, 20, -1.0) == pytest.approx(-0.5)
    assert overlong_shaping(100, 100, 20, -1.0) == pytest.approx(-1.0)
    assert overlong_shaping(120, 100, 20, -1.0) == pytest.approx(-1.0)
    assert overlong_shaping(95, 100, 20, -0.5) == pytest.approx(-0.375)  # 15/20 of -0.5


def _result(group: int, index: int, reward: float, tokens: int = 4, seed: int = 0) -> RolloutResult:
    spec = RolloutSpec(seed=seed or group, group=group, index=index, cid=f"c{group}-{index}-{seed}", endpoint="e")
    seq = EpisodeSequence([1, 2], list(range(10, 10 + tokens)), [1] * tokens, [0.0] * tokens)
    return RolloutResult(spec=spec, ok=True, env_return=reward, reward=reward, sequences=[seq])


def test_shaped_overlong_moves_the_advantage_of_the_longer_response():
    # equal task rewards; max_tokens 10, ramp 5: 10 tokens -> -1, 6 tokens -> 0 (6 <= 10 - 5 = 5? no: -0.2)
    results = [_result(0, 0, 1.0, tokens=10), _result(0, 1, 1.0, tokens=5)]
    seqs, stats = sequences_from_results(results, overlong="shaped", overlong_penalty=-1.0, max_tokens=10,
                                         overlong_ramp=5)  # fmt: skip
    advantages = {len(s.completion_ids): s.advantage for s in seqs}
    assert advantages[10] < 0 < advantages[5]  # shaped rewards 0 and 1: the cut-off response is pushed down
    assert [s.reward for s in seqs] == [1.0, 1.0]  # the reported reward stays the task's
    assert stats["mixed_groups"] == 1


def test_dynamic_sampling_keeps_groups_with_signal_and_refills_the_batch():
    rounds = {
        0: [(0, [1.0, 1.0]), (1, [0.0, 1.0]), (2, [0.0, 0.0])],  # only group 1 has signal
        1: [(0, [1.0, 0.0]), (1, [1.0, 1.0]), (2, [0.0, 1.0])],  # groups 0 and 2
        2: [(0, [0.0, 1.0]), (1, [0.0, 1.0]), (2, [0.0, 1.0])],  # not needed
    }
    asked = []

    def sample(k: int, groups: int) -> list[RolloutResult]:
        asked.append((k, groups))
        return [
            _result(g, i, r, seed=100 * k + g) for g, rewards in rounds[k][:groups] for i, r in enumerate(rewards)
        ]

    kept, everything, stats = sample_with_signal(sample, batch_size=3, max_rounds=3)
    # round 0 kept 1 of 3 groups: the 2 missing take 6 at that rate, capped at the batch (3)
    assert asked == [(0, 3), (1, 3)]
    assert stats == {"sampling_rounds": 2, "groups_sampled": 6, "groups_kept": 3}
    assert sorted({r.spec.group for r in kept}) == [1, 3, 5]  # round 1's groups renumbered past round 0's
    assert len(everything) == 12 and len(groups_with_signal(kept)) == 3
    # the rounds are bounded: a task with no signal anywhere stops after max_rounds
    flat = sample_with_signal(lambda k, n: [_result(0, i, 1.0, seed=k) for i in range(2)], 2, max_rounds=2)
    assert flat[0] == [] and flat[2]["sampling_rounds"] == 2


def test_a_refill_round_samples_only_what_the_signal_rate_says_is_missing():
    assert refill_groups(missing=1, kept=7, sampled=8, batch_size=8) == 2  # late in training: 2 groups, not 8
    assert refill_groups(missing=3, kept=5, sampled=8, batch_size=8) == 5
    assert refill_groups(missing=6, kept=2, sampled=8, batch_size=8) == 8  # capped at a batch
    assert refill_groups(missing=8, kept=0, sampled=8, batch_size=8) == 8  # no signal yet: a whole batch
    assert refill_groups(missing=1, kept=9, sampled=9, batch_size=8) == 1
    asked = []

    def sample(k: int, groups: int) -> list[RolloutResult]:
        asked.append(groups)
        if k == 0:  # 7 of 8 groups mixed
            return [_result(g, i, float(i == 0 or g == 7), seed=g) for g in range(8) for i in range(2)]
        return [_result(g, i, float(i), seed=100 + g) for g in range(groups) for i in range(2)]

    kept, everything, stats = sample_with_signal(sample, batch_size=8, max_rounds=3)
    assert asked == [8, 2] and stats == {"sampling_rounds": 2, "groups_sampled": 10, "groups_kept": 8}
    assert len(everything) == 20 and len({r.spec.group for r in kept}) == 8



def test_the_iteration_record_says_how_many_groups_dynamic_sampling_rolled_out():
    update = {"loss": 0.1, "optimizer_steps": 2, "policy_tokens": 10, "seconds": 1.0}
    stats = {"mean_return": 0.5, "mean_env_return": 0.5, "judge_scores": {}, "rollouts": 16, "failed": 0,
             "truncated": 0, "empty_responses": 0, "mixed_groups": 2, "train_sequences": 16,
             "rollout_seconds": 2.0}  # fmt: skip
    assert "groups_sampled" not in iteration_record(1, 3, update, stats, 1e-4, 3.0)  # no dynamic sampling
    sampled = {**stats, "sampling_rounds": 2, "groups_sampled": 10, "groups_kept": 8}
    record = iteration_record(1, 3, update, sampled, 1e-4, 3.0)
    assert (record["sampling_rounds"], record["groups_sampled"], record["groups_kept"]) == (2, 10, 8)
    assert {"sampling_rounds", "groups_sampled"} <= set(ITERATION_EVENT_FIELDS)  # and the event carries them

DAPO_TOML = """
[algorithm]
type = "online"
variety = "dapo"

[compute]
gpu_type = "H100"
gpu_count = 2

[compute.topology]
gpus_for_vllm = 1
gpus_for_training = 1

[model]
base = "Qwen/Qwen3-0.6B"
trainer_mode = "full"
label = "dapo"

[rollout]
env_name = "math"
policy_name = "math-single-step"
max_turns = 1
episodes_per_batch = 8
max_concurrent_rollouts = 8

[rollout.policy_config]
max_tokens = 256

[training]
num_epochs = 1
iterations_per_epoch = 2
max_turns = 1
batch_size = 4
group_size = 4
learning_rate = 1e-6
overlong_buffer = 64
max_sampling_rounds = 2
"""


def test_a_dapo_config_converts_and_resolves_to_dapo_settings():
    resource, warnings = toml_to_cr(DAPO_TOML, task_url="http://task:8000", env={})
    assert resource["spec"]["algorithm"] == {"type": "online", "method": "policy_gradient", "variety": "dapo"}
    assert not [w for w in warnings if "unknown" in w]  # overlong_buffer, max_sampling_rounds: DAPO's keys
    from posttrain.api.convert import spec_to_config
    from posttrain.api.resources import parse_spec

    settings = settings_for("rl", spec_to_config(parse_spec("RLJob", resource["spec"])))
    assert isinstance(settings, DAPOSettings) and settings.trainer == "rl"
    assert (settings.eps_low, settings.eps_high, settings.gspo_variant) == (0.2, 0.28, "dapo")
    assert (settings.overlong, settings.overlong_ramp, settings.max_response_tokens) == ("shaped", 64, 256)
    assert settings.dynamic_sampling and settings.max_sampling_rounds == 2


def test_dapo_needs_groups_like_gspo():
    from posttrain.errors import UserError

    with pytest.raises(UserError, match="group_size = 1"):
        toml_to_cr(DAPO_TOML.replace("group_size = 4", "group_size = 1"), task_url="http://task:8000", env={})


def test_mean_return_with_dynamic_sampling_is_the_policys_not_the_kept_groups():
    """The kept groups (mixed rewards) say nothing of the policy: early they drop the all-wrong groups, late
    the all-right; an iteration's mean_return is over every rollout sampled."""
    from types import SimpleNamespace

    from posttrain.api.settings import GSPOSettings
    from posttrain_trainer.rl import RLRun
    from posttrain_trainer.rollouts import ErrorBudget

    cfg = GSPOSettings.resolve({"training": {"batch_size": 1, "group_size": 2, "dynamic_sampling": True}})
    run = SimpleNamespace(cfg=cfg, budget=ErrorBudget(0.0), processor=None, synced_at={}, iteration=1, judge=None)
    kept = [_result(0, 0, 1.0), _result(0, 1, 0.0)]
    sampled = kept + [_result(1, i, 0.0, seed=7) for i in range(2)] + [_result(2, i, 0.0, seed=9) for i in range(2)]
    stats = RLRun.score(run, kept, 0.0, sampled)["stats"]
    assert stats["mean_return"] == pytest.approx(1 / 6)  # not the kept group's 0.5
    assert stats["train_sequences"] == 2 and stats["mixed_groups"] == 1
