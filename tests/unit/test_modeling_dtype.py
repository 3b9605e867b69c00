"""Weights load in the training dtype: where bf16 is on, a LoRA's frozen base loads in bf16 (never fp32) and
its adapter trains in fp32; a full fine-tune keeps fp32 master weights. Where bf16 is off, fp32 throughout."""

from __future__ import annotations

import pytest
import torch
from posttrain.hardware import Capability, decide
from posttrain_trainer.modeling import load_dtype, load_model_and_tokenizer

BF16_CPU = Capability(device="cpu", cpu_model="test", cpu_capability="AVX512", cpu_bf16=True)
FP32_CPU = Capability(device="cpu", cpu_model="test", cpu_capability="AVX2", cpu_bf16=False)


def test_load_dtype_table():
    on, off = decide(BF16_CPU), decide(FP32_CPU)
    assert load_dtype(on, "lora") == load_dtype(on, "qlora") == torch.bfloat16
    assert load_dtype(on, "full") == torch.float32  # every weight trains: fp32 master weights
    assert load_dtype(off, "lora") == load_dtype(off, "full") == torch.float32


@pytest.mark.parametrize("cap", [BF16_CPU, FP32_CPU], ids=["bf16-on", "bf16-off"])
def test_lora_base_loads_in_the_training_dtype(tiny_model_dir, cap):
    dtype = load_dtype(decide(cap), "lora")
    model, _ = load_model_and_tokenizer(tiny_model_dir, trainer_mode="lora", dtype=dtype, seed=0)
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    trained = {p.dtype for p in model.parameters() if p.requires_grad}
    assert frozen == {dtype}
    assert trained == {torch.float32}
