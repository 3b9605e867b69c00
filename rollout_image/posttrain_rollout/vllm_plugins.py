"""A vLLM general plugin (entry point group `vllm.general_plugins` in pyproject.toml; vLLM calls it in each of
its processes, the API server, the engine core and the workers, before it loads a model).

What it fixes: vLLM 0.32's CPU backend compiles the model in DYNAMO_TRACE_ONCE mode with the plain inductor
backend and saves the AOT-compiled function in its compile cache (VLLM_CACHE_ROOT), but loading it back
calls `finalize_loading()` on the compiled callable, a method only its own piecewise backend's callables
have. Every start therefore failed with "Compiling model again due to a load failure ... 'function' object
has no attribute 'finalize_loading'" and compiled again: about 50-70 s of each SmolLM2 server start here.
torch's own loader has already restored such a callable whole, so there is nothing left to finalize: the
plugin gives these callables a finalize_loading that does nothing. Callables that have one keep theirs.

Once the cache loads, its key must name the machine: vLLM keys it on the model, its settings and versions,
not on the instruction sets the compiled C++ was built for, and a model compiled under one (a CPU without
AVX-512, or torch capped with ATEN_CPU_CAPABILITY) crashed the worker that loaded it under another
("malloc_consolidate(): invalid chunk size"). The plugin adds the CPU's flags and the vector ISA torch
compiles for to the key. The two go together: where the key cannot be extended, nothing is loaded.

A second plugin, fork_engine_core, starts vLLM's engine core by fork on a CPU backend whose one worker runs
inside it (see fork_engine_core); a third, eager_logprob_ranks, keeps the first request of a CPU server from
compiling the sampler's rank count (see eager_logprob_ranks)."""

from __future__ import annotations

import functools
import hashlib
import inspect
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_MARK = "_posttrain_patched"


def _nothing_to_finalize(*args: Any, **kwargs: Any) -> None:
    """torch restored the compiled callable completely; vLLM's piecewise finalization does not apply."""


def give_loaded_callables_finalize_loading(loaded: Any) -> Any:
    """The loaded AOT function, its compiled callable given a no-op finalize_loading when it has none."""
    compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
    if compiled is not None and not hasattr(compiled, "finalize_loading"):
        compiled.finalize_loading = _nothing_to_finalize
    return loaded


def machine_factor(torch_capability: str, vec_isa: str, cpuinfo: str) -> str:
    """What compiled code depends on beyond vLLM's own key: torch's dispatch level, the vector ISA inductor
    compiles for, and the CPU's instruction-set flags (hashed)."""
    flags = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = " ".join(sorted(value.split()))
            break
    digest = hashlib.sha256(flags.encode()).hexdigest()[:16]
    return f"posttrain-machine:{torch_capability}:{vec_isa}:{digest}"


def this_machine_factor() -> str:
    import torch
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        cpuinfo = ""
    return machine_factor(str(torch.backends.cpu.get_cpu_capability()), str(pick_vec_isa()), cpuinfo)


def load_aot_compiled_models() -> None:
    """Key vLLM's AOT compile cache on this machine too, then let it load; idempotent, as vLLM may call a
    plugin more than once in a process. Never raises (vLLM does not catch a plugin's errors): where torch or
    vLLM is laid out otherwise, their cache is left as it is."""
    try:
        _patch_compile_cache()
    except Exception as err:  # noqa: BLE001 (another torch or vLLM layout: start as vLLM would without us)
        log.warning("posttrain: vLLM's compile cache left as it is (%s: %s)", type(err).__name__, err)


def _patch_compile_cache() -> None:
    import torch.compiler
    from vllm.compilation import caching

    original_load = torch.compiler.load_compiled_function
    original_factors = caching.aot_compile_hash_factors
    if getattr(original_load, _MARK, False):
        return
    factor = this_machine_factor()

    @functools.wraps(original_factors)
    def aot_compile_hash_factors(vllm_config: Any) -> list[str]:
        return [*original_factors(vllm_config), factor]

    @functools.wraps(original_load)
    def load_compiled_function(*args: Any, **kwargs: Any) -> Any:
        return give_loaded_callables_finalize_loading(original_load(*args, **kwargs))

    setattr(load_compiled_function, _MARK, True)
    caching.aot_compile_hash_factors = aot_compile_hash_factors
    torch.compiler.load_compiled_function = load_compiled_function


# Set by posttrain_rollout.vllm_args.vllm_env where one CPU worker runs inside the engine core; "0" turns it off.
FORK_ENGINE_ENV = "POSTTRAIN_VLLM_FORK_ENGINE"


def fork_engine_core() -> None:
    """Start vLLM's engine core by fork instead of spawn, when FORK_ENGINE_ENV is "1" (vllm_env sets it on a
    CPU backend with one worker, which then runs inside the engine core). vLLM's CPU platform always asks for
    spawn, so the engine core imported vLLM and torch again before it did anything: ~18 s of a start on 2 AVX2
    cores, paid by every rollout server, `eval` and the demo. Spawn is for worker processes that bind their
    own OpenMP threads beside each other; here the only child is the engine core, forked from an API server
    that has run no torch kernel yet, and it sets its threads up as a spawned one would. Never raises."""
    if os.environ.get("POSTTRAIN_VLLM_FORK_ENGINE") != "1":  # FORK_ENGINE_ENV, by name for the docs' list
        return
    try:
        from vllm.platforms.cpu import CpuPlatform

        fork_after_config_check(CpuPlatform)
    except Exception as err:  # noqa: BLE001 (another vLLM layout: spawn, as vLLM would without us)
        log.warning("posttrain: vLLM's engine core is spawned as vLLM does (%s: %s)", type(err).__name__, err)


def fork_after_config_check(platform: type) -> None:
    """Wrap `platform.check_and_update_config` (a classmethod; the CPU platform's sets
    VLLM_WORKER_MULTIPROC_METHOD=spawn in it) so that the method is fork after it; idempotent."""
    original = inspect.getattr_static(platform, "check_and_update_config").__func__
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def check_and_update_config(cls: type, vllm_config: Any) -> None:
        original(cls, vllm_config)
        if os.environ.get("VLLM_WORKER_MULTIPROC_METHOD") != "fork":
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
            # under vLLM's logger, so that it is in vLLM's log beside its own lines
            logging.getLogger("vllm.posttrain").info("vLLM's engine core starts by fork (one CPU worker inside)")

    setattr(check_and_update_config, _MARK, True)
    platform.check_and_update_config = classmethod(check_and_update_config)


_counted: list[bool] = []


def count_at_least(x: Any, values: Any) -> Any:
    """vLLM's batched_count_greater_than, eagerly: per row of x, how many elements are >= that row's value
    (the rank of the sampled token among the vocabulary's logprobs). The same integers as the compiled one."""
    if not _counted:  # said at the first call: when the plugin loads, vLLM has not set its logging up yet
        _counted.append(True)
        logging.getLogger("vllm.posttrain").info("vLLM's logprob ranks are counted eagerly (CPU backend)")
    return (x >= values).sum(-1)


def eager_logprob_ranks() -> None:
    """On a CPU backend, count logprob ranks eagerly instead of through vLLM's torch.compile'd
    batched_count_greater_than. Every request that asks for logprobs (all of ours: the trainer's behaviour
    policy) runs it, and its first call traced and compiled it with inductor, hashing torch's and triton's
    sources for the cache key: 8-10 s of every server's first request on 2 AVX2 cores, even under
    --enforce-eager (vLLM keeps its sampler's compiled helpers then), and a C++ build where the inductor cache
    is cold. The compile saves a GPU a copy of the logits; on a CPU the eager comparison is a bool tensor of
    one step's logits. Idempotent; never raises."""
    try:
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        from vllm.v1.sample import sampler
        from vllm.v1.sample.ops import logprobs

        if sampler.batched_count_greater_than is count_at_least:
            return
        logprobs.batched_count_greater_than = sampler.batched_count_greater_than = count_at_least
    except Exception as err:  # noqa: BLE001 (another vLLM layout: vLLM's compiled count, as without us)
        log.warning("posttrain: vLLM's compiled logprob rank count left as it is (%s: %s)", type(err).__name__, err)
