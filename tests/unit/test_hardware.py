"""The dtype decision table (posttrain.hardware.decide) and the knobs that feed it."""

from __future__ import annotations

import os

import pytest
from posttrain import hardware
from posttrain.hardware import Capability, decide, requested_precision

CPU_AMX = Capability(device="cpu", cpu_model="Intel Xeon (AMX)", cpu_capability="AVX512", cpu_bf16=True)
CPU_AVX2 = Capability(device="cpu", cpu_model="AMD EPYC", cpu_capability="AVX2", cpu_bf16=False)
GPU_BF16 = Capability(device="cuda", cpu_model="AMD EPYC", cpu_capability="AVX2", cpu_bf16=False,
                      cuda_name="NVIDIA H100", cuda_bf16=True)  # fmt: skip
GPU_FP16 = Capability(device="cuda", cpu_model="Intel Xeon (AMX)", cpu_capability="AVX512", cpu_bf16=True,
                      cuda_name="Tesla V100", cuda_bf16=False)  # fmt: skip

# (capability, request) -> (compute dtype, vLLM --dtype, warns)
TABLE = [
    (CPU_AMX, "auto", "bfloat16", "bfloat16", False),
    (CPU_AMX, "bf16", "bfloat16", "bfloat16", False),
    (CPU_AMX, "fp32", "float32", "bfloat16", False),
    (CPU_AMX, "force_bf16", "bfloat16", "bfloat16", False),
    (CPU_AVX2, "auto", "float32", "float32", False),
    (CPU_AVX2, "bf16", "float32", "float32", True),
    (CPU_AVX2, "fp32", "float32", "float32", False),
    (CPU_AVX2, "force_bf16", "bfloat16", "float32", True),
    (GPU_BF16, "auto", "bfloat16", "bfloat16", False),
    (GPU_BF16, "bf16", "bfloat16", "bfloat16", False),
    (GPU_BF16, "fp32", "float32", "bfloat16", False),
    (GPU_BF16, "force_bf16", "bfloat16", "bfloat16", False),
    (GPU_FP16, "auto", "float32", "float16", False),  # the GPU decides, not the host CPU's AMX
    (GPU_FP16, "bf16", "float32", "float16", True),
    (GPU_FP16, "fp32", "float32", "float16", False),
    (GPU_FP16, "force_bf16", "bfloat16", "float16", True),
]


@pytest.mark.parametrize(("cap", "request_", "compute", "vllm", "warns"), TABLE)
def test_decision_table(cap, request_, compute, vllm, warns):
    precision = decide(cap, request_)
    assert precision.compute == compute
    assert precision.bf16 == (compute == "bfloat16")
    assert precision.load == precision.sync == compute  # frozen weights and weight sync follow the compute
    assert precision.vllm == vllm
    assert (precision.warning is not None) == warns
    if warns:
        assert "\n" not in precision.warning  # one line
        assert ("force_bf16" in precision.warning) or ("forced" in precision.warning)
    assert request_ in precision.describe() and compute in precision.describe()


@pytest.mark.parametrize(("cap", "request_"), [(c, r) for c, r, *_ in TABLE])
def test_a_lora_policy_is_synced_and_served_in_float32_on_a_cpu(cap, request_):
    """The adapter's per-step change is below bf16's resolution once merged into bf16 weights (measured:
    98 % of a step's delta rounded away), so on a CPU a LoRA policy is synced and served in float32; the
    trainer's compute dtype and the frozen base's dtype do not change. GPUs keep their vLLM dtype."""
    plain, lora = decide(cap, request_), decide(cap, request_, lora_policy=True)
    assert (lora.compute, lora.load, lora.warning) == (plain.compute, plain.load, plain.warning)
    if cap.device == "cpu":
        assert lora.sync == lora.vllm == "float32"
        assert hardware.vllm_dtype(cap, lora_policy=True) == "float32"
    else:
        assert (lora.sync, lora.vllm) == (plain.sync, plain.vllm)


def test_lora_modes():
    assert hardware.is_lora_mode("lora") and hardware.is_lora_mode("QLoRA")
    assert not hardware.is_lora_mode("full") and not hardware.is_lora_mode(None)


def test_requested_precision_from_config_knobs():
    assert requested_precision() == "auto"
    assert requested_precision(bf16=None, force_bf16=False) == "auto"
    assert requested_precision(bf16=True) == "bf16"
    assert requested_precision(bf16=False) == "fp32"
    assert requested_precision(bf16=False, force_bf16=True) == "force_bf16"  # force wins
    with pytest.raises(ValueError):
        decide(CPU_AVX2, "half")


def test_warning_names_the_cpu_and_the_fix():
    warning = decide(CPU_AVX2, "bf16").warning
    assert "AMD EPYC" in warning and "AVX2" in warning and "fp32" in warning
    assert "parallelism.force_bf16 = true" in warning


def test_cpu_flags_and_model_name_from_cpuinfo():
    amx = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu avx2 avx512f amx_bf16 amx_tile\n"
    epyc = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse avx2 fma\n"
    zen4 = "model name\t: AMD EPYC 9654\nflags\t\t: avx2 avx512f avx512_bf16\n"
    assert hardware.cpu_flags_bf16(amx) and hardware.cpu_flags_bf16(zen4)
    assert not hardware.cpu_flags_bf16(epyc) and not hardware.cpu_flags_bf16("")
    assert hardware.cpu_model_name(amx) == "Intel(R) Xeon(R) Platinum 8480+"
    assert hardware.cpu_model_name(epyc) == "AMD EPYC"


def test_onednn_decides_native_bf16_where_torch_can_answer():
    """A CPU with the flags but a oneDNN that may not use them (capped, or built without the kernels) runs
    bf16 emulated: not native. The flags decide only where torch has no answer."""
    assert hardware.native_cpu_bf16(True, False) is True
    assert hardware.native_cpu_bf16(False, True) is False
    assert hardware.native_cpu_bf16(None, True) is True
    assert hardware.native_cpu_bf16(None, False) is False


def test_onednn_capped_at_avx2_means_fp32_on_any_cpu():
    """ONEDNN_MAX_CPU_ISA=AVX2 (what an AVX2-only CPU gives oneDNN) makes the real probe choose fp32, also on
    a CPU whose flags list AVX512-BF16."""
    import subprocess
    import sys

    code = "from posttrain import hardware; c = hardware.probe(); print(c.cpu_bf16, hardware.plan().compute)"
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "float32"], out.stdout + out.stderr


def test_probe_describes_this_machine():
    """The probe reads torch on this machine; whatever it finds, the plan for `auto` is consistent with it."""
    cap = hardware.probe()
    assert cap.device in ("cpu", "cuda") and cap.cpu_capability
    plan = hardware.plan()
    assert plan.bf16 == cap.native_bf16
    assert plan.vllm == hardware.vllm_dtype(cap)
    assert cap.cpu_model in cap.describe()


def test_trainer_parallel_config_reads_the_knobs():
    from posttrain_trainer.distributed import ParallelConfig

    cfg = ParallelConfig.from_config({"bf16": True, "force_bf16": True, "use_deepspeed": False})
    assert cfg.force_bf16 is True and "force_bf16" not in cfg.deepspeed_config
    assert cfg.precision().bf16  # forced: bf16 on any machine
    assert ParallelConfig.from_config({"bf16": False}).precision().bf16 is False
