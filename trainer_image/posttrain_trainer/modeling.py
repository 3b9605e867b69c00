"""Load a Hugging Face causal LM (+ tokenizer with its chat template) for training, full or LoRA, and save it.

Sources: a local folder or an s3:// URI (downloaded and cached). A folder holding a LoRA adapter (a previous
job's final/) is loaded as its base model with the adapter merged in, so `model.source = ft:...` works for
both full and LoRA results.

Dtype policy (posttrain.hardware decides, distributed.announce_precision prints it): trainable weights stay
fp32 (master weights); compute runs in bf16 autocast where bf16 is native (GPUs with bf16, CPUs with
AVX512-BF16/AMX), fp32 elsewhere; a LoRA's frozen base loads in the compute dtype (load_dtype); weight sync
writes the sync dtype. DeepSpeed with bf16 casts the module itself."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from posttrain import storage as s3
from posttrain.api.jobfile import StorageRef

BASE_REF_FILE = "posttrain-base.json"  # next to a LoRA adapter: which base model it belongs to


def resolve_model_dir(model_path: str, storage: StorageRef | None = None) -> Path:
    """A local folder for model_path (downloads an s3:// URI into the cache)."""
    if s3.is_s3_uri(model_path):
        if storage is None:
            raise ValueError(
                f"model_path {model_path} is an s3:// URI but the job file has no storage section"
            )
        return s3.download_dir(s3.client_from_env(storage), model_path)
    path = Path(model_path)
    if not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
        raise FileNotFoundError(f"no Hugging Face model (config.json) in {path}")
    return path


def is_adapter_dir(path: Path) -> bool:
    return (path / "adapter_config.json").exists() and not (path / "config.json").exists()


def is_vision_model(config: Any) -> bool:
    return getattr(config, "vision_config", None) is not None


def lora_settings(lora: dict[str, Any] | None) -> dict[str, Any]:
    """synth's training.lora / [lora] (r, alpha, dropout, target_modules) -> peft LoraConfig kwargs."""
    lora = dict(lora or {})
    targets = lora.get("target_modules") or "all-linear"
    if isinstance(targets, list) and targets == ["all-linear"]:
        targets = "all-linear"
    return {
        "r": int(lora.get("r") or lora.get("rank") or 16),
        "lora_alpha": int(lora.get("alpha") or lora.get("lora_alpha") or 32),
        "lora_dropout": float(lora.get("dropout") if lora.get("dropout") is not None else 0.05),
        "target_modules": targets,
    }


# what synth configs call a vision model's projector (the layers that map image features into the LM);
# the model's own module names differ: Qwen2/2.5-VL visual.merger.mlp.*, Qwen3-VL visual.merger.linear_fc*,
# LLaVA-style multi_modal_projector.*
PROJECTOR_ALIASES = ("mm_projector", "projector", "multi_modal_projector", "merger")
_PROJECTOR_PATHS = (".merger.", "multi_modal_projector.", "mm_projector.", "deepstack_merger")


def lora_targets(model: torch.nn.Module, targets: str | list[str]) -> str | list[str]:
    """peft target_modules for this model: "all-linear" stays peft's (every linear layer but the output
    head; a vision model's projector included); a list naming a projector alias gets the model's projector
    layers instead, and "all-linear" inside a list becomes every such linear layer by name."""
    if isinstance(targets, str):
        return targets
    names = list(targets)
    wants_projector = any(n in PROJECTOR_ALIASES for n in names)
    if not wants_projector and "all-linear" not in names:
        return names
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    out = [n for n in names if n not in PROJECTOR_ALIASES and n != "all-linear"]
    if "all-linear" in names:
        out += linear
    if wants_projector:
        projector = [n for n in linear if any(p in f".{n}." for p in _PROJECTOR_PATHS)]
        if not projector:
            raise ValueError(f"lora target_modules names a projector ({', '.join(PROJECTOR_ALIASES)}), "
                             "but this model has none")  # fmt: skip
        out += projector
    return sorted(set(out))


def _model_and_adapter_dirs(model_path: str | Path, storage: StorageRef | None) -> tuple[Path, Path | None]:
    """(base model folder, LoRA adapter folder or None) for a folder or s3:// URI."""
    model_dir = resolve_model_dir(str(model_path), storage)
    if not is_adapter_dir(model_dir):
        return model_dir, None
    ref = json.loads((model_dir / BASE_REF_FILE).read_text())
    return resolve_model_dir(ref["model_path"], storage), model_dir


def load_processor(model_path: str | Path, *, storage: StorageRef | None = None):
    """The vision-language processor (tokenizer + image processor + chat template) saved with the model, or
    with a LoRA adapter when the adapter folder carries one."""
    from transformers import AutoProcessor

    model_dir, adapter_dir = _model_and_adapter_dirs(model_path, storage)
    if adapter_dir is not None and any(
        (adapter_dir / name).exists() for name in ("processor_config.json", "preprocessor_config.json")
    ):
        model_dir = adapter_dir
    processor = AutoProcessor.from_pretrained(model_dir)
    _prepare_for_training(processor.tokenizer, processor.chat_template, f"the processor in {model_dir}")
    return processor


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    _prepare_for_training(tokenizer, tokenizer.chat_template, f"the tokenizer in {model_dir}")
    return tokenizer


def _prepare_for_training(tokenizer, chat_template: str | None, what: str) -> None:
    """Right padding with a pad token (eos when the model has none); a chat template is required."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    if not chat_template:
        raise ValueError(f"{what} has no chat template")


def load_model_and_tokenizer(
    model_path: str | Path,
    *,
    trainer_mode: str = "full",
    lora: dict[str, Any] | None = None,
    storage: StorageRef | None = None,
    dtype: torch.dtype = torch.float32,
    gradient_checkpointing: bool = False,
    seed: int | None = None,
    base_dtype: torch.dtype | None = None,
):
    """(model, tokenizer). `base_dtype`: when a stored adapter is to be merged, load the base weights in it,
    then cast to `dtype` before the merge, so that an adapter trained on a bf16 copy of its base is merged onto that same copy. trainer_mode "lora" wraps the model in a fresh peft LoRA; "qlora" loads the base
    in 4-bit NF4 (bitsandbytes, quantization.py) under the LoRA, and continues a previous job's adapter
    instead of merging it; "full" trains every weight. A vision-language model (its config has a
    vision_config, e.g. Qwen2-VL, Qwen2.5-VL, Qwen3-VL) loads as AutoModelForImageTextToText; its processor
    comes from load_processor."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    model_dir, adapter_dir = _model_and_adapter_dirs(model_path, storage)
    tokenizer = load_tokenizer(
        adapter_dir if adapter_dir and (adapter_dir / "tokenizer_config.json").exists() else model_dir
    )
    vision = is_vision_model(AutoConfig.from_pretrained(model_dir))
    auto_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    quantized = trainer_mode == "qlora"
    load_kwargs: dict[str, Any] = {"dtype": dtype, "use_safetensors": True}  # never *.bin (pickle)
    if quantized:
        from posttrain_trainer import quantization

        load_kwargs["quantization_config"] = quantization.quantization_config(dtype)
        if torch.cuda.is_available():  # bitsandbytes quantizes while placing the weights
            load_kwargs["device_map"] = {"": torch.cuda.current_device()}
    as_trained = base_dtype is not None and adapter_dir is not None and not quantized
    if as_trained:
        load_kwargs["dtype"] = base_dtype
    model = auto_class.from_pretrained(model_dir, **load_kwargs)
    if as_trained and base_dtype != dtype:
        model = model.to(dtype)
    if adapter_dir is not None and not quantized:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
    model.config.use_cache = False
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if trainer_mode in ("lora", "qlora"):
        from peft import LoraConfig, PeftModel, get_peft_model

        if quantized:
            model = quantization.prepare_for_training(model, gradient_checkpointing)
        if seed is not None:
            torch.manual_seed(seed)  # LoRA A init must agree on every rank
        if quantized and adapter_dir is not None:  # a 4-bit base cannot take a merge: train the adapter on
            model = PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
        else:
            settings = lora_settings(lora)
            settings["target_modules"] = lora_targets(model, settings["target_modules"])
            model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **settings))
        if gradient_checkpointing:
            model.enable_input_require_grads()
    elif trainer_mode != "full":
        raise ValueError(f"unknown trainer_mode {trainer_mode!r} (full, lora, qlora)")
    return model, tokenizer


def load_dtype(precision: Any, trainer_mode: str) -> torch.dtype:
    """The dtype to load weights in: fp32 for a full fine-tune (every weight trains: fp32 master weights),
    the decided frozen-weight dtype (posttrain.hardware.Precision.load) under LoRA / QLoRA."""
    from posttrain.hardware import torch_dtype

    return torch_dtype(precision.load) if trainer_mode in ("lora", "qlora") else torch.float32


def load_for_training(job: Any, cfg: Any, precision: Any):
    """(model, tokenizer) of a job's starting weights as a trainer config asks (trainer_mode, lora,
    activation checkpointing, seed), frozen weights in the precision's load dtype: what RL and SFT share."""
    return load_model_and_tokenizer(
        job.model_path,
        trainer_mode=cfg.trainer_mode,
        lora=cfg.lora,
        storage=job.storage,
        dtype=load_dtype(precision, cfg.trainer_mode),
        gradient_checkpointing=cfg.parallel.activation_checkpointing,
        seed=cfg.seed,
    )


def train_without_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """train() mode with every dropout off: what an RL update needs.

    Gradient checkpointing only recomputes in train mode (transformers checks `self.training`; in eval()
    it silently keeps every activation), while dropout must stay off in RL (with a clip band of 4e-4,
    dropout noise alone pushes most importance ratios out of it). So: train(), every Dropout module back
    in eval() (identity), and float dropout rates that layers read at call time (attention_dropout, ...)
    set to 0. The logprobs are then the same as in eval()."""
    model.train()
    for module in model.modules():
        if isinstance(module, torch.nn.modules.dropout._DropoutNd):
            module.eval()
        for name, value in list(vars(module).items()):
            if "dropout" in name and isinstance(value, float) and value != 0.0:
                setattr(module, name, 0.0)
    return model


def is_peft(model: torch.nn.Module) -> bool:
    if "peft" not in sys.modules:  # never imported (3 s): cannot be a PeftModel
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def render_chat(tokenizer, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )


@torch.no_grad()
def merge_to_full_state_dict(
    model: torch.nn.Module,
    dtype: torch.dtype | None = torch.bfloat16,
    state: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Full-model weights (base keys, e.g. model.layers.0.self_attn.q_proj.weight) with any LoRA merged in.
    `state`: the full weights already gathered from a sharded model (distributed.full_weights), read instead
    of the model's own tensors.

    Computed out of place (W + sum of the active adapters' deltas), so the training model is never touched
    (a merge/unmerge cycle would drift the base weights by float rounding on every weight sync). A tied
    lm_head is dropped when the config ties it."""
    from posttrain_trainer.distributed import unwrap

    model = unwrap(model)
    peft = is_peft(model)
    base = model.get_base_model() if peft else model
    weights: dict[str, torch.Tensor] = {}
    from posttrain_trainer import quantization

    if state is not None and peft:
        raise ValueError("a gathered state dict is only read for a full model, not a LoRA")
    source = state if state is not None else quantization.dense_state_dict(base)  # QLoRA: NF4 dequantized
    for key, tensor in source.items():
        if "lora_" in key or "modules_to_save" in key:
            continue
        key = key.replace(".base_layer.", ".")
        weights[key] = tensor.detach()
    if peft:
        from peft.tuners.lora import LoraLayer

        for name, module in base.named_modules():
            if not isinstance(module, LoraLayer) or getattr(module, "merged", False):
                continue
            weight = quantization.dense_weight(module.get_base_layer())
            merged = weight.clone()
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    merged += module.get_delta_weight(adapter).to(weight.dtype)
            weights[f"{name}.weight"] = merged
    out = {k: v.to(dtype or v.dtype).clone().contiguous().cpu() for k, v in weights.items()}
    if getattr(base.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


def checkpoint_keys(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights under the names a checkpoint of this architecture uses, as save_pretrained writes them.

    transformers renames some architectures' weights when it loads them (Qwen2-VL: checkpoint
    model.layers.* / visual.* become model.language_model.* / model.visual.* in memory); the synced folder
    keeps the checkpoint's names, the layout vLLM's loader and from_pretrained read. A no-op for Qwen2."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # older transformers: in-memory names are the checkpoint's
        return weights
    return dict(revert_weight_conversion(model, dict(weights)))


def save_merged(
    model: torch.nn.Module,
    tokenizer,
    out_dir: str | Path,
    dtype: torch.dtype = torch.bfloat16,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """A plain HF folder (config, safetensors, tokenizer) with LoRA merged: what vLLM reloads in weight sync.
    `state`: a sharded model's gathered full weights (see merge_to_full_state_dict)."""
    from safetensors.torch import save_file

    from posttrain_trainer.distributed import unwrap

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    base = model.get_base_model() if is_peft(model) else model
    merged = merge_to_full_state_dict(model, dtype, state)
    if is_vision_model(base.config) and "lm_head.weight" not in merged:
        # vLLM 0.32's in-place reload of a tied Qwen2-VL head: without lm_head.weight in the file it keeps
        # the old head ("ParallelLMHead: Failed to load weights") and the served policy is not the trained one
        embedding = base.get_input_embeddings().weight
        name = next(n for n, p in base.named_parameters() if p is embedding)
        merged["lm_head.weight"] = merged[name].clone()
    merged = checkpoint_keys(base, merged)
    save_file(merged, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    config = base.config.to_dict()
    config["dtype"] = str(dtype).replace("torch.", "")
    config.pop("torch_dtype", None)
    config.pop("quantization_config", None)  # QLoRA: the weights written here are dense
    config["use_cache"] = True
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(out_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir


def save_final(
    model: torch.nn.Module,
    tokenizer,
    out_dir: str | Path,
    *,
    base_model: str,
    base_model_path: str,
    merged: bool = False,
    state: dict[str, torch.Tensor] | None = None,
) -> Path:
    """The job's final model: full weights (bf16 safetensors), or a LoRA adapter plus posttrain-base.json
    naming the base model (id and path/URI). merged=True writes full merged weights even for LoRA.
    `state`: a sharded model's gathered full weights (see merge_to_full_state_dict)."""
    from posttrain_trainer.distributed import unwrap

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = unwrap(model)
    if is_peft(model) and not merged:
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        (out_dir / BASE_REF_FILE).write_text(
            json.dumps({"base_model": base_model, "model_path": base_model_path})
        )
        return out_dir
    save_merged(model, tokenizer, out_dir, state=state)
    (out_dir / BASE_REF_FILE).write_text(
        json.dumps({"base_model": base_model, "model_path": base_model_path, "merged": True})
    )
    return out_dir
