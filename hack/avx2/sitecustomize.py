"""An AVX2-only CPU, as far as torch and vLLM can tell, on a CPU with AVX-512: for measuring the fp32 path
(`make demo`, `make test`) on a machine that has no AVX2-only CPU at hand. Not used by the product.

    PYTHONPATH=$PWD/hack/avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 make -o setup demo

The three variables cap torch's own kernels, oneDNN (so torch reports no native bf16) and MKL. vLLM picks its
CPU kernels (vllm._C for AVX512-BF16, _C_AVX512, _C_AVX2) from torch.cpu's CPUID checks, which no variable
caps; Python imports this module at start-up in every process that has it on its path, and it makes those
checks answer False once torch.cpu is imported, so vLLM loads _C_AVX2 as it does on an AVX2 CPU. It acts
only with ATEN_CPU_CAPABILITY=avx2, and it cannot slow an older core's clock or memory down: figures taken
this way are the dtypes and kernels an AVX2 CPU gets, on this CPU's cores."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_AVX512_CHECKS = (
    "_is_avx512_supported",
    "_is_avx512_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


def _answer_no() -> bool:
    return False


class _TorchCpuWithoutAvx512(importlib.abc.MetaPathFinder):
    """Finds torch.cpu as usual, then replaces its AVX-512/AMX checks once the module has run."""

    def find_spec(self, name, path, target=None):
        if name != "torch.cpu":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            for check in _AVX512_CHECKS:
                if hasattr(module, check):
                    setattr(module, check, _answer_no)

        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
    sys.meta_path.insert(0, _TorchCpuWithoutAvx512())
