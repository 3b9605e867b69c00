"""GSPO-token, truncated importance sampling (TIS) from the sampler's logprobs, the mismatch metric and the
staleness check, against hand computations."""

from __future__ import annotations

import math

import pytest
import torch
from posttrain_trainer.gspo import (
    collate_sequences,
    gspo_terms,
    sampler_mismatch,
    truncated_importance_weights,
)
from posttrain_trainer.offpolicy import MismatchMeter, behaviour_logprobs, staleness
from posttrain_trainer.rl_config import parse_rl_config
from pydantic import ValidationError

WIDE = {"eps_low": 1.0, "eps_high": 1.0}  # no clipping: the hand computations below are the raw objective


def _one_sequence():
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = torch.tensor([[-1.2, -2.0]])  # mean log ratio 0.1: s = e^0.1
    behaviour = torch.tensor([[-1.2 - math.log(3.0), -2.0 + math.log(2.0)]])  # token ratios 3 and 1/2
    return lp, old, behaviour, torch.tensor([1.0]), torch.ones(1, 2)


def test_gspo_token_equals_gspo_without_token_weights():
    """With one advantage per sequence, GSPO-token has GSPO's value and gradient (the paper, section 4.3):
    d/d lp_t of s A = s A / |y| either way."""
    s = math.exp(0.1)
    grads = {}
    for variant in ("sequence", "token"):
        lp, old, _, adv, mask = _one_sequence()
        terms = gspo_terms(lp, old, adv, mask, **WIDE, variant=variant)
        assert terms.loss.item() == pytest.approx(-s, rel=1e-6)
        terms.loss.backward()
        grads[variant] = lp.grad.clone()
    assert grads["token"].flatten().tolist() == pytest.approx([-s / 2, -s / 2], rel=1e-6)
    assert torch.allclose(grads["token"], grads["sequence"])


def test_tis_weights_per_token_and_per_sequence_by_hand():
    """Token ratios old/behaviour are 3 and 1/2; cap 2: token weights [2, 0.5]. The sequence weight is the
    geometric mean sqrt(3 * 1/2) = sqrt(1.5), under the cap."""
    _, old, behaviour, _, mask = _one_sequence()
    tok = truncated_importance_weights(old, behaviour, mask, 2.0, per_token=True)
    assert tok.flatten().tolist() == pytest.approx([2.0, 0.5], rel=1e-6)
    seq = truncated_importance_weights(old, behaviour, mask, 2.0)
    assert seq.tolist() == pytest.approx([math.sqrt(1.5)], rel=1e-6)
    assert truncated_importance_weights(old, behaviour, mask, 1.1).tolist() == pytest.approx([1.1])


def test_gspo_token_with_tis_by_hand():
    """token: J = 1/2 (s w1 + s w2) A, dJ/dlp_1 = s w1 A / 2; sequence: J = s w A, dJ/dlp_t = s w A / 2."""
    s = math.exp(0.1)
    lp, old, behaviour, adv, mask = _one_sequence()
    terms = gspo_terms(lp, old, adv, mask, **WIDE, variant="token", behavior_logprobs=behaviour, tis_cap=2.0)
    assert terms.loss.item() == pytest.approx(-0.5 * (2.0 * s + 0.5 * s), rel=1e-6)
    terms.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-s * 2.0 / 2, -s * 0.5 / 2], rel=1e-6)

    lp, old, behaviour, adv, mask = _one_sequence()
    terms = gspo_terms(lp, old, adv, mask, **WIDE, behavior_logprobs=behaviour, tis_cap=2.0)
    w = math.sqrt(1.5)
    assert terms.loss.item() == pytest.approx(-s * w, rel=1e-6)
    terms.loss.backward()
    assert lp.grad.flatten().tolist() == pytest.approx([-s * w / 2, -s * w / 2], rel=1e-6)


def test_gspo_token_clips_like_gspo():
    """s = e^0.1 is far outside the default band: positive advantage, clipped, no gradient, both variants."""
    for variant in ("sequence", "token"):
        lp, old, _, adv, mask = _one_sequence()
        terms = gspo_terms(lp, old, adv, mask, variant=variant)
        terms.loss.backward()
        assert terms.clipped.tolist() == [True]
        assert lp.grad.abs().sum().item() == 0.0
    with pytest.raises(ValueError, match="gspo variant"):
        gspo_terms(lp, old, adv, mask, variant="tokens")


def test_sampler_mismatch_sums():
    trainer = torch.tensor([[-1.0, -2.0, -5.0]])
    sampler = torch.tensor([[-1.5, -1.8, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    abs_sum, k3_sum, tokens = sampler_mismatch(trainer, sampler, mask)
    assert tokens == 2.0
    assert abs_sum == pytest.approx(0.5 + 0.2)
    k3 = [math.exp(d) - 1 - d for d in (0.5, -0.2)]
    assert k3_sum == pytest.approx(sum(k3), rel=1e-6)


def test_behaviour_logprobs_alignment_and_missing_rows():
    """Captured values land on the completion columns; a row without captured logprobs takes the trainer's
    (weight 1) and is left out of the mismatch."""
    batch = collate_sequences([[1, 2], [3]], [[4, 5], [6, 7]], None, pad_id=0)
    old = torch.full(batch.loss_mask.shape, -9.0)
    values = behaviour_logprobs([[-0.1, -0.2], [-0.3, -0.4]], [True, False], batch, old)
    assert values.flatten().tolist() == pytest.approx([0.0, -0.1, -0.2, -9.0, -9.0, -9.0])
    meter = MismatchMeter()
    meter.add(old, values, batch.loss_mask, [True, False])
    metrics = MismatchMeter.metrics(meter.as_list())
    assert metrics["sampler_logprobs_missing"] == 1
    assert metrics["sampler_mismatch"] == pytest.approx((8.9 + 8.8) / 2)


def test_staleness_against_captured_versions():
    # weight_sync_interval 2: at iteration 3 the servers hold version 2; one server still served version 0
    out = staleness([[2, 2], [0], [None], ["2"]], synced=2, iteration=3)
    assert out == {"max_staleness": 3, "unexpected_versions": 1, "unknown_versions": 1}
    assert staleness([[None]], synced=0, iteration=0)["max_staleness"] is None


def test_config_keys_and_their_errors():
    base = {"training": {"group_size": 2}}
    cfg = parse_rl_config(base)
    assert (cfg.old_logprobs, cfg.tis_cap, cfg.gspo_variant) == ("trainer", 2.0, "sequence")
    cfg = parse_rl_config({"training": {"group_size": 2, "old_logprobs": "sampler", "tis_cap": 5,
                                        "gspo_variant": "token"}})  # fmt: skip
    assert (cfg.old_logprobs, cfg.tis_cap, cfg.gspo_variant) == ("sampler", 5.0, "token")
    for key, value in (("old_logprobs", "vllm"), ("tis_cap", 0.5), ("gspo_variant", "seq")):
        with pytest.raises(ValidationError, match=key):  # the job file's settings model names the setting
            parse_rl_config({"training": {"group_size": 2, key: value}})
