"""LoRA hot-load (the GPU fast path) on real vLLM: a server started with --enable-lora takes
POST /v1/weights {format: lora}: vLLM's load_lora_adapter with load_inplace under one adapter name; requests
for the served model go to the adapter; a second adapter replaces the first in place; a full sync returns
to plain base weights. Own server (LoRA serving changes vLLM's compilation), so marked slow."""

from __future__ import annotations

import httpx
import pytest
from fixtures.vllm import STOP_GRACE_S, start_rollout_server
from posttrain.localhost import stop_group

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def greedy(url, model):
    r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": "The capital of", "max_tokens": 12,
                   "temperature": 0.0, "ignore_eos": True, "return_token_ids": True}, timeout=120)  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def adapter(model_dir, out, seed):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16)
    cfg = LoraConfig(r=8, lora_alpha=64, target_modules="all-linear", init_lora_weights=False)
    get_peft_model(base, cfg).save_pretrained(str(out))
    return out


def test_lora_hot_load_in_place(vllm_model_dir, tmp_path):
    proc, server = start_rollout_server(
        vllm_model_dir, tmp_path / "run", extra=["--enable-lora", "--max-lora-rank", "8"]
    )
    try:
        name = server.served_model_name
        base = greedy(server.url, name)
        a1, a2 = adapter(vllm_model_dir, tmp_path / "a1", 1), adapter(vllm_model_dir, tmp_path / "a2", 2)
        r = httpx.post(
            f"{server.url}/v1/weights", json={"path": str(a1), "format": "lora", "version": 1}, timeout=300
        )
        assert r.status_code == 200, r.text
        assert r.json()["format"] == "lora" and r.headers["X-Weight-Version"] == "1"
        out1 = greedy(server.url, name)
        assert out1 != base
        r = httpx.post(
            f"{server.url}/v1/weights", json={"path": str(a2), "format": "lora", "version": 2}, timeout=300
        )
        assert r.status_code == 200, r.text
        out2 = greedy(server.url, name)
        assert out2 != out1
        assert httpx.get(f"{server.url}/v1/weights", timeout=10).json()["lora"]
        r = httpx.post(f"{server.url}/v1/weights", json={"path": str(vllm_model_dir), "format": "full", "version": 3},
                       timeout=300)  # fmt: skip
        assert r.status_code == 200, r.text
        assert greedy(server.url, name) == base
    finally:
        stop_group(proc, STOP_GRACE_S)
