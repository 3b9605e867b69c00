"""The vLLM plugins (posttrain_rollout.vllm_plugins): registered where vLLM looks for general plugins; the
compile cache's only adds what a loaded callable lacks; the engine core's fork comes after the platform's
spawn, only when switched on; a CPU server counts logprob ranks eagerly, the same integers as vLLM's
compiled count."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from types import SimpleNamespace

from posttrain_rollout import vllm_plugins


def test_registered_as_a_vllm_general_plugin():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("posttrain_aot_cache") == "posttrain_rollout.vllm_plugins:load_aot_compiled_models"
    assert found.get("posttrain_fork_engine") == "posttrain_rollout.vllm_plugins:fork_engine_core"
    assert found.get("posttrain_eager_logprob_ranks") == "posttrain_rollout.vllm_plugins:eager_logprob_ranks"


def test_a_callable_without_finalize_loading_gets_one_that_does_nothing():
    class Compiled:  # what torch's loader returns for the plain inductor backend: no finalize_loading
        def __call__(self, *args):
            return args

    loaded = SimpleNamespace(_artifacts=SimpleNamespace(compiled_fn=Compiled()))
    assert vllm_plugins.give_loaded_callables_finalize_loading(loaded) is loaded
    assert loaded._artifacts.compiled_fn.finalize_loading("any vllm config") is None


def test_a_callable_with_its_own_finalize_loading_keeps_it():
    calls = []
    compiled = SimpleNamespace(finalize_loading=lambda config: calls.append(config))
    loaded = SimpleNamespace(_artifacts=SimpleNamespace(compiled_fn=compiled))
    vllm_plugins.give_loaded_callables_finalize_loading(loaded)
    loaded._artifacts.compiled_fn.finalize_loading("config")
    assert calls == ["config"]


def test_the_machine_factor_names_the_dispatch_level_the_vector_isa_and_the_cpu_flags():
    zen4 = "model name\t: AMD EPYC\nflags\t\t: avx2 avx512f avx512_bf16\n"
    reordered = "model name\t: AMD EPYC\nflags\t\t: avx512_bf16 avx2 avx512f\n"
    avx2_only = "model name\t: AMD EPYC\nflags\t\t: avx2 fma\n"
    factor = vllm_plugins.machine_factor("AVX512", "avx512", zen4)
    assert factor.startswith("posttrain-machine:AVX512:avx512:")
    assert vllm_plugins.machine_factor("AVX512", "avx512", reordered) == factor
    assert vllm_plugins.machine_factor("AVX512", "avx512", avx2_only) != factor  # the same name, other CPU
    assert vllm_plugins.machine_factor("AVX2", "avx2", zen4) != factor  # torch capped at AVX2 on the same CPU


def test_loading_twice_wraps_once_and_keys_the_cache_on_this_machine():
    import torch.compiler
    from vllm.compilation import caching

    before_load, before_factors = torch.compiler.load_compiled_function, caching.aot_compile_hash_factors
    try:
        vllm_plugins.load_aot_compiled_models()
        wrapped = torch.compiler.load_compiled_function
        vllm_plugins.load_aot_compiled_models()
        assert torch.compiler.load_compiled_function is wrapped and wrapped is not before_load
        assert wrapped.__wrapped__ is before_load
        assert caching.aot_compile_hash_factors.__wrapped__ is before_factors
        factors = caching.aot_compile_hash_factors(SimpleNamespace(compute_hash=lambda: "config"))
        assert factors[-1] == vllm_plugins.this_machine_factor() and "config" in factors
    finally:
        torch.compiler.load_compiled_function = before_load
        caching.aot_compile_hash_factors = before_factors


def test_a_torch_or_vllm_laid_out_otherwise_is_left_as_it_is(monkeypatch):
    """vLLM calls the plugin without catching its errors: where what it patches is missing, vLLM must still
    start, with its cache untouched."""
    import torch.compiler
    from vllm.compilation import caching

    before_load = torch.compiler.load_compiled_function
    monkeypatch.delattr(caching, "aot_compile_hash_factors")
    vllm_plugins.load_aot_compiled_models()
    assert torch.compiler.load_compiled_function is before_load


class _SpawningPlatform:
    """What vLLM 0.32's CpuPlatform does in check_and_update_config: asks for spawn, whatever was set."""

    @classmethod
    def check_and_update_config(cls, vllm_config):
        vllm_config.append(cls.__name__)
        os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"


def test_the_engine_core_is_forked_after_the_platform_asks_for_spawn(monkeypatch):
    class Platform(_SpawningPlatform):
        pass

    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    vllm_plugins.fork_after_config_check(Platform)
    vllm_plugins.fork_after_config_check(Platform)  # vLLM loads plugins more than once: wrapped once
    seen = []
    Platform.check_and_update_config(seen)
    assert seen == ["Platform"]  # the platform's own check ran, once
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "fork"
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")
    _SpawningPlatform.check_and_update_config([])  # another class: untouched
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"


def test_the_fork_plugin_does_nothing_unless_switched_on(monkeypatch):
    wrapped = []
    monkeypatch.setattr(vllm_plugins, "fork_after_config_check", wrapped.append)
    monkeypatch.delenv(vllm_plugins.FORK_ENGINE_ENV, raising=False)
    vllm_plugins.fork_engine_core()
    monkeypatch.setenv(vllm_plugins.FORK_ENGINE_ENV, "0")
    vllm_plugins.fork_engine_core()
    assert wrapped == []
    monkeypatch.setenv(vllm_plugins.FORK_ENGINE_ENV, "1")
    vllm_plugins.fork_engine_core()
    assert [platform.__name__ for platform in wrapped] == ["CpuPlatform"]


def test_the_eager_rank_count_is_vllms_compiled_one():
    """Against the function vLLM compiles (its source, uncompiled: compiling it is the ~10 s this avoids)."""
    import torch
    from vllm.v1.sample.ops import logprobs as ops

    vllms = ops.batched_count_greater_than._torchdynamo_orig_callable

    generator = torch.Generator().manual_seed(0)
    logprobs = torch.randn(5, 1000, generator=generator).log_softmax(-1)
    logprobs[2, :10] = logprobs[2, 500]  # ties count as ranks above, as in vLLM
    sampled = logprobs.gather(-1, torch.tensor([[3], [999], [500], [0], [42]]))
    eager = vllm_plugins.count_at_least(logprobs, sampled)
    assert torch.equal(eager, vllms(logprobs, sampled))
    assert eager.dtype == torch.int64 and eager[2] >= 11


def test_a_cpu_backend_counts_ranks_eagerly_in_both_places_vllm_calls_it(monkeypatch):
    from vllm.platforms import current_platform
    from vllm.v1.sample import sampler
    from vllm.v1.sample.ops import logprobs

    compiled = logprobs.batched_count_greater_than
    monkeypatch.setattr(logprobs, "batched_count_greater_than", compiled)
    monkeypatch.setattr(sampler, "batched_count_greater_than", compiled)
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: False)
    vllm_plugins.eager_logprob_ranks()
    assert sampler.batched_count_greater_than is compiled  # a GPU keeps vLLM's compiled count
    monkeypatch.setattr(type(current_platform), "is_cpu", lambda self=None: True)
    vllm_plugins.eager_logprob_ranks()
    vllm_plugins.eager_logprob_ranks()
    assert sampler.batched_count_greater_than is vllm_plugins.count_at_least
    assert logprobs.batched_count_greater_than is vllm_plugins.count_at_least
