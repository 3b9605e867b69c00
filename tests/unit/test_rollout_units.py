"""posttrain_rollout pure parts: capture store, capture extraction, request preparation, vLLM argv/env,
reference parsing, the weight gate. No vLLM."""

from __future__ import annotations

import asyncio
import os

import pytest
from posttrain_rollout import reference, vllm_args, vllm_plugins
from posttrain_rollout.captures import CaptureStore, entries_from_response
from posttrain_rollout.server import Proxy, apply_thinking, prepare_request
from posttrain_rollout.weights import WeightGate, parse_s3_uri


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_capture_store_order_get_pop():
    store = CaptureStore()
    store.add("a", [{"i": 1}])
    store.add("a", [{"i": 2}, {"i": 3}])
    assert store.get("a") == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert store.get("missing") is None
    assert store.pop("a") == [{"i": 1}, {"i": 2}, {"i": 3}]
    assert store.get("a") is None and store.pop("a") is None


def test_capture_store_bounded_by_cids_oldest_written_first():
    store = CaptureStore(max_cids=2)
    store.add("a", [{}])
    store.add("b", [{}])
    store.add("a", [{}])  # a is now the most recently written
    store.add("c", [{}])
    assert store.get("b") is None
    assert store.get("a") is not None and store.get("c") is not None
    assert store.stats()["evicted_cids"] == 1


def test_capture_store_ttl_from_last_write():
    clock = Clock()
    store = CaptureStore(ttl_s=10, clock=clock)
    store.add("a", [{}])
    clock.t = 5
    store.add("b", [{}])
    clock.t = 9
    store.add("a", [{}])  # refreshes a
    clock.t = 16
    assert store.get("b") is None
    assert len(store.get("a")) == 2
    clock.t = 19.5
    assert store.get("a") is None
    assert len(store) == 0


def test_capture_store_entries_per_cid_keep_latest():
    store = CaptureStore(max_entries_per_cid=3)
    store.add("a", [{"i": i} for i in range(5)])
    assert [e["i"] for e in store.get("a")] == [2, 3, 4]
    assert store.stats()["dropped_entries"] == 2


def test_capture_store_rejects_bad_bounds():
    with pytest.raises(ValueError):
        CaptureStore(max_cids=0)


def test_entries_from_chat_response():
    body = {
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 1,
                "token_ids": [7],
                "finish_reason": "length",
                "logprobs": {"content": [{"token": "x", "logprob": -0.5}]},
            },
            {
                "index": 0,
                "token_ids": [5, 6],
                "finish_reason": "stop",
                "logprobs": {"content": [{"token": "a", "logprob": -1.0}, {"token": "b", "logprob": -2.0}]},
            },
        ],
    }
    entries = entries_from_response(body, chat=True, weight_version=3)
    assert entries == [
        {
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [5, 6],
            "logprobs": [-1.0, -2.0],
            "weight_version": 3,
            "finish_reason": "stop",
        },
        {
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [7],
            "logprobs": [-0.5],
            "weight_version": 3,
            "finish_reason": "length",
        },
    ]


def test_entries_from_completion_response():
    body = {
        "choices": [
            {
                "index": 0,
                "prompt_token_ids": [9, 8],
                "token_ids": [4],
                "finish_reason": "length",
                "logprobs": {"token_logprobs": [-0.25], "tokens": ["q"]},
            }
        ]
    }
    (entry,) = entries_from_response(body, chat=False, weight_version=0)
    assert entry["prompt_token_ids"] == [9, 8] and entry["completion_token_ids"] == [4]
    assert entry["logprobs"] == [-0.25]


def test_prepare_request_injects_only_for_captured_calls():
    chat = prepare_request({"messages": []}, chat=True, capture=True)
    assert chat["return_token_ids"] is True and chat["logprobs"] is True
    comp = prepare_request({"prompt": "x"}, chat=False, capture=True)
    assert comp["return_token_ids"] is True and comp["logprobs"] == 1
    kept = prepare_request({"prompt": "x", "logprobs": 5}, chat=False, capture=True)
    assert kept["logprobs"] == 5
    plain = prepare_request({"messages": []}, chat=True, capture=False)
    assert "return_token_ids" not in plain and "logprobs" not in plain


def test_thinking_mode_and_budget():
    body = apply_thinking({"thinking_mode": "think", "thinking_budget": 100, "max_tokens": 500})
    assert body == {"chat_template_kwargs": {"enable_thinking": True}, "max_tokens": 100}
    body = apply_thinking({"thinking_mode": "no_think", "thinking_budget": 100, "max_tokens": 500})
    assert body == {"chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 500}
    body = apply_thinking({"thinking_budget": 64})
    assert body == {"max_tokens": 64}
    assert apply_thinking({"max_tokens": 5}) == {"max_tokens": 5}


def test_vllm_serves_eagerly_on_a_cpu_unless_told_how_to_compile():
    """A cold torch.compile on a 2-core CPU costs minutes of start-up, decoding eagerly ~15 % more
    CPU per token: eager on a CPU backend, vLLM's own compile on a GPU, and a caller's compile flag wins."""
    assert vllm_args.cpu_eager(True) and not vllm_args.cpu_eager(False)
    assert "--enforce-eager" in vllm_args.vllm_argv("/m", 1, eager=True)
    assert "--enforce-eager" not in vllm_args.vllm_argv("/m", 1)
    for flag in (["--no-enforce-eager"], ["-O3"], ["--compilation-config", "{}"], ["-cc.mode=3"]):
        argv = vllm_args.vllm_argv("/m", 1, eager=True, extra=flag)
        assert "--enforce-eager" not in argv and argv[-len(flag) :] == flag
    assert vllm_args.vllm_argv("/m", 1, eager=True, extra=["--enforce-eager"]).count("--enforce-eager") == 1


def test_vllm_uses_32_token_blocks_on_a_cpu_so_that_short_prompts_share_a_prefix():
    """vLLM's CPU default of 128-token blocks never fills on an RL prompt (prefix caching shares whole blocks):
    32 on a CPU backend, vLLM's own on a GPU, and a caller's --block-size wins."""
    assert vllm_args.cpu_block_size(True) == 32 and vllm_args.cpu_block_size(False) is None
    argv = vllm_args.vllm_argv("/m", 1, block_size=32)
    assert argv[argv.index("--block-size") + 1] == "32"
    assert "--block-size" not in vllm_args.vllm_argv("/m", 1)
    for flag in (["--block-size", "64"], ["--block-size=64"]):
        argv = vllm_args.vllm_argv("/m", 1, block_size=32, extra=flag)
        assert "32" not in argv and argv[-len(flag) :] == flag


def test_vllm_argv_and_env(tmp_path):
    argv = vllm_args.vllm_argv(
        "/m",
        1234,
        served_model_name="n",
        max_model_len=512,
        tensor_parallel_size=2,
        limit_mm_per_prompt='{"image": 1}',
        enable_lora=True,
        max_lora_rank=16,
        dtype="bfloat16",
        python="py",
    )
    assert "--dtype" not in vllm_args.vllm_argv("/m", 1)  # no dtype given: the server's probe decides
    plain = vllm_args.vllm_argv("/m", 1)
    assert plain[plain.index("--logprobs-mode") + 1] == "processed_logprobs"  # the sampling distribution's
    assert vllm_args.vllm_argv("/m", 1, extra=["--logprobs-mode=raw_logprobs"]).count("--logprobs-mode") == 0
    assert plain[plain.index("--load-format") + 1] == "safetensors"  # never *.bin / *.pt (pickle)
    assert argv[:4] == ["py", "-m", "vllm.entrypoints.openai.api_server", "--model"]
    joined = " ".join(argv)
    for part in ("--host 127.0.0.1", "--port 1234", "--served-model-name n", "--max-model-len 512",
                 "--tensor-parallel-size 2", "--dtype bfloat16", "--enable-lora", "--max-lora-rank 16"):  # fmt: skip
        assert part in joined
    assert argv[argv.index("--limit-mm-per-prompt") + 1] == '{"image": 1}'
    with pytest.raises(ValueError):
        vllm_args.vllm_argv("/m", 1, limit_mm_per_prompt="{bad")
    env = vllm_args.vllm_env({"TMPDIR": "/elsewhere"}, tmp_path, cpu=True, ncpu=4, enable_lora=True)
    assert env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0-3"
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert env["TMPDIR"] == str(tmp_path / "tmp") and env["VLLM_CACHE_ROOT"].startswith(str(tmp_path))
    # inductor's generated code is cached beside vLLM's compile cache, not in the per-run TMPDIR
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(env["VLLM_CACHE_ROOT"])
    shared = vllm_args.vllm_env({"VLLM_CACHE_ROOT": "/cache/vllm"}, tmp_path, cpu=True)
    assert shared["TORCHINDUCTOR_CACHE_DIR"] == "/cache/vllm/torchinductor"
    assert (
        vllm_args.vllm_env({"VLLM_CPU_KVCACHE_SPACE": "4"}, tmp_path, cpu=True)["VLLM_CPU_KVCACHE_SPACE"]
        == "4"
    )
    assert "VLLM_CPU_KVCACHE_SPACE" not in vllm_args.vllm_env({}, tmp_path, cpu=False)


def test_one_cpu_worker_runs_inside_the_engine_process(tmp_path):
    """One worker on a CPU: vLLM's multiprocessing off (its CPU platform then keeps the single-process
    executor); several tensor-parallel workers, a GPU, or the user's own setting: left to vLLM."""
    assert vllm_args.vllm_env({}, tmp_path, cpu=True)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert vllm_args.vllm_env({}, tmp_path, cpu=True, tensor_parallel_size=1)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_args.vllm_env({}, tmp_path, cpu=True, tensor_parallel_size=2)
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in vllm_args.vllm_env({}, tmp_path, cpu=False)
    mine = vllm_args.vllm_env({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}, tmp_path, cpu=True)
    assert mine["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"


def test_the_engine_core_is_forked_where_one_cpu_worker_runs_inside_it(tmp_path):
    """The plugin's switch (vllm_plugins.fork_engine_core): on for one CPU worker, absent for tensor-parallel
    CPU workers and GPUs, and a user's "0" wins."""
    key = vllm_plugins.FORK_ENGINE_ENV
    assert vllm_args.vllm_env({}, tmp_path, cpu=True, tensor_parallel_size=1)[key] == "1"
    assert key not in vllm_args.vllm_env({}, tmp_path, cpu=True, tensor_parallel_size=2)
    assert key not in vllm_args.vllm_env({}, tmp_path, cpu=False)
    assert vllm_args.vllm_env({key: "0"}, tmp_path, cpu=True)[key] == "0"


def test_the_proxy_drops_idle_connections_before_vllm_closes_them():
    """vLLM's HTTP server closes a connection idle for 5 s (VLLM_HTTP_TIMEOUT_KEEP_ALIVE's default in vLLM 0.32):
    a pool that kept connections as long sent a weight sync on one that was being closed (ReadError)."""
    vllm_keep_alive_s = 5.0
    proxy = Proxy("http://127.0.0.1:9")
    assert proxy.http()._transport._pool._keepalive_expiry < vllm_keep_alive_s - 2


def test_reference_parsing():
    seqs = reference.parse_sequences(
        {"sequences": [{"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]}]}
    )
    assert seqs == [([1, 2], [3, 4])]
    req = reference.score_request("m", [1, 2], [3, 4])
    assert req["prompt"] == [1, 2, 3, 4] and req["prompt_logprobs"] == 0 and req["max_tokens"] == 1
    response = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    {"2": {"logprob": -1.0}},
                    {"3": {"logprob": -2.0}, "9": {"logprob": -0.1}},
                    {"4": {"logprob": -3.0}},
                ]
            }
        ]
    }
    assert reference.completion_logprobs(response, [1, 2], [3, 4]) == [-2.0, -3.0]
    for bad in ({}, {"sequences": [{"prompt_token_ids": []}]}, {"sequences": [{"prompt_token_ids": ["x"]}]}):
        with pytest.raises(reference.ScoreError):
            reference.parse_sequences(bad)
    with pytest.raises(reference.ScoreError):
        reference.completion_logprobs({"choices": [{"prompt_logprobs": [None, {}]}]}, [1], [3])


def test_parse_s3_uri():
    assert parse_s3_uri("s3://b/p/q/") == ("b", "p/q/")
    with pytest.raises(ValueError):
        parse_s3_uri("/local")


def test_weight_gate_waits_for_inflight_and_holds_new_requests():
    async def scenario():
        gate = WeightGate()
        order = []
        v = await gate.enter()
        assert v == 0

        async def sync():
            await gate.pause()
            order.append("paused")
            await asyncio.sleep(0.01)
            await gate.resume(1)
            order.append("resumed")

        async def late():
            await asyncio.sleep(0.005)
            version = await gate.enter()
            order.append(f"late@{version}")
            await gate.leave()

        task = asyncio.create_task(sync())
        late_task = asyncio.create_task(late())
        await asyncio.sleep(0.02)
        assert order == []  # the sync waits for the request in flight; the late request waits for the sync
        assert gate.paused
        order.append("inflight done")
        await gate.leave()
        await asyncio.gather(task, late_task)
        return order, gate.version

    order, version = asyncio.run(scenario())
    assert order == ["inflight done", "paused", "resumed", "late@1"]
    assert version == 1


def test_vllm_tmpdir_stays_short_enough_for_zmq_ipc_sockets(tmp_path):
    from posttrain_rollout.vllm_args import IPC_PATH_MAX, remove_fallback_tmp, vllm_env

    deep = tmp_path / ("d" * 90)
    env = vllm_env({}, deep, cpu=True)
    assert len(env["TMPDIR"]) + 37 <= IPC_PATH_MAX
    assert env["VLLM_CACHE_ROOT"].startswith(
        str(deep)
    )  # only the sockets move, caches stay in the run folder
    short = vllm_env({}, tmp_path / "r", cpu=True)
    assert short["TMPDIR"] == str(tmp_path / "r" / "tmp")
    # the fallback folder is removed when the server stops; the run folder's own tmp is left alone
    remove_fallback_tmp(env, deep)
    remove_fallback_tmp(short, tmp_path / "r")
    assert not os.path.exists(env["TMPDIR"])
    assert os.path.isdir(short["TMPDIR"])


@pytest.mark.parametrize("temperature", [0.6, 0.8, 1.0])
def test_reference_tempered_logprob_from_top_k(temperature):
    """Reference scoring at the sampling temperature from vLLM's raw top-20 prompt logprobs: against the exact
    log softmax(z / T) over a 50,000-token vocabulary with Zipf-like distributions (exponent 2: the top 20
    hold 96 % of the mass; exponent 1.2: half), the target inside and outside the top 20."""
    import torch

    vocab = 50_000
    for exponent, bound in ((2.0, 0.01), (1.2, 0.15)):
        torch.manual_seed(0)
        ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
        logits = -exponent * torch.log(ranks) + 0.5 * torch.randn(vocab, dtype=torch.float64)
        raw = torch.log_softmax(logits, -1)
        exact = torch.log_softmax(logits / temperature, -1)
        top = torch.topk(raw, reference.TOP_K).indices.tolist()
        errors = []
        for target in (top[0], top[7], int(torch.argsort(raw, descending=True)[300])):
            entry = {str(i): {"logprob": raw[i].item()} for i in top + [target]}
            got = reference.tempered_logprob(entry, target, temperature, vocab)
            errors.append(abs(got - exact[target].item()))
        assert max(errors) < (1e-9 if temperature == 1.0 else bound), (exponent, errors)
    assert reference.score_request("m", [1], [2], temperature)["prompt_logprobs"] == (
        0 if temperature == 1.0 else reference.TOP_K
    )
    assert reference.parse_temperature({"temperature": temperature}) == temperature
    with pytest.raises(reference.ScoreError, match="temperature"):
        reference.parse_temperature({"temperature": 0})


def test_tool_call_parser_follows_the_model_family(tmp_path):
    """synth's Crafter app asks for tool calls (tool_choice "required", a named function): vLLM needs a
    parser for them, the one of the model family's chat template."""
    import json as _json

    from posttrain_rollout.vllm_args import tool_call_args

    (tmp_path / "config.json").write_text(_json.dumps({"model_type": "qwen2"}))
    assert tool_call_args(tmp_path, env={}) == [
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--tool-strict-level", "parameter"]  # fmt: skip
    (tmp_path / "config.json").write_text(_json.dumps({"model_type": "llama"}))
    assert tool_call_args(tmp_path, env={}) == []
    assert "llama3_json" in tool_call_args(tmp_path, env={"POSTTRAIN_TOOL_CALL_PARSER": "llama3_json"})
    assert tool_call_args(tmp_path / "missing", env={}) == []
    (tmp_path / "config.json").write_text(_json.dumps({"model_type": "qwen3"}))
    assert tool_call_args(tmp_path, env={"POSTTRAIN_TOOL_CALL_PARSER": "none"}) == []
    # [vllm].tool_call_parser (the serve flag) wins over the environment and the family's default
    assert "pythonic" in tool_call_args(tmp_path, env={"POSTTRAIN_TOOL_CALL_PARSER": "none"}, parser="pythonic")
    assert tool_call_args(tmp_path, env={}, parser="none") == []


def test_the_trainer_names_why_a_cid_has_no_capture():
    from posttrain_trainer.capture_batches import missing_text, refusal_text

    refused = {"status": 400, "reason": "set it", "refused": 3}
    assert refusal_text(refused) == "vLLM refused 3 policy call(s): set it"
    assert missing_text("c1", refused) == "rollout server has no capture for cid c1: vLLM refused 3 policy call(s): set it"
    assert refusal_text({"message": "never seen"}) is None and refusal_text("not json") is None
    assert "did the task app keep ?cid=?" in missing_text("c1")


def test_cpu_prefills_whole_prompts_unless_the_caller_says():
    # a seeded request's partial prefill kills vLLM 0.32 on CPU (its generator cannot rewind)
    assert vllm_args.cpu_whole_prefills(True) and not vllm_args.cpu_whole_prefills(False)
    assert "--no-enable-chunked-prefill" in vllm_args.vllm_argv("/m", 1, whole_prefills=True)
    assert "--no-enable-chunked-prefill" not in vllm_args.vllm_argv("/m", 1)
    for flag in ("--enable-chunked-prefill", "--no-enable-chunked-prefill"):
        argv = vllm_args.vllm_argv("/m", 1, whole_prefills=True, extra=[flag])
        assert argv.count(flag) == 1 and argv.count("--no-enable-chunked-prefill") <= 1

