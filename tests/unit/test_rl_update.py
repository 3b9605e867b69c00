"""One GSPO update (rl.gspo_update) on a real tiny Qwen2 built in memory: activation checkpointing really
recomputes, dropout stays off, and the local reference gives KL exactly 0 at step 0."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from posttrain_trainer import distributed as D
from posttrain_trainer import rl
from posttrain_trainer.modeling import train_without_dropout
from posttrain_trainer.rl_config import RLTrainerConfig


def _tiny(**extra) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, **extra,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _engine(model: torch.nn.Module, autocast: torch.dtype | None = None) -> D.TrainEngine:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return D.TrainEngine(model, optimizer, None, kind="single", autocast_dtype=autocast)


def _seqs(n: int = 4) -> list[rl.TrainSeq]:
    out = []
    for i in range(n):
        completion = [10 + (i * 7 + j) % 80 for j in range(5 + i)]
        out.append(rl.TrainSeq([3, 4, 5 + i], completion, [1] * len(completion), advantage=(-1.0) ** i))
    return out


def _count_layer_calls(model: torch.nn.Module) -> list[int]:
    calls = [0]
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_activation_checkpointing_recomputes_in_the_update():
    """3 layers, one mini-batch of one micro-batch: a forward pass calls each layer once; checkpointing
    calls each again in backward. Before, the update ran in eval(), where checkpointing does nothing (3)."""
    model = _tiny()
    model.gradient_checkpointing_enable()
    calls = _count_layer_calls(model)
    cfg = RLTrainerConfig(num_minibatches=1, micro_batch=8)
    update = rl.gspo_update(_engine(model), _seqs(), cfg, pad_id=0)
    assert update["optimizer_steps"] == 1
    assert calls[0] == 2 * 3
    model.eval()  # the old mode, for contrast: no recomputation
    calls[0] = 0
    rl.gspo_update(_engine(model), _seqs(), cfg, pad_id=0)
    assert calls[0] == 2 * 3  # gspo_update sets its own mode, whatever the caller left


def test_checkpointing_is_inert_in_eval_mode():
    """The reason for train mode: transformers' checkpointing only runs when module.training."""
    model = _tiny()
    model.gradient_checkpointing_enable()
    model.eval()
    calls = _count_layer_calls(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    model(input_ids=ids).logits.sum().backward()
    assert calls[0] == 3


def test_train_without_dropout_matches_eval():
    """attention_dropout 0.5 and a Dropout module: in train_without_dropout the logits equal eval()'s."""
    model = _tiny(attention_dropout=0.5)
    model.model.norm.register_forward_hook(lambda m, a, out: torch.nn.functional.dropout(out, 0.0))
    model.model.extra = torch.nn.Dropout(0.5)  # any Dropout module in the tree
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    model.eval()
    with torch.no_grad():
        want = model(input_ids=ids).logits
    train_without_dropout(model)
    assert model.training and not model.model.extra.training
    with torch.no_grad():
        got = model(input_ids=ids).logits
    assert torch.equal(got, want)
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_local_reference_kl_is_exactly_zero_at_step_0(autocast):
    """The frozen reference is the policy's copy and runs under the policy's autocast: with identical
    weights every k3 term is exactly 0 (under bf16 autocast, a reference run without it differs)."""
    model = _tiny()
    frozen = copy.deepcopy(model).eval()
    engine = _engine(model, autocast)
    cfg = RLTrainerConfig(num_minibatches=1, micro_batch=8, beta=0.1, temperature=0.7)
    ref_fn = rl.local_reference_fn(engine, frozen, temperature=0.7)
    update = rl.gspo_update(engine, _seqs(), cfg, pad_id=0, ref_fn=ref_fn)
    assert update["kl"] == 0.0
    if autocast is not None:  # the failure mode this guards against: the reference without autocast
        from posttrain_trainer import gspo

        batch = rl._collate(_seqs(), 0)
        with torch.no_grad():
            plain = gspo.token_logprobs(frozen, batch.input_ids, batch.attention_mask, temperature=0.7)
            cast = ref_fn(_seqs(), batch)
        assert not torch.equal(plain[batch.loss_mask.bool()], cast[batch.loss_mask.bool()])


def test_lora_reference_kl_is_exactly_zero_at_step_0():
    """LoRA: the reference is the base under disable_adapter; a fresh adapter adds exactly 0."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_tiny(), LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.1))
    engine = _engine(model, torch.bfloat16)
    cfg = RLTrainerConfig(num_minibatches=1, micro_batch=8, beta=0.1, temperature=0.7)
    update = rl.gspo_update(engine, _seqs(), cfg, pad_id=0, ref_fn=rl.local_reference_fn(engine, None, 0.7))
    assert update["kl"] == 0.0


@pytest.mark.parametrize("variant", ["sequence", "token"])
def test_sampler_logprobs_mismatch_and_tis_in_the_update(variant):
    """Sampler logprobs 0.3 above the trainer's on every token: the mismatch reads 0.3 and its k3 KL
    e^-0.3 - 1 + 0.3 in both modes; under old_logprobs = "sampler" every importance weight is e^-0.3 (under
    the cap), so the loss is the trainer mode's times e^-0.3."""
    from posttrain_trainer import gspo

    model = _tiny()
    seqs = _seqs()
    batch = rl._collate(seqs, 0)
    with torch.no_grad():
        trainer = gspo.token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7)
    for row, s in enumerate(seqs):
        s.advantage = [1.0, 0.5, -0.2, 0.8][row]  # a non-zero sum: the on-policy loss is -mean(A)
        start = batch.completion_start[row] - 1
        s.sampling_logprobs = (trainer[row, start : start + len(s.completion_ids)] + 0.3).tolist()
        s.logprobs_captured = True
    out = {}
    for mode in ("trainer", "sampler"):
        cfg = RLTrainerConfig(num_minibatches=1, micro_batch=8, temperature=0.7, old_logprobs=mode,
                          gspo_variant=variant)  # fmt: skip
        out[mode] = rl.gspo_update(_engine(copy.deepcopy(model)), seqs, cfg, pad_id=0)
        assert out[mode]["sampler_mismatch"] == pytest.approx(0.3, rel=1e-4)
        assert out[mode]["sampler_kl"] == pytest.approx(math.exp(-0.3) - 1 + 0.3, rel=1e-3)
        assert out[mode]["sampler_logprobs_missing"] == 0
    assert out["trainer"]["loss"] != 0.0
    assert out["sampler"]["loss"] == pytest.approx(out["trainer"]["loss"] * math.exp(-0.3), rel=1e-4)
