"""GSPO math against hand-computed values (posttrain_trainer.gspo)."""

from __future__ import annotations

import math

import pytest
import torch
from posttrain_trainer.gspo import (
    ADV_EPS,
    collate_sequences,
    group_advantages,
    gspo_loss,
    gspo_terms,
    ragged_group_advantages,
    split_minibatches,
    token_logprobs,
)


def test_group_advantages_population_std():
    adv = group_advantages([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0], group_size=4)
    std = math.sqrt(0.25 * 0.75)  # population std of [1, 0, 0, 0] = 0.4330127
    assert adv[0].item() == pytest.approx(0.75 / (std + ADV_EPS), rel=1e-6)
    assert adv[0].item() == pytest.approx(1.7320469, rel=1e-5)
    assert adv[1].item() == pytest.approx(-0.25 / (std + ADV_EPS), rel=1e-6)
    assert adv[4:].tolist() == [0.0, 0.0, 0.0, 0.0]  # a uniform group carries no signal
    assert adv[:4].sum().item() == pytest.approx(0.0, abs=1e-6)


def test_group_advantages_two_member_group_and_layout_errors():
    adv = group_advantages(torch.tensor([3.0, 1.0]), 2)
    # mean 2, population std 1 -> +-1 / (1 + eps)
    assert adv.tolist() == pytest.approx([1 / (1 + ADV_EPS), -1 / (1 + ADV_EPS)])
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0, 3.0], 2)


def test_ragged_group_advantages_short_groups():
    out = ragged_group_advantages([1.0, 0.0, 0.0, 5.0], ["a", "a", "a", "b"])
    std = math.sqrt(2 / 9)  # [1, 0, 0]: mean 1/3
    assert out[0] == pytest.approx((2 / 3) / (std + ADV_EPS), rel=1e-6)
    assert out[3] == 0.0  # a group of one (its siblings failed) has no baseline


def _rows():
    # row 0: ratio exp(mean(1e-4, 1e-4)) (third token masked out), advantage +1 -> inside the clip band
    # row 1: ratio exp(0.01) > 1 + eps_high, advantage -2 -> unclipped branch is the min (pessimistic)
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.0001, -2.0001, -9.0], [-0.51, -0.51, -0.51]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([1.0, -2.0])
    return logprobs, old, mask, adv


def test_gspo_loss_hand_computed():
    logprobs, old, mask, adv = _rows()
    s0, s1 = math.exp(1e-4), math.exp(0.01)
    expected = -(s0 * 1.0 + s1 * -2.0) / 2
    loss = gspo_loss(logprobs, old, adv, mask)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    terms = gspo_terms(logprobs, old, adv, mask)
    assert terms.ratio.tolist() == pytest.approx([s0, s1], rel=1e-6)
    assert terms.clipped.tolist() == [False, False]


def test_gspo_gradient_direction_and_value():
    logprobs, old, mask, adv = _rows()
    gspo_loss(logprobs, old, adv, mask).backward()
    g = logprobs.grad
    s0, s1 = math.exp(1e-4), math.exp(0.01)
    # d(-s A / N)/d logp_t = -A s / (N * n_tokens) for masked tokens, 0 elsewhere
    assert g[0].tolist() == pytest.approx([-s0 / 4, -s0 / 4, 0.0], rel=1e-5)
    assert g[1].tolist() == pytest.approx([2 * s1 / 6] * 3, rel=1e-5)
    # gradient descent raises the logprobs of the positive-advantage sequence, lowers the negative one
    assert (g[0, :2] < 0).all() and (g[1] > 0).all()


def test_gspo_clipping_zeroes_gradient():
    # A > 0 and s > 1 + eps_high -> clipped branch is the min: no gradient; same for A < 0 and s < 1 - eps_low
    logprobs = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1.001, -1.001], [-0.999, -0.999]])  # s = e^0.001 and e^-0.001
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.5, -1.5])
    terms = gspo_terms(logprobs, old, adv, mask)
    terms.loss.backward()
    assert terms.clipped.tolist() == [True, True]
    assert terms.stats["clip_fraction"] == 1.0
    assert logprobs.grad.abs().max().item() == 0.0
    expected = -((1 + 4e-4) * 1.5 + (1 - 3e-4) * -1.5) / 2
    assert terms.loss.item() == pytest.approx(expected, abs=1e-7)  # float32
    # wider band: not clipped any more, gradient flows
    logprobs.grad = None
    gspo_loss(logprobs, old, adv, mask, eps_low=0.01, eps_high=0.01).backward()
    assert logprobs.grad.abs().min().item() > 0


def test_gspo_on_policy_equals_reinforce_with_length_norm():
    # ratio exactly 1 (old = current): loss = -mean_i A_i, gradient = -A_i / (N * n_i) per token
    logprobs = torch.tensor([[-0.3, -0.7, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = gspo_loss(logprobs, logprobs.detach(), torch.tensor([0.8]), mask)
    assert loss.item() == pytest.approx(-0.8)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-0.4, -0.4, 0.0])


def test_gspo_k3_kl_and_normaliser():
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-0.5, -2.0]])  # delta = ref - logp = [0.5, 0]
    mask = torch.ones(1, 2)
    k3 = (math.exp(0.5) - 0.5 - 1.0 + 0.0) / 2  # mean over the 2 tokens = 0.0743606
    terms = gspo_terms(logprobs, logprobs.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref, beta=0.1)
    assert terms.kl.item() == pytest.approx(k3, rel=1e-6)
    assert terms.loss.item() == pytest.approx(0.1 * k3, rel=1e-6)
    assert terms.stats["kl"] == pytest.approx(k3, rel=1e-6)
    # beta = 0 (default) ignores the reference
    assert gspo_loss(logprobs, logprobs.detach(), torch.tensor([0.0]), mask, ref_logprobs=ref).item() == 0.0
    # num_sequences: a micro-batch of one out of a mini-batch of 4
    half = gspo_loss(logprobs, logprobs.detach(), torch.tensor([2.0]), mask, num_sequences=4)
    assert half.item() == pytest.approx(-0.5)


def test_empty_mask_row_is_neutral():
    logprobs = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    loss = gspo_loss(logprobs, torch.tensor([[-5.0, -5.0]]), torch.tensor([1.0]), torch.zeros(1, 2))
    assert loss.item() == pytest.approx(-1.0)  # ratio exp(0) = 1
    loss.backward()
    assert logprobs.grad.abs().max().item() == 0.0


def test_split_minibatches():
    assert split_minibatches(list(range(10)), 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert split_minibatches([1, 2], 4) == [[1], [2]]
    assert split_minibatches([], 4) == []
    assert split_minibatches(list(range(8))) == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_collate_and_token_logprobs_match_manual():
    torch.manual_seed(0)

    class Toy(torch.nn.Module):  # logits depend on the previous token only
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(7, 7)

        def forward(self, input_ids, attention_mask=None, use_cache=False):
            return type("Out", (), {"logits": self.table(input_ids)})()

    model = Toy()
    batch = collate_sequences([[1, 2], [3]], [[4, 5, 6], [2]], [[1, 0, 1], [1]], pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 4, 5, 6], [3, 2, 0, 0, 0]]
    assert batch.loss_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]
    assert batch.completion_start == [2, 1]
    lp = token_logprobs(model, batch.input_ids, batch.attention_mask)
    logsm = torch.log_softmax(model.table.weight, dim=-1)
    assert lp[0, 1].item() == pytest.approx(logsm[2, 4].item(), rel=1e-5)  # P(4 | ..., 2)
    assert lp[1, 0].item() == pytest.approx(logsm[3, 2].item(), rel=1e-5)
    lp_t = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=2.0)
    assert lp_t[0, 1].item() == pytest.approx(
        torch.log_softmax(model.table.weight / 2, dim=-1)[2, 4].item(), rel=1e-5
    )
    aligned = batch.completion_values([[-0.1, -0.2, -0.3], [-0.4]])
    assert aligned.flatten().tolist() == pytest.approx([0, -0.1, -0.2, -0.3, -0.4, 0, 0, 0])


def test_token_logprobs_skip_prompt_logits():
    """first_target: the model is asked for logits from that position on only (logits_to_keep), the values
    on every trained column are the same as with full logits, and the skipped prompt columns read 0."""
    torch.manual_seed(0)
    kept: list[int | None] = []

    class Toy(torch.nn.Module):  # logits depend on the previous token only; honours logits_to_keep
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(9, 9)

        def forward(self, input_ids, attention_mask=None, use_cache=False, logits_to_keep=0):
            kept.append(logits_to_keep)
            logits = self.table(input_ids)
            return type("Out", (), {"logits": logits[:, -logits_to_keep:] if logits_to_keep else logits})()

    model = Toy()
    batch = collate_sequences([[1, 2, 3], [4, 5, 6, 7]], [[8, 1], [2, 3, 4]], None, pad_id=0)
    assert batch.first_target == 2
    full = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7)
    part = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7,
                          first_target=batch.first_target)  # fmt: skip
    assert kept == [0, batch.input_ids.shape[1] - 2]
    assert part.shape == full.shape
    trained = batch.loss_mask.bool()
    assert torch.allclose(part[trained], full[trained])
    assert part[:, :2].abs().sum().item() == 0.0
