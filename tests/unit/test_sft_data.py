"""SFT data: parsing rules, assistant-only loss mask on the real chat templates, padding-aware batching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posttrain_trainer.sft_config import parse_sft_config
from posttrain_trainer.sft_data import (
    IGNORE_INDEX,
    DataError,
    Example,
    collate,
    encode_example,
    epoch_batches,
    parse_jsonl,
    split_global_batch,
)

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / ".models" / "smollm2-135m-instruct"

CONVO = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "The answer is 5."},
    {"role": "user", "content": [{"type": "text", "text": "And 4 + 4?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "The answer is 8."}]},
]


def _tokenizer(path):
    from posttrain_trainer.modeling import load_tokenizer

    return load_tokenizer(path)


def _trained_text(tok, encoded) -> list[str]:
    """Decoded runs of consecutive target tokens."""
    runs, current = [], []
    for token, label in zip(encoded.input_ids, encoded.labels, strict=True):
        if label != IGNORE_INDEX:
            assert label == token
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    if current:
        runs.append(tok.decode(current))
    return runs


def test_assistant_only_mask_chatml(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    encoded = encode_example(tok, Example(1, CONVO, {}), max_length=512)
    assert _trained_text(tok, encoded) == ["The answer is 5.<|im_end|>\n", "The answer is 8.<|im_end|>\n"]
    # nothing of the system or user turns, nor the assistant header, is trained
    assert encoded.n_target < len(encoded) / 2


@pytest.mark.skipif(not (SMOLLM2 / "tokenizer.json").exists(), reason="SmolLM2 not converted (.models/)")
def test_assistant_only_mask_smollm2_template():
    tok = _tokenizer(SMOLLM2)
    messages = [
        m if isinstance(m["content"], str) else {**m, "content": m["content"][0]["text"]} for m in CONVO[1:]
    ]
    encoded = encode_example(tok, Example(1, messages, {}), max_length=512)
    runs = [r.strip() for r in _trained_text(tok, encoded)]
    assert runs == ["The answer is 5.<|im_end|>", "The answer is 8.<|im_end|>"]


def test_truncation_keeps_prefix(tiny_model_dir):
    tok = _tokenizer(tiny_model_dir)
    full = encode_example(tok, Example(1, CONVO, {}), max_length=512)
    short = encode_example(tok, Example(1, CONVO, {}), max_length=10)
    assert short.input_ids == full.input_ids[:10] and short.n_target == 0


def test_images_rejected_for_text_only_model(tiny_model_dir, tmp_path):
    tok = _tokenizer(tiny_model_dir)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ],
        },
        {"role": "assistant", "content": "a cat"},
    ]
    path = tmp_path / "mm.jsonl"
    path.write_text(json.dumps({"messages": CONVO}) + "\n" + json.dumps({"messages": messages}) + "\n")
    rows = parse_jsonl(path)
    with pytest.raises(DataError, match=r"mm.jsonl:2: image content, but the model is text-only"):
        encode_example(tok, rows[1], max_length=64, source="mm.jsonl")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "not valid JSON"),
        (json.dumps({"text": "hi"}), "messages list"),
        (json.dumps({"messages": [{"role": "user", "content": "x"}]}), "at least 2"),
        (
            json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}]}),
            "no assistant",
        ),
        (
            json.dumps({"messages": [{"content": "x"}, {"role": "assistant", "content": "y"}]}),
            "without a role",
        ),
        (
            json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": [{"type": "image_url", "image_url": {}}]},
                        {"role": "assistant", "content": "y"},
                    ]
                }
            ),
            "image part without a URL",
        ),
    ],
)
def test_parse_errors_name_the_line(tmp_path, line, message):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"messages": CONVO}) + "\n" + line + "\n")
    with pytest.raises(DataError, match=rf"d.jsonl:2: .*{message}"):
        parse_jsonl(path)


def test_empty_file(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no SFT examples"):
        parse_jsonl(tmp_path / "e.jsonl")


def test_batching_is_padding_aware_and_rank_consistent():
    lengths = [5, 50, 6, 49, 7, 48, 8, 47]
    batches = epoch_batches(8, 8, seed=1, epoch=0)
    assert sorted(batches[0]) == list(range(8))
    assert (
        epoch_batches(8, 8, seed=1, epoch=0) == batches and epoch_batches(10, 4, seed=1, epoch=1) != batches
    )
    assert [len(b) for b in epoch_batches(10, 4, seed=0, epoch=0)] == [4, 4]  # incomplete last batch dropped
    per_rank = [split_global_batch(batches[0], lengths, micro_batch=2, world_size=2, rank=r) for r in (0, 1)]
    micro = [m for r in per_rank for m in r]
    assert sorted(i for m in micro for i in m) == list(range(8))
    for m in micro:  # short with short, long with long
        assert max(lengths[i] for i in m) - min(lengths[i] for i in m) <= 2
    assert len(per_rank[0]) == len(per_rank[1]) == 2


def test_collate_pads_right():
    from posttrain_trainer.sft_data import Encoded

    batch = collate([Encoded(1, [1, 2, 3], [-100, 2, 3]), Encoded(2, [4], [4])], pad_id=0, pad_to_multiple=4)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 0], [4, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100], [4, -100, -100, -100]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 0, 0, 0]]


def test_sft_config_from_synth_toml_shapes():
    cfg = parse_sft_config(
        {
            "algorithm": {"type": "offline", "method": "sft", "variety": "lora"},
            "training": {"mode": "lora", "lora": {"r": 8, "alpha": 16}},
            "hyperparameters": {
                "n_epochs": 2,
                "per_device_batch": 2,
                "gradient_accumulation_steps": 4,
                "learning_rate": 5e-6,
                "warmup_ratio": 0.03,
                # synth's example TOML nests eval keys inside parallelism by TOML scoping
                "parallelism": {
                    "use_deepspeed": True,
                    "deepspeed_stage": 3,
                    "bf16": True,
                    "evaluation_strategy": "steps",
                    "eval_steps": 20,
                    "metric_for_best_model": "val.loss",
                },
            },
        }
    )
    assert cfg.trainer_mode == "lora" and cfg.lora == {"r": 8, "alpha": 16}
    assert cfg.parallel.use_deepspeed and cfg.parallel.deepspeed_stage == 3 and cfg.parallel.bf16 is True
    assert "eval_steps" not in cfg.parallel.model_dump()
    assert cfg.validation.eval_steps == 20 and cfg.validation.enabled and not cfg.validation.greater_is_better
    assert parse_sft_config({"hyperparameters": {"train_kind": "fft"}}).trainer_mode == "full"
    with pytest.raises(ValueError, match="metric_for_best_model"):
        parse_sft_config({"training": {"validation": {"metric_for_best_model": "bleu"}}})
