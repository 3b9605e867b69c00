"""A stored LoRA result merged for serving (posttrain eval) reproduces the policy the job trained: the adapter
was trained on the base as the trainer held it (bf16 where bf16 is native), so it is merged onto that copy."""

from __future__ import annotations

import torch
from posttrain_trainer.modeling import load_model_and_tokenizer, save_final


def _some_weight(model) -> tuple[str, torch.Tensor]:
    name = next(n for n, _ in model.named_parameters() if n.endswith("q_proj.weight"))
    return name, dict(model.named_parameters())[name].detach().clone()


def _fp32_base(tiny_model_dir, out):
    """The tiny model with fp32 weights that bf16 cannot hold exactly (as a real fp32 checkpoint's)."""
    model, tokenizer = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 1e-4)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


def test_an_adapter_is_merged_onto_the_base_it_was_trained_on(tiny_model_dir, tmp_path):
    tiny_model_dir = _fp32_base(tiny_model_dir, tmp_path / "base")
    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj"]}
    model, tokenizer = load_model_and_tokenizer(
        tiny_model_dir, trainer_mode="lora", lora=lora, dtype=torch.bfloat16, seed=0
    )
    with torch.no_grad():  # a trained adapter: B moved away from its zero init
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn_like(param) * 1e-3)
    out = save_final(model, tokenizer, tmp_path / "final", base_model="tiny", base_model_path=str(tiny_model_dir))

    as_trained, _ = load_model_and_tokenizer(out, dtype=torch.float32, base_dtype=torch.bfloat16)
    plain, _ = load_model_and_tokenizer(out, dtype=torch.float32)
    base, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32)
    name, merged = _some_weight(as_trained)
    _, merged_plain = _some_weight(plain)
    _, w = _some_weight(base)
    assert merged.dtype == torch.float32
    delta = merged - w.to(torch.bfloat16).float()  # what the adapter adds on the bf16 copy
    assert delta.abs().max() > 0  # the adapter is there
    assert torch.allclose(merged - delta, w.to(torch.bfloat16).float())
    assert not torch.equal(merged, merged_plain)  # merged onto the fp32 base it would differ
    assert torch.allclose(merged - merged_plain, w.to(torch.bfloat16).float() - w, atol=1e-7)
    # a full model (no adapter) ignores base_dtype: its own fp32 weights, not a bf16 copy
    full, _ = load_model_and_tokenizer(tiny_model_dir, dtype=torch.float32, base_dtype=torch.bfloat16)
    assert torch.equal(_some_weight(full)[1], w), name
