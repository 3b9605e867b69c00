"""What this machine computes fast, and the dtypes that follow from it: the one probe that the trainer, the
rollout server (vLLM's --dtype) and the local runner all ask.

Native bf16 means bf16 matrix multiplies in hardware: a CUDA GPU that reports bf16 support (Ampere and
newer), or a CPU with AVX512-BF16 or AMX, which torch's oneDNN reports through
`torch.ops.mkldnn._is_mkldnn_bf16_supported()`. Everywhere else torch emulates bf16, and that is slow: on an
AVX2 AMD EPYC a 1024x1024x1024 matmul took 14.6 ms in fp32 and 2,216 ms in bf16 (150x). So a config that
asks for bf16 (`parallelism.bf16 = true`) gets it only where it is native; elsewhere it gets fp32 and one
warning line. `parallelism.force_bf16 = true` keeps bf16 regardless (to reproduce a bf16 run bit for bit on
another machine, knowing it is slow there). Nothing set (`bf16` absent) means bf16 where native, else fp32.

A LoRA policy on a CPU is served in float32 even where bf16 is native: the adapter trains in fp32, and merged
into bf16 base weights for vLLM, its per-step change falls below bf16's resolution (8-bit mantissa). Measured
on the demo's adapter (SmolLM2-135M, r16, lr 2e-4, AMD EPYC AVX512-BF16): the bf16 rounding error was 98 % of
one step's merged delta and 76 % of the delta after 16 steps, so vLLM kept sampling an almost untrained policy
(the demo's mean_return 0.67 after 16 iterations in bf16 against 0.84 with an fp32 server). The trainer still
computes under bf16 autocast there; only the synced weights and vLLM's --dtype are float32. On a GPU vLLM
stays bf16 (fp32 would halve its throughput); sync the adapter itself there (weight_sync format "lora").

The decision (`decide`) is a pure function of the capability and the request; `probe()` reads this machine
and `plan()` joins the two. Importing this module imports no torch: the operator uses none of it."""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# /proc/cpuinfo flags that mean bf16 matrix multiplies in hardware (x86).
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class Capability:
    """The compute device of this process and what it does natively."""

    device: str  # "cpu" | "cuda"
    cpu_model: str
    cpu_capability: str  # torch's dispatch level: "AVX2", "AVX512", "DEFAULT", ...
    cpu_bf16: bool
    cuda_name: str | None = None
    cuda_bf16: bool = False

    @property
    def native_bf16(self) -> bool:
        return self.cuda_bf16 if self.device == "cuda" else self.cpu_bf16

    def describe(self) -> str:
        cpu = f"cpu {self.cpu_model} (torch {self.cpu_capability}, native bf16: {_yes(self.cpu_bf16)})"
        if self.device == "cuda":
            return f"cuda {self.cuda_name} (native bf16: {_yes(self.cuda_bf16)}); {cpu}"
        return cpu


@dataclass(frozen=True)
class Precision:
    """The dtypes of one run. `compute` is the autocast dtype (None: plain fp32); weights that train stay
    fp32 (master weights) whatever `load` says, `load` is the dtype of frozen weights (a LoRA base)."""

    compute: str  # "bfloat16" | "float32"
    load: str  # dtype of frozen (non-trained) weights when loaded
    sync: str  # dtype of the full weights written for vLLM (weight sync) and of merged exports
    vllm: str  # vLLM --dtype
    requested: str  # "auto" | "bf16" | "fp32" | "force_bf16"
    warning: str | None = None

    @property
    def bf16(self) -> bool:
        return self.compute == "bfloat16"

    def describe(self) -> str:
        autocast = "bf16 autocast" if self.bf16 else "fp32 (no autocast)"
        return (
            f"dtypes ({self.requested}): compute {autocast}, trained weights float32, frozen weights {self.load}, "
            f"weight sync {self.sync}, vLLM --dtype {self.vllm}"
        )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def requested_precision(bf16: Any = None, force_bf16: Any = None) -> str:
    """A config's `parallelism.bf16` / `parallelism.force_bf16` -> "auto" | "bf16" | "fp32" | "force_bf16"."""
    if force_bf16:
        return "force_bf16"
    if bf16 is None:
        return "auto"
    return "bf16" if bool(bf16) else "fp32"


def decide(cap: Capability, requested: str = "auto", lora_policy: bool = False) -> Precision:
    """The decision table (pure):

    | native bf16 | requested  | compute | warning                               |
    |-------------|------------|---------|---------------------------------------|
    | yes         | auto, bf16 | bf16    |                                       |
    | no          | auto       | fp32    |                                       |
    | no          | bf16       | fp32    | "bf16 asked, not native: fp32"        |
    | any         | fp32       | fp32    |                                       |
    | any         | force_bf16 | bf16    | when not native: "forced, emulated"   |

    vLLM follows the hardware, not the request (the rollout server has no training config): bfloat16 where
    bf16 is native, else float32 on a CPU and float16 on a GPU without bf16. Weight sync writes the dtype
    the trainer computes in (vLLM casts on load); frozen weights load in it too. `lora_policy` (the served
    model is a base plus a trained LoRA merged at each sync): on a CPU, weight sync and vLLM in float32 (see
    the module docstring)."""
    if requested not in ("auto", "bf16", "fp32", "force_bf16"):
        raise ValueError(f"unknown precision request {requested!r}")
    native = cap.native_bf16
    warning = None
    if requested == "force_bf16":
        bf16 = True
        if not native:
            warning = (
                f"bf16 forced (parallelism.force_bf16) on {_where(cap)} without native bf16: "
                "emulated, expect it to be many times slower than fp32"
            )
    elif requested == "fp32":
        bf16 = False
    else:
        bf16 = native
        if requested == "bf16" and not native:
            warning = (
                f"parallelism.bf16 = true but {_where(cap)} has no native bf16: training in fp32 "
                "(set parallelism.force_bf16 = true to insist)"
            )
    compute = "bfloat16" if bf16 else "float32"
    return Precision(
        compute=compute,
        load=compute,
        sync="float32" if lora_policy and cap.device == "cpu" else compute,
        vllm=vllm_dtype(cap, lora_policy),
        requested=requested,
        warning=warning,
    )


def vllm_dtype(cap: Capability, lora_policy: bool = False) -> str:
    """vLLM's --dtype for this capability; float32 on a CPU for a LoRA policy (see the module docstring)."""
    if lora_policy and cap.device == "cpu":
        return "float32"
    if cap.native_bf16:
        return "bfloat16"
    return "float16" if cap.device == "cuda" else "float32"


def _where(cap: Capability) -> str:
    if cap.device == "cuda":
        return f"this GPU ({cap.cuda_name})"
    return f"this CPU ({cap.cpu_model}, torch {cap.cpu_capability})"


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The CPU's marketing name from /proc/cpuinfo (else platform.processor())."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_label(cpuinfo: str | None = None) -> str:
    """The model name with the CPU family and model ("AMD EPYC (family 25 model 17)"): a VM's model name alone
    is often just the vendor's brand, and figures must name the CPU they were measured on."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = cpu_model_name(cpuinfo)
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']} model {fields['model']})"
    return name


def cpu_flags_bf16(cpuinfo: str | None = None) -> bool:
    """True when /proc/cpuinfo lists AVX512-BF16 or AMX-BF16."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            flags = set(value.split())
            return any(flag in flags for flag in NATIVE_BF16_CPU_FLAGS)
    return False


def native_cpu_bf16(mkldnn_bf16: bool | None, flags_bf16: bool) -> bool:
    """Whether bf16 matrix multiplies run natively here. torch's oneDNN answer decides where torch can give
    one: it runs them, and it says no where the CPU has the flags but oneDNN may not use them
    (ONEDNN_MAX_CPU_ISA=AVX2, a build without the kernels); there bf16 is emulated, ~150x slower than fp32.
    The CPU flags decide only where torch cannot answer."""
    return mkldnn_bf16 if mkldnn_bf16 is not None else flags_bf16


@functools.lru_cache(maxsize=1)
def probe() -> Capability:
    """This process's device: CUDA when torch sees a GPU, else the CPU (bf16 per native_cpu_bf16)."""
    import torch

    try:
        mkldnn_bf16: bool | None = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        mkldnn_bf16 = None
    cpu = {
        "cpu_model": cpu_model_name(),
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cpu_bf16": native_cpu_bf16(mkldnn_bf16, cpu_flags_bf16()),
    }
    if torch.cuda.is_available():
        return Capability(
            device="cuda",
            cuda_name=torch.cuda.get_device_name(),
            cuda_bf16=bool(torch.cuda.is_bf16_supported()),
            **cpu,
        )
    return Capability(device="cpu", **cpu)


def plan(bf16: Any = None, force_bf16: Any = None, lora_policy: bool = False) -> Precision:
    """decide() for this machine and a config's parallelism.bf16 / parallelism.force_bf16."""
    return decide(probe(), requested_precision(bf16, force_bf16), lora_policy)


def is_lora_mode(trainer_mode: Any) -> bool:
    """Whether a [model].trainer_mode trains an adapter on a frozen base (lora, qlora)."""
    return str(trainer_mode or "").lower() in ("lora", "qlora")


def torch_dtype(name: str):
    import torch

    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}[name]


def main() -> int:
    """`python -m posttrain.hardware`: this machine's capability and the dtypes an `auto` run gets."""
    print(probe().describe())
    print(plan().describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
