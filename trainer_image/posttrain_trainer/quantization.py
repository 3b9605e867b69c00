"""QLoRA: the base model's linear layers in 4-bit NF4 (bitsandbytes: CUDA kernels on GPUs, its torch CPU
backend here), LoRA adapters in full precision on top (trainer_mode = "qlora").

What differs from LoRA: loading (a BitsAndBytesConfig, then peft's prepare_model_for_kbit_training), and every
place that needs the base weights as dense tensors (weight sync merges, the final merged export), which
dequantize the NF4 blocks first. DeepSpeed ZeRO cannot shard 4-bit parameters, so QLoRA runs under DDP."""

from __future__ import annotations

from typing import Any

import torch


class QLoRAUnavailable(RuntimeError):
    pass


def quantization_config(compute_dtype: torch.dtype) -> Any:
    """NF4 with double quantization (the QLoRA paper's recipe), compute in `compute_dtype`."""
    try:
        import bitsandbytes  # noqa: F401
        from transformers import BitsAndBytesConfig
    except ImportError as err:  # pragma: no cover - pinned in pyproject / the trainer image
        raise QLoRAUnavailable(
            f"trainer_mode = 'qlora' needs bitsandbytes ({err}); install it or use trainer_mode = 'lora'"
        ) from err
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def prepare_for_training(model: torch.nn.Module, gradient_checkpointing: bool) -> torch.nn.Module:
    """peft's k-bit preparation: norms and the head in fp32, input grads for checkpointing."""
    from peft import prepare_model_for_kbit_training

    for module in model.modules():
        # bitsandbytes repacks a 4-bit weight for its AVX512-BF16 inference kernel the first time the layer
        # runs in eval mode without grad (our old-logprob and eval passes) and never packs it back; the
        # next training forward then fails in that inference-only path. Keep the training layout.
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)


def is_4bit_linear(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return weight is not None and type(weight).__name__ == "Params4bit"


def dense_weight(module: torch.nn.Module) -> torch.Tensor:
    """The layer's weight as a dense float tensor (NF4 blocks dequantized; other layers as they are)."""
    weight = module.weight
    if type(weight).__name__ != "Params4bit":
        return weight.detach()
    import bitsandbytes.functional as bnbf

    return bnbf.dequantize_4bit(weight.data, weight.quant_state).to(torch.float32)


def dense_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """model.state_dict() with every 4-bit linear's packed weight and quantization state replaced by its
    dequantized weight (a plain checkpoint's keys and shapes)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    for name, module in model.named_modules():
        if not is_4bit_linear(module):
            continue
        prefix = f"{name}.weight"
        for key in [k for k in state if k.startswith(prefix + ".")]:
            del state[key]  # absmax, quant_map, nested_* , quant_state.bitsandbytes__nf4
        state[prefix] = dense_weight(module)
    return state
