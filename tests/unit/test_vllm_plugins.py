"""The vLLM plugin that lets vLLM's CPU compile cache load (posttrain_rollout.vllm_plugins): registered where
vLLM looks for general plugins, and it only adds what a loaded callable lacks."""

from __future__ import annotations

from importlib.metadata import entry_points
from types import SimpleNamespace

from posttrain_rollout import vllm_plugins


def test_registered_as_a_vllm_general_plugin():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("posttrain_aot_cache") == "posttrain_rollout.vllm_plugins:load_aot_compiled_models"


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


def test_loading_twice_wraps_torch_once():
    import torch.compiler

    before = torch.compiler.load_compiled_function
    try:
        vllm_plugins.load_aot_compiled_models()
        wrapped = torch.compiler.load_compiled_function
        vllm_plugins.load_aot_compiled_models()
        assert torch.compiler.load_compiled_function is wrapped and wrapped is not before
        assert wrapped.__wrapped__ is before
    finally:
        torch.compiler.load_compiled_function = before
