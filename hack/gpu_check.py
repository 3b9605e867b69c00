"""The trainer's CUDA paths on one GPU: what the CPU suite cannot run. Not a test (CI has no GPU).

Checks, each printed PASS/FAIL with its figures and written to OUT/gpu_check.json:
- probe: posttrain.hardware on this GPU: device cuda, native bf16, and the dtypes an `auto` run gets
  (bf16 autocast, vLLM --dtype bfloat16, a LoRA policy synced in bf16), fp32 when a config asks for it.
- gspo_*: three GSPO updates (tests/integration/rl_update_worker.py) under torchrun on the GPU (NCCL):
  fp32 on the GPU against the same updates on this machine's CPU (gloo); FSDP2 fp32 against the plain
  engine; bf16 autocast and FSDP2 bf16 (finite losses, weights moved); FSDP2 bf16 resumed from its full
  state after the second update against the uninterrupted run; the KL to a frozen reference exactly 0 at
  step 0 under FSDP2 bf16.
- sft_*: `python -m posttrain_trainer sft` on the tiny model and a toy chat task, full fine-tune, LoRA and
  (where bitsandbytes is installed) QLoRA, each also on this machine's CPU: the held-out loss falls (full
  fine-tune: by >= 50 %, LoRA and QLoRA: by >= 10 %) and ends within 0.15 of the CPU run's, and the
  trainer's own log names the GPU and bf16; full fine-tune under torchrun (NCCL) falls by >= 50 % to < 2.0.

`python hack/gpu_check.py OUT [--model DIR]` with PYTHONPATH=operator:trainer_image (the tiny model is
built under DIR, default .models/tiny-random-qwen2, unless it is there). Exit 1 when a check fails."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "integration" / "rl_update_worker.py"
SFT_TEST = REPO / "tests" / "integration" / "test_trainer_sft.py"


def sft_helpers():
    """make_dataset / make_job / report_lines of the CPU SFT test, so that both run the same job."""
    spec = importlib.util.spec_from_file_location("posttrain_sft_test", SFT_TEST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(cmd: list[str], env: dict[str, str] | None = None, timeout: int = 300) -> tuple[int, str, float]:
    started = time.monotonic()
    out = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    return out.returncode, out.stdout + out.stderr, time.monotonic() - started


def torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *args]


def worker(out: Path, engine: str, *flags: str, cpu: bool = False) -> tuple[dict | None, str]:
    env = {"OMP_NUM_THREADS": "4"}
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    rc, log, _ = run(torchrun(str(WORKER), str(out), engine, *flags), env)
    if rc != 0:
        return None, log[-3000:]
    import torch

    return torch.load(out, weights_only=False), log[-400:]


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def moved(result: dict) -> float:
    return max_diff(result["params"], result["initial"])


class Checks:
    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def record(self, name: str, ok: bool, **figures: Any) -> None:
        self.results.append({"check": name, "ok": bool(ok), **figures})
        shown = {k: v for k, v in figures.items() if k != "log"}
        print(f"{'PASS' if ok else 'FAIL'} {name}: {json.dumps(shown, default=str)}", flush=True)
        if not ok and figures.get("log"):
            print(figures["log"], flush=True)


def check_probe(checks: Checks) -> None:
    from posttrain import hardware

    cap = hardware.probe()
    auto, lora, fp32 = hardware.plan(), hardware.plan(lora_policy=True), hardware.plan(bf16=False)
    ok = (
        cap.device == "cuda" and cap.cuda_bf16 and auto.compute == "bfloat16" and auto.vllm == "bfloat16"
        and lora.sync == "bfloat16" and lora.vllm == "bfloat16" and fp32.compute == "float32"
    )  # fmt: skip
    checks.record("probe", ok, capability=cap.describe(), auto=auto.describe(), lora=lora.describe(),
                  fp32=fp32.describe())  # fmt: skip


def compare(checks: Checks, name: str, run: dict | None, log: str, against: dict, loss_tol: float,
            param_tol: float) -> None:
    """Record whether `run` (None: it failed, see log) ends where `against` ends: losses and weights."""
    if run is None:
        checks.record(name, False, log=log)
        return
    loss_diff = max(abs(a - b) for a, b in zip(run["losses"], against["losses"], strict=True))
    param_diff = max_diff(run["params"], against["params"])
    checks.record(name, loss_diff <= loss_tol and param_diff <= param_tol and moved(run) > 1e-3,
                  losses=run["losses"], losses_against=against["losses"], loss_diff=loss_diff,
                  param_diff=param_diff, moved=moved(run), engine=run["engine"])  # fmt: skip


def check_gspo(checks: Checks, out: Path) -> None:
    cpu, cpu_log = worker(out / "cpu_fp32.pt", "ddp", cpu=True)
    if cpu is None:
        checks.record("gspo_fp32_gpu_vs_cpu", False, log=cpu_log)
        return
    gpu, log = worker(out / "gpu_fp32.pt", "ddp")
    compare(checks, "gspo_fp32_gpu_vs_cpu", gpu, log, cpu, 1e-4, 1e-4)
    if gpu is not None:
        fsdp, log = worker(out / "fsdp_fp32.pt", "fsdp")
        compare(checks, "gspo_fsdp2_fp32_vs_plain", fsdp, log, gpu, 1e-5, 5e-5)

    for name, engine in (("gspo_bf16", "ddp"), ("gspo_fsdp2_bf16", "fsdp")):
        result, log = worker(out / f"{name}.pt", engine, "bf16")
        ok = result is not None and all(math.isfinite(x) for x in result["losses"]) and moved(result) > 1e-3
        checks.record(
            name, ok, **({"losses": result["losses"], "moved": moved(result)} if result else {"log": log})
        )
    if result is not None:  # FSDP2 bf16 resumed from its full state after the second update
        resumed, log = worker(out / "fsdp_bf16_resume.pt", "fsdp", "bf16", "resume")
        compare(checks, "gspo_fsdp2_bf16_resume", resumed, log, result, 1e-6, 1e-6)

    kl, log = worker(out / "kl.pt", "fsdp", "bf16", "beta")
    checks.record("gspo_fsdp2_bf16_kl_step0", kl is not None and kl["kl"][0] == 0.0,
                  **({"kl": kl["kl"]} if kl else {"log": log}))  # fmt: skip


def sft_run(
    helpers,
    model: Path,
    out: Path,
    name: str,
    data: tuple[Path, Path],
    training: dict,
    hp: dict,
    *,
    torchrun_nccl: bool = False,
    cpu: bool = False,
) -> dict[str, Any]:
    """One SFT job on the GPU (or this machine's CPU): rc, held-out losses, the trainer's own device and
    dtype lines, its last tokens/s, seconds."""
    validation = {"enabled": True, "evaluation_strategy": "steps", "eval_steps": 32,
                  "metric_for_best_model": "val.loss"}  # fmt: skip
    job_path, _ = helpers.make_job(out / name, model, *data, hp=hp, training={**training, "validation": validation},
                                   name=name)  # fmt: skip
    args = ["-m", "posttrain_trainer", "sft", "--config", str(job_path)]
    env = {
        "OMP_NUM_THREADS": "4",
        "TOKENIZERS_PARALLELISM": "false",
        **({"CUDA_VISIBLE_DEVICES": ""} if cpu else {}),
    }
    rc, log, seconds = run(torchrun(*args) if torchrun_nccl else [sys.executable, *args], env)
    lines = helpers.report_lines(out / name / "report.jsonl")
    speeds = [line["progress"]["tokensPerSecond"] for line in lines
              if "tokensPerSecond" in line.get("progress", {})]  # fmt: skip
    return {
        "rc": rc,
        "heldout_loss": [round(line["eval_loss"], 4) for line in lines if line.get("event") == "evaluation"],
        "machine": [
            line
            for line in log.splitlines()
            if line.startswith(("[posttrain] cpu", "[posttrain] cuda", "[posttrain] dtypes"))
        ][:2],
        "tokens_per_s": round(speeds[-1]) if speeds else None,
        "seconds": round(seconds, 1),
        "log": log[-3000:],
    }


def check_sft(checks: Checks, out: Path, model: Path, wanted=lambda name: True) -> None:
    """Each job on the GPU and again on this machine's CPU: it learns on the GPU, under bf16, and ends where
    the CPU run ends (held-out loss within 0.15)."""
    helpers = sft_helpers()
    data = helpers.make_dataset(out / "sft-data")
    hp = {"n_epochs": 2, "batch_size": 8, "learning_rate": 3e-3, "warmup_ratio": 0.1, "sequence_length": 128}
    variants = (  # name, training, hyperparameters, least relative drop of the held-out loss
        ("sft_full", {"mode": "full_finetune"}, hp, 0.5),
        ("sft_lora", {"mode": "lora", "lora": {"r": 8, "alpha": 16, "dropout": 0.0}},
         {**hp, "learning_rate": 1e-2}, 0.1),
    )  # fmt: skip
    if importlib.util.find_spec("bitsandbytes") is None:
        print("SKIP sft_qlora: bitsandbytes is not installed", flush=True)
    else:  # the 4-bit NF4 base through bitsandbytes' CUDA kernels (its CPU backend for the CPU run)
        qlora = {"mode": "qlora", "use_qlora": True,
                 "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": ["all-linear"]}}  # fmt: skip
        variants = (*variants, ("sft_qlora", qlora, {**hp, "learning_rate": 1e-2}, 0.1))
    for name, training, params, least_drop in [v for v in variants if wanted(v[0])]:
        gpu = sft_run(helpers, model, out, name, data, training, params)
        cpu = sft_run(helpers, model, out, f"{name}_cpu", data, training, params, cpu=True)
        losses, cpu_losses = gpu["heldout_loss"], cpu["heldout_loss"]
        ok = (
            gpu["rc"] == 0 and cpu["rc"] == 0 and len(losses) >= 2 and len(cpu_losses) >= 2
            and losses[-1] <= (1 - least_drop) * losses[0]
            and abs(losses[-1] - cpu_losses[-1]) <= 0.15
            and any("cuda" in line for line in gpu["machine"]) and any("bf16 autocast" in line for line in gpu["machine"])
        )  # fmt: skip
        log = gpu.pop("log") + cpu.pop("log")
        checks.record(name, ok, gpu=gpu, cpu=cpu, log=log)
    if not wanted("sft_full_torchrun_nccl"):
        return
    nccl = sft_run(
        helpers, model, out, "sft_full_torchrun_nccl", data, {"mode": "full_finetune"}, hp, torchrun_nccl=True
    )
    losses = nccl["heldout_loss"]
    ok = nccl["rc"] == 0 and len(losses) >= 2 and losses[-1] <= 0.5 * losses[0] and losses[-1] < 2.0
    checks.record("sft_full_torchrun_nccl", ok, **nccl)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", type=Path, default=REPO / ".models" / "tiny-random-qwen2")
    parser.add_argument("--only", default="", help="run only the checks whose names start with these (comma-separated)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch
    from posttrain.modelzoo import build_tiny_model

    print(f"torch {torch.__version__}, cuda {torch.version.cuda}, "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}", flush=True)  # fmt: skip
    prefixes = tuple(p for p in args.only.split(",") if p)

    def wanted(name: str) -> bool:
        return not prefixes or name.startswith(prefixes)

    checks = Checks()
    if wanted("probe"):
        check_probe(checks)
    if wanted("gspo"):
        check_gspo(checks, args.out)
    check_sft(checks, args.out, build_tiny_model(args.model), wanted)
    (args.out / "gpu_check.json").write_text(json.dumps(checks.results, indent=1, default=str))
    failed = [r["check"] for r in checks.results if not r["ok"]]
    print(
        f"{len(checks.results) - len(failed)}/{len(checks.results)} checks passed"
        + (f"; failed: {failed}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
