"""LoRA targets of a vision-language model: synth's "mm_projector" reaches the model's projector (Qwen2-VL's
visual.merger), "all-linear" keeps peft's meaning, and a text-only model naming a projector is told it has none."""

from __future__ import annotations

import pytest
from posttrain_trainer.modeling import load_model_and_tokenizer


def lora_modules(model) -> set[str]:
    return {name.rsplit(".lora_A", 1)[0] for name, _ in model.named_parameters() if ".lora_A." in name}


def test_projector_alias_targets_the_merger(tiny_vl_model_dir):
    lora = {"r": 4, "alpha": 8, "target_modules": ["all-linear", "mm_projector"]}
    model, _ = load_model_and_tokenizer(tiny_vl_model_dir, trainer_mode="lora", lora=lora)
    wrapped = lora_modules(model)
    assert {m for m in wrapped if ".merger." in m} == {
        "base_model.model.model.visual.merger.mlp.0",
        "base_model.model.model.visual.merger.mlp.2",
    }
    assert any("language_model.layers.0.self_attn.q_proj" in m for m in wrapped)
    assert not any(m.endswith("lm_head") for m in wrapped)

    only = {"r": 4, "target_modules": ["q_proj", "projector"]}
    model, _ = load_model_and_tokenizer(tiny_vl_model_dir, trainer_mode="lora", lora=only)
    wrapped = lora_modules(model)
    assert {m.rsplit(".", 1)[-1] for m in wrapped} == {"q_proj", "0", "2"}


def test_all_linear_alone_keeps_peft_meaning_and_includes_the_projector(tiny_vl_model_dir):
    model, _ = load_model_and_tokenizer(tiny_vl_model_dir, trainer_mode="lora", lora={"r": 4})
    assert any(".merger.mlp.0" in m for m in lora_modules(model))


def test_text_model_has_no_projector(tiny_model_dir):
    with pytest.raises(ValueError, match="has none"):
        load_model_and_tokenizer(
            tiny_model_dir, trainer_mode="lora", lora={"target_modules": ["mm_projector"]}
        )
