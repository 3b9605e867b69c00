"""A vLLM general plugin (entry point group `vllm.general_plugins` in pyproject.toml; vLLM calls it in each of
its processes, the API server, the engine core and the workers, before it loads a model).

What it fixes: vLLM 0.32's CPU backend compiles the model in DYNAMO_TRACE_ONCE mode with the plain inductor
backend and saves the AOT-compiled function in its compile cache (VLLM_CACHE_ROOT), but loading it back
calls `finalize_loading()` on the compiled callable, a method only its own piecewise backend's callables
have. Every start therefore failed with "Compiling model again due to a load failure ... 'function' object
has no attribute 'finalize_loading'" and compiled again: about 50-70 s of each SmolLM2 server start here.
torch's own loader has already restored such a callable whole, so there is nothing left to finalize: the
plugin gives these callables a finalize_loading that does nothing. Callables that have one keep theirs."""

from __future__ import annotations

import functools
from typing import Any

_MARK = "_posttrain_finalize_tolerant"


def _nothing_to_finalize(*args: Any, **kwargs: Any) -> None:
    """torch restored the compiled callable completely; vLLM's piecewise finalization does not apply."""


def give_loaded_callables_finalize_loading(loaded: Any) -> Any:
    """The loaded AOT function, its compiled callable given a no-op finalize_loading when it has none."""
    compiled = getattr(getattr(loaded, "_artifacts", None), "compiled_fn", None)
    if compiled is not None and not hasattr(compiled, "finalize_loading"):
        compiled.finalize_loading = _nothing_to_finalize
    return loaded


def load_aot_compiled_models() -> None:
    """Wrap torch.compiler.load_compiled_function (what vLLM's cache loader calls); idempotent, as vLLM may
    call a plugin more than once in a process."""
    import torch.compiler

    original = torch.compiler.load_compiled_function
    if getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def load_compiled_function(*args: Any, **kwargs: Any) -> Any:
        return give_loaded_callables_finalize_loading(original(*args, **kwargs))

    setattr(load_compiled_function, _MARK, True)
    torch.compiler.load_compiled_function = load_compiled_function
