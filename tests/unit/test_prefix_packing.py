"""Shared-prefix packing (posttrain_trainer.prefix_packing): the plan over token lists, and on real tiny
models of every verified architecture (built in memory, float32) the packed forward gives the plain rows'
completion logprobs and gradients; one GSPO update packed equals one unpacked; what keeps plain rows."""

from __future__ import annotations

import copy

import pytest
import torch
from posttrain_trainer import distributed as D
from posttrain_trainer import prefix_packing as P
from posttrain_trainer import rl
from posttrain_trainer.gspo import collate_sequences
from posttrain_trainer.logprobs import token_logprobs
from posttrain_trainer.rl_config import RLTrainerConfig

SYSTEM = [3, 4, 5, 6, 7, 8, 9, 10]


def _tiny(model_type: str = "qwen2", attention: str = "sdpa", **extra) -> torch.nn.Module:
    import transformers

    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "mistral": ("MistralConfig", "MistralForCausalLM"),
               "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}  # fmt: skip
    config_cls, model_cls = (getattr(transformers, name) for name in classes[model_type])
    torch.manual_seed(0)
    config = config_cls(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True, head_dim=8, **extra,
    )  # fmt: skip
    config._attn_implementation = attention
    return model_cls(config).float()


def _group(prompt: list[int], completions: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    return [list(prompt) for _ in completions], completions


def _rows() -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """Two groups (prompts of different lengths), a duplicate completion, a completion that extends
    another's start, and a multi-turn style completion mask with tool tokens the policy did not sample."""
    p1, c1 = _group(
        [*SYSTEM, 20, 21, 22], [[40, 41, 42, 2], [40, 41, 42, 2], [43, 44, 2], [40, 45, 46, 47, 48]]
    )
    p2, c2 = _group([*SYSTEM, 30, 31, 32, 33, 34], [[50, 51, 2], [52, 2], [53, 54, 55, 56, 57, 58, 2]])
    masks = [[1] * len(c) for c in c1 + c2]
    masks[3] = [1, 1, 0, 0, 1]
    return p1 + p2, c1 + c2, masks


def test_a_group_packs_into_one_row_and_unrelated_rows_do_not_pack():
    prompts, completions, _ = _rows()
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    groups = P.clusters(rows)
    assert [members for members, _ in groups] == [[0, 1, 2, 3], [4, 5, 6]]
    assert groups[0][1] == 11 and groups[1][1] == 13  # each group's prompt (row 2 starts with 43, not 40)
    packed = P.plan(rows, [len(p) for p in prompts], pad_id=0)
    assert packed is not None and packed.input_ids.shape[0] == 2
    assert (
        packed.packed_tokens
        == 11 + 4 + 4 + 3 + 5 + 13 + 3 + 2 + 7
        < packed.plain_tokens
        == sum(map(len, rows))
    )
    # every completion target is read exactly once; positions go on from the prefix's end in each segment
    assert len(packed.out_row) == sum(len(c) for c in completions)
    assert packed.position_ids[0, 11:19].tolist() == [11, 12, 13, 14] * 2  # rows 0, 1 after the prefix
    unrelated = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11]]
    assert P.plan(unrelated, [2, 2, 2], pad_id=0) is None
    assert all(len(m) == 1 for m, _ in P.clusters(unrelated))


def test_a_group_stays_one_packed_row_when_its_later_answers_share_a_start():
    """Sorted by length, a group's answers 2 and 3 share "47 48" but not answer 0's start: without the
    prompt lengths the greedy rule splits the group there; with them, rows of one prompt always join."""
    prompt = [*SYSTEM, 20, 21, 22]
    rows = [prompt + c for c in ([40, 41, 2], [40, 41, 42, 2], [47, 48, 49, 2], [47, 48, 50, 51, 2])]
    assert [m for m, _ in P.clusters(rows)] == [[0, 1], [2, 3]]
    assert P.clusters(rows, [len(prompt)] * 4) == [([0, 1, 2, 3], len(prompt))]


def test_rows_join_only_while_packing_saves_a_quarter_and_within_the_limits():
    # a shared prefix of 2 tokens on rows of 10 saves too little: plain rows
    rows = [[1, 2, *range(10, 18)], [1, 2, *range(20, 28)]]
    assert P.plan(rows, [2, 2], pad_id=0) is None
    shared = [[*SYSTEM, 40, 41], [*SYSTEM, 42, 43], [*SYSTEM, 44, 45]]
    assert P.plan(shared, [8, 8, 8], pad_id=0, max_tokens=12) is not None  # 8 + 2 + 2 = 12: the first two
    assert [m for m, _ in P.clusters(shared, max_tokens=12)] == [[0, 1], [2]]
    assert P.plan(shared, [8, 8, 8], pad_id=0, window=9) is None  # a row past a sliding window: plain


def test_the_mask_lets_a_segment_see_the_prefix_and_itself_only():
    segments = torch.tensor([[0, 0, 1, 1, 2, -1]])
    ok = P.allowed(segments)[0, 0]
    assert ok[3].tolist() == [True, True, True, True, False, False]  # segment 1: prefix + itself, causal
    assert ok[4].tolist() == [True, True, False, False, True, False]  # segment 2 skips segment 1
    assert ok[1].tolist() == [True, True, False, False, False, False]  # the prefix sees only the prefix
    assert ok[5].tolist() == [False] * 5 + [True]  # padding: itself alone (no NaN row)
    additive = P.mask_4d(segments, "eager")[0, 0]
    assert additive.dtype == torch.float32 and additive[3, 4] < -1e30 and additive[3, 2] == 0


@pytest.mark.parametrize("model_type", P.VERIFIED_MODEL_TYPES)
@pytest.mark.parametrize("attention", P.MASKED_ATTENTION)
def test_packed_logprobs_and_gradients_equal_the_plain_rows(model_type, attention):
    model = _tiny(model_type, attention)
    assert P.unsupported_reason(model) is None
    prompts, completions, masks = _rows()
    batch = collate_sequences(prompts, completions, masks, pad_id=0)
    trained = batch.loss_mask.bool()
    plain = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7,
                           first_target=batch.first_target)  # fmt: skip
    (plain * batch.loss_mask).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    packed = P.plan(rows, batch.completion_start, pad_id=0)
    got = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7, packed=packed)
    assert got.shape == plain.shape
    assert torch.allclose(got[trained], plain[trained], atol=1e-5)
    (got * batch.loss_mask).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5), name


def _update(pack: bool, seqs: list[rl.TrainSeq], beta: float = 0.0) -> tuple[dict, dict[str, torch.Tensor]]:
    from peft import LoraConfig, get_peft_model

    plans = []
    real_plan = P.plan

    def counting_plan(*args, **kwargs):
        plans.append(real_plan(*args, **kwargs))
        return plans[-1]

    model = get_peft_model(_tiny(), LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    engine = D.TrainEngine(model, optimizer, None, kind="single")
    cfg = RLTrainerConfig(num_minibatches=2, micro_batch=4, temperature=0.7, beta=beta)
    policy, line = P.pack_policy(engine.module, vision=False)
    assert (policy is not None) and line.startswith("shared-prefix packing: on")
    ref_fn = rl.local_reference_fn(engine, None, 0.7) if beta else None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(P, "plan", counting_plan)
        update = rl.gspo_update(engine, copy.deepcopy(seqs), cfg, pad_id=0, ref_fn=ref_fn, iteration=1,
                                pack=policy if pack else None)  # fmt: skip
    # packed: every micro-batch of 4 rows sorted by prompt holds rows that share one (no plain fallback)
    assert (len(plans) == 4 and all(p is not None for p in plans)) if pack else not plans
    return update, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_a_packed_gspo_update_equals_the_plain_one(beta):
    """Two mini-batches (the second off-policy: old logprobs from a forward pass), LoRA, a local reference
    (beta > 0): the same loss, clip fraction, KL and trained weights, packed or not."""
    prompts, completions, masks = _rows()
    seqs = [rl.TrainSeq(p, c, m, advantage=(-1.0) ** i * (0.5 + i / 10))
            for i, (p, c, m) in enumerate(zip(prompts * 2, completions * 2, masks * 2, strict=True))]  # fmt: skip
    plain, plain_weights = _update(False, seqs, beta)
    packed, packed_weights = _update(True, seqs, beta)
    for key in (
        "loss",
        "clip_fraction",
        "ratio_mean",
        "policy_tokens",
        "optimizer_steps",
        *(["kl"] if beta else []),
    ):
        assert plain[key] == pytest.approx(packed[key], rel=1e-4, abs=1e-6), key
    assert (plain["kl"] is None) == (packed["kl"] is None) == (beta == 0.0)
    assert plain["optimizer_steps"] == 2 and plain["loss"] != 0.0
    for name, weight in plain_weights.items():
        assert torch.allclose(weight, packed_weights[name], atol=1e-5), name


def test_what_keeps_plain_rows_is_named():
    assert "vision" in P.unsupported_reason(_tiny(), vision=True)
    flash = _tiny()
    flash.config._attn_implementation = "flash_attention_2"  # as loaded on a GPU with flash-attn installed
    assert "flash_attention_2" in P.unsupported_reason(flash)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=97, n_embd=32, n_layer=1, n_head=4, n_positions=64))
    assert "'gpt2' is not among those verified" in P.unsupported_reason(gpt2)
    policy, line = P.pack_policy(gpt2, vision=False)
    assert policy is None and line.startswith("shared-prefix packing: off (model type 'gpt2'")
    mistral = _tiny("mistral", sliding_window=64)
    assert P.sliding_window(mistral) == 64 and P.pack_policy(mistral, vision=False)[0] == P.PackPolicy(64)
    assert P.sliding_window(_tiny("qwen2")) is None  # Qwen2 names a window but uses none by default
