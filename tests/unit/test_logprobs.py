"""Chunked completion-only logprobs (posttrain_trainer.logprobs) against a full log-softmax, on a real
(tiny, random, in-memory) Qwen2: the same values and gradients, chunks that respect the byte budget, and
chunk logits recomputed in backward rather than kept."""

from __future__ import annotations

import pytest
import torch
from posttrain_trainer.gspo import collate_sequences
from posttrain_trainer.logprobs import chunk_rows, token_logprobs


def _tiny(vocab: int = 97, tie: bool = True, **extra) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=tie, **extra,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).float()


def _reference(model, batch, temperature: float) -> torch.Tensor:
    """The textbook computation: every position's full-vocabulary logits, one log_softmax."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits.float()
    logsm = torch.log_softmax(logits[:, :-1] / temperature, dim=-1)
    return torch.gather(logsm, -1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)


def _batch():
    return collate_sequences([[5, 6, 7], [8, 9, 10, 11]], [[12, 13, 14, 15, 16], [17, 18]], None, pad_id=0)


def test_chunk_rows():
    assert chunk_rows(1000, 4000 * 3) == 3
    assert chunk_rows(152_064, 128 * 2**20) == 220  # a Qwen2.5 vocabulary: 220 positions per 128 MiB
    assert chunk_rows(10**9, 1) == 1


@pytest.mark.parametrize("tie", [True, False])
def test_chunked_values_and_gradients_match_full_log_softmax(tie):
    model = _tiny(tie=tie)
    batch = _batch()
    trained = batch.loss_mask.bool()
    expected = _reference(model, batch, 0.7)
    (expected * batch.loss_mask).sum().backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    got = token_logprobs(model, batch.input_ids, batch.attention_mask, temperature=0.7,
                         first_target=batch.first_target, chunk_bytes=97 * 4 * 3)  # fmt: skip
    assert got.shape == expected.shape
    assert torch.allclose(got[trained], expected[trained], atol=1e-5)
    assert got[:, : batch.first_target].abs().sum().item() == 0.0
    (got * batch.loss_mask).sum().backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, want[name], atol=1e-5), name


def test_chunks_respect_the_budget_and_are_recomputed_in_backward():
    """Three rows per chunk: every projection sees at most 3 rows; with gradients, each chunk is projected
    twice (forward, then recomputed in backward), so no chunk's logits are kept between the passes."""
    model = _tiny()
    batch = _batch()
    rows_seen: list[int] = []
    head = model.get_output_embeddings()
    plain = head.forward

    def counting(hidden):  # installed on the instance, like accelerate's hooks: kept and called per chunk
        rows_seen.append(hidden.shape[0])
        return plain(hidden)

    head.forward = counting
    width = batch.input_ids.shape[1]
    positions = 2 * (width - batch.first_target - 1)
    chunks = -(-positions // 3)
    with torch.no_grad():
        token_logprobs(model, batch.input_ids, batch.attention_mask, first_target=batch.first_target,
                       chunk_bytes=97 * 4 * 3)  # fmt: skip
    assert len(rows_seen) == chunks and max(rows_seen) <= 3 and sum(rows_seen) == positions
    rows_seen.clear()
    lp = token_logprobs(model, batch.input_ids, batch.attention_mask, first_target=batch.first_target,
                        chunk_bytes=97 * 4 * 3)  # fmt: skip
    assert len(rows_seen) == chunks
    lp.sum().backward()
    assert len(rows_seen) == 2 * chunks and max(rows_seen) <= 3
    assert head.forward is counting  # restored


def test_head_is_restored_and_model_post_processing_takes_the_plain_path():
    model = _tiny()
    batch = _batch()
    token_logprobs(model, batch.input_ids, batch.attention_mask)
    assert "forward" not in model.get_output_embeddings().__dict__
    out = model(input_ids=batch.input_ids).logits
    assert out.shape[-1] == 97  # the head projects again
    model.config.final_logit_softcapping = 30.0  # a soft-capped head (Gemma 2): values from full logits
    from posttrain_trainer.logprobs import output_layer

    assert output_layer(model) is None
