"""One whole RL iteration (rollouts, update, weight sync) of posttrain against TRL's GRPOTrainer, in the same
process, interleaved (TRL iteration k, posttrain iteration k, TRL k + 1, ...), on the same model
(SmolLM2-135M-Instruct from posttrain.modelzoo), the same task and reward (the bundled math task app,
examples/taskapps/math/app.py: its problems for the same seeds, its score), the same batch (--prompts x
--group samples, temperature 1, at most --max-tokens new tokens), the same update (GSPO sequence ratio, clip
3e-4/4e-4, beta 0, --minibatches optimizer steps per iteration, every sequence trained, full fine-tuning,
AdamW at --lr) and the same precision (posttrain.hardware's decision, printed).

posttrain: the `posttrain train --local` machinery (posttrain.local.runner.LocalRun: embedded S3, the math
task app, the policy's rollout server = vLLM behind posttrain_rollout, the job file), with the trainer's
RLRun driven in this process instead of under torchrun. One iteration = RLRun.step(): rollouts through the
task app (vLLM samples, the app scores), GSPO update, weight sync to the rollout server (safetensors written,
vLLM reloads). No evaluation, no checkpoint.

TRL: GRPOTrainer with use_vllm=True, vllm_mode="server" against `trl vllm-serve` first ("server"), then
against the vLLM command `trl vllm-serve` runs, started as vLLM's own OpenAI server module ("server-vllm";
TRL's deprecation note says to run vLLM directly). Whichever cannot run prints its error, and the closest
set-up that runs is used: vllm_mode="colocate" (vLLM inside the trainer process, weights loaded in place;
one weight sync is tried before it counts as running), else TRL's own transformers generate
(use_vllm=False). Its reward function scores with the task app's own make_problem/score. One iteration =
one generation batch: from Trainer's on_step_begin of its first optimizer step to on_step_end of its last;
that includes the weight sync of the previous update (TRL syncs before generating), the generation, the
rewards and the update.
vllm_importance_sampling_correction is off (posttrain, by default, recomputes old logprobs without it).

Printed: per side the median and spread (min, IQR, max) of the seconds per iteration over the timed repeats
(the first iteration of each side is the warm-up), the same for sampled completion tokens per second of the
whole iteration (tokens counted from what each side trained on: posttrain's policy_tokens, TRL's
completion_mask), the median time per phase, and the ratio of the medians. Server start-up is not timed.

--async: the demo's job (examples/demo/rl.toml, 14 iterations) with [training] async_depth 0 (today's serial
loop) and async_depth 1, interleaved (sync, async, sync, async, ...), --runs times each, in this process
against one set of `posttrain train --local` services; each run starts from the base weights (pushed to the
rollout server as version 0) with trainer seed --seed-base + run (the same for both modes of a run; the
rollout server's sampling seed is the TOML's). The rollout server (vLLM, the proxy, the task app) runs on core 0
and the trainer (this process) on core 1 (os.sched_setaffinity; vLLM's OMP threads bound to core 0), so that
on 2 cores sampling and update can overlap. Per run: training wall seconds (the 14 iterations, without the
final evaluation), iterations per hour, the mean idle share of the trainer and of the rollout server per
iteration (the trainer's metrics), the mean version lag and the stale rollouts dropped, and the held-out
accuracy (the demo's greedy evaluation on 128 held-out problems after the last iteration). Then the ratios
async/sync of the medians; the last line is one JSON object: iterations_per_hour_ratio, held_out_sync,
held_out_async (one per run), runs, cpu, and the per-run records.

Not a test: `make bench` or `.venv/bin/python hack/bench_rl_iteration.py [--repeats 5] [--trl-mode auto]`;
`.venv/bin/python hack/bench_rl_iteration.py --async [--runs 5]` (about 4-5 min a run on 2 cores)."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

from abtiming import Series, ratio_of_medians, spread_line, uptime
from trl_gspo import gspo_grpo_config

REPO = Path(__file__).resolve().parents[1]
MATH_APP = REPO / "examples" / "taskapps" / "math" / "app.py"
ENV_CONFIG = {"difficulty": "medium"}
EPS_LOW, EPS_HIGH = 3e-4, 4e-4
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def math_app():
    spec = importlib.util.spec_from_file_location("posttrain_bench_math_app", MATH_APP)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rl_toml(args, iterations: int) -> str:
    samples = args.prompts * args.group
    return f"""
[algorithm]
type = "online"
method = "policy_gradient"
variety = "gspo"

[compute]
gpu_type = "CPU"
gpu_count = 2

[compute.topology]
type = "single_node_split"
gpus_for_vllm = 1
gpus_for_training = 1
gpus_for_ref = 0
reference_placement = "none"

[vllm]
max_model_len = 512

[model]
base = "HuggingFaceTB/SmolLM2-135M-Instruct"
trainer_mode = "full"
label = "bench-rl-iteration"

[rollout]
env_name = "math"
policy_name = "math-single-step"
max_turns = 1
episodes_per_batch = {samples}
max_concurrent_rollouts = {samples}
batches_per_step = 1

[rollout.env_config]
difficulty = "{ENV_CONFIG["difficulty"]}"

[rollout.policy_config]
temperature = 1.0
top_p = 1.0
max_tokens = {args.max_tokens}

[training]
num_epochs = 1
iterations_per_epoch = {iterations}
max_turns = 1
batch_size = {args.prompts}
group_size = {args.group}
learning_rate = {args.lr}
lr_scheduler = "constant"
num_minibatches = {args.minibatches}
micro_batch = {samples // args.minibatches}
skip_zero_advantage = false
log_interval = 1
weight_sync_interval = 1
"""


class Posttrain:
    """`posttrain train --local`'s services (S3, task app, rollout server, job file) and RLRun in-process."""

    def __init__(self, args, work: Path, stack: contextlib.ExitStack):
        from posttrain.api import convert
        from posttrain.api.config import normalized_config
        from posttrain.local.processes import ProcessSet
        from posttrain.local.runner import LocalOptions, LocalRun

        config_path = work / "bench-rl-iteration.toml"
        # two more iterations than run: RLRun syncs after every iteration but the last of its total
        config_path.write_text(rl_toml(args, args.repeats + 3))
        _, config, warnings = convert.load(
            config_path.read_text(), kind="rl", file=str(config_path), model=None
        )
        for warning in warnings:
            print(f"[posttrain] config warning: {warning}", flush=True)
        opts = LocalOptions(kind="rl", config_path=config_path, config=normalized_config(config),
                            name="bench-rl-iteration", runs_dir=args.runs_dir)  # fmt: skip
        run = LocalRun(opts)
        run.check_inputs()
        run.procs = stack.enter_context(ProcessSet(run.run_dir / "pids.json"))
        stack.callback(lambda: run.s3 is not None and run.s3.stop())
        started = time.monotonic()
        run.start_storage()
        run.verify()
        job_path = run.provision()
        self.startup_seconds = time.monotonic() - started
        print(
            f"[posttrain] services up in {self.startup_seconds:.0f} s; run folder {run.run_dir}", flush=True
        )
        os.environ.update(run.child_env)  # S3, the task app's key, the rollout server's token, the S3 cache
        from posttrain.api.jobfile import load_jobfile
        from posttrain_trainer.rl import RLRun
        from posttrain_trainer.rollouts import RolloutLoop

        loop = stack.enter_context(RolloutLoop())
        self.rl = RLRun(load_jobfile(job_path), loop)
        self.rl.connect()
        self.run = run

    def iteration(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.rl.step()
        seconds = time.perf_counter() - started
        record = self.rl.history[-1]
        return {
            "seconds": seconds,
            "tokens": int(record["policy_tokens"]),
            "mean_reward": record["mean_return"],
            "rollout": record["rollout_seconds"],
            "update": record["update_seconds"],
            "sync": record.get("weight_sync_seconds") or 0.0,
            "failed_rollouts": record["failed_rollouts"],
        }


def wait_health(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with code {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(f"not healthy after {timeout:.0f} s")


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def error_text(err: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(err), err)).strip()


class TRLSide:
    """TRL's GRPOTrainer on the math task; build() tries the vLLM modes in order."""

    def __init__(self, args, model_dir: Path, work: Path, precision, stack: contextlib.ExitStack):
        self.args, self.model_dir, self.work, self.precision, self.stack = (
            args,
            model_dir,
            work,
            precision,
            stack,
        )
        self.attempts: list[dict[str, Any]] = []
        self.stop_server = None
        from posttrain_rollout import vllm_args

        self.vllm_env = vllm_args.vllm_env(None, work / "trl-vllm", cpu=vllm_args.is_cpu_backend())
        self.vllm_env["VLLM_CACHE_ROOT"] = str(args.runs_dir / "cache" / "vllm")
        self.vllm_env["TORCHINDUCTOR_CACHE_DIR"] = str(args.runs_dir / "cache" / "vllm" / "torchinductor")

    def start_server(self, mode: str) -> str:
        """`trl vllm-serve` ("server"), or ("server-vllm") the vLLM server command it runs, started as vLLM's
        own OpenAI server module (what TRL's deprecation note says to run instead)."""
        from posttrain import reaper
        from posttrain.localhost import free_port, stop_group
        from trl.scripts.vllm_serve import ScriptArguments, build_command

        port = free_port()
        model = str(self.model_dir)
        if mode == "server":
            argv = [str(Path(sys.executable).parent / "trl"), "vllm-serve", "--model", model,
                    "--host", "127.0.0.1", "--port", str(port), "--max_model_len", "512",
                    "--dtype", self.precision.vllm]  # fmt: skip
        else:
            command = build_command(ScriptArguments(model=model, host="127.0.0.1", port=port, max_model_len=512,
                                                    dtype=self.precision.vllm))  # fmt: skip
            argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                    *command[command.index(model) + 1 :]]  # fmt: skip
        log = self.work / f"trl-{mode}.log"
        print(f"[trl] $ {' '.join(argv)} (log {log})", flush=True)
        with log.open("ab") as out:
            proc = subprocess.Popen(argv, env=self.vllm_env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        reaper.watch(proc.pid)

        def stop() -> None:
            stop_group(proc, grace=20)
            reaper.unwatch(proc.pid)

        self.stack.callback(stop)
        self.stop_server = stop
        url = f"http://127.0.0.1:{port}"
        try:
            wait_health(url, proc, self.args.server_timeout)
        except (RuntimeError, TimeoutError) as err:
            stop()
            raise RuntimeError(
                f"{argv[1] if mode == 'server' else 'vLLM'} {err}; log tail:\n{log_tail(log)}"
            ) from err
        return url

    def build(self, modes: list[str]):
        for mode in modes:
            started = time.monotonic()
            environ = dict(os.environ)
            try:
                trainer = self._trainer(mode)
                if getattr(trainer, "vllm_generation", None) is not None:
                    trainer.vllm_generation.sync_weights()  # what each iteration does after the first
            except Exception as err:  # noqa: BLE001 - any failure of a mode is reported and the next one tried
                if mode.startswith("server") and self.stop_server is not None:
                    self.stop_server()  # its vLLM would sit beside the next attempt's
                # colocate sets RANK/WORLD_SIZE/MASTER_* for vLLM: left behind, the next trainer would wrap
                # itself in DDP without a process group
                os.environ.clear()
                os.environ.update(environ)
                from accelerate.state import AcceleratorState

                AcceleratorState._reset_state(True)
                text = error_text(err)
                self.attempts.append({"mode": mode, "ok": False, "error": text,
                                      "seconds": round(time.monotonic() - started, 1)})  # fmt: skip
                print(f"[trl] vllm_mode={mode!r} cannot run here: {text}", flush=True)
                continue
            self.attempts.append({"mode": mode, "ok": True, "seconds": round(time.monotonic() - started, 1)})
            print(f"[trl] using {mode} ({time.monotonic() - started:.0f} s to build)", flush=True)
            self.mode = mode
            return trainer
        raise SystemExit(f"no TRL set-up runs here: {json.dumps(self.attempts, indent=2)}")

    def _trainer(self, mode: str):
        import torch
        from datasets import Dataset
        from posttrain_trainer.modeling import load_tokenizer
        from transformers import AutoModelForCausalLM
        from trl import GRPOTrainer

        args = self.args
        app = math_app()
        seeds = list(range((args.repeats + 1) * args.prompts))
        problems = {s: app.make_problem(s, ENV_CONFIG) for s in seeds}
        data = Dataset.from_list(
            [{"prompt": [{"role": "user", "content": problems[s]["question"]}], "seed": s} for s in seeds]
        )

        def math_reward(completions, seed, **kwargs) -> list[float]:
            texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
            return [app.score(problems[s], t)[0] for s, t in zip(seed, texts, strict=True)]

        vllm: dict[str, Any] = {"use_vllm": False}
        if mode in ("server", "server-vllm", "colocate"):
            vllm = {"use_vllm": True, "vllm_mode": mode.split("-")[0], "vllm_max_model_length": 512,
                    "vllm_importance_sampling_correction": False}  # fmt: skip
            if mode.startswith("server"):
                from posttrain.localhost import free_port

                vllm.update(vllm_server_base_url=self.start_server(mode), vllm_group_port=free_port(),
                            vllm_server_timeout=60.0)  # fmt: skip
            else:
                for key in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CACHE_ROOT",
                            "TORCHINDUCTOR_CACHE_DIR"):  # fmt: skip
                    os.environ.setdefault(key, self.vllm_env[key])
        samples = args.prompts * args.group
        config = gspo_grpo_config(
            str(self.work / f"trl-{mode}"),
            samples=samples,
            minibatches=args.minibatches,
            group=args.group,
            max_steps=(args.repeats + 1) * args.minibatches,
            lr=args.lr,
            eps_low=EPS_LOW,
            eps_high=EPS_HIGH,
            max_tokens=args.max_tokens,
            bf16=self.precision.bf16,
            top_p=1.0,
            **vllm,
        )
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
        return GRPOTrainer(model=model, reward_funcs=math_reward, args=config, train_dataset=data,
                           processing_class=load_tokenizer(self.model_dir))  # fmt: skip


def run(args) -> dict[str, Any]:
    import torch
    from posttrain import hardware, modelzoo
    from transformers import TrainerCallback

    threads = max(1, min(4, os.cpu_count() or 1))
    torch.set_num_threads(threads)
    precision = hardware.plan()
    machine = hardware.probe().describe()
    print(f"machine: {machine}; {os.cpu_count()} cores; {uptime()}", flush=True)
    print(f"precision (both sides): {precision.describe()}", flush=True)
    model_dir = modelzoo.convert_smollm2(REPO / ".models" / "smollm2-135m-instruct")
    modes = {"auto": ["server", "server-vllm", "colocate", "transformers"]}.get(
        args.trl_mode, [args.trl_mode]
    )
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-rl-iteration-") as tmp:
        work = Path(tmp)
        ours = Posttrain(args, work, stack)
        trl_side = TRLSide(args, model_dir, work, precision, stack)
        trainer = trl_side.build(modes)
        series = {"posttrain": Series("posttrain"), "trl": Series("TRL")}
        phases: dict[str, list[dict[str, float]]] = {"posttrain": [], "trl": []}
        rewards: dict[str, list[float]] = {"posttrain": [], "trl": []}

        class Interleave(TrainerCallback):
            def __init__(self) -> None:
                self.t0 = None
                self.tokens = 0
                self.inside = {"generate": 0.0, "sync": 0.0, "reward": 0.0}
                self.rewards: list[float] = []

            def on_step_begin(self, targs, state, control, **kw):
                if self.t0 is None:
                    torch.set_num_threads(threads)  # in-process vLLM may change it: the same for both sides
                    self.t0 = time.perf_counter()

            def on_step_end(self, targs, state, control, **kw):
                if state.global_step % args.minibatches:
                    return
                seconds = time.perf_counter() - self.t0
                k = state.global_step // args.minibatches - 1
                reward = statistics.fmean(self.rewards) if self.rewards else None
                split = {"rollout": self.inside["generate"] - self.inside["sync"] + self.inside["reward"],
                         "sync": self.inside["sync"]}  # fmt: skip
                split["update"] = seconds - split["rollout"] - split["sync"]
                if k > 0:
                    series["trl"].add(seconds, self.tokens)
                    phases["trl"].append(split)
                    rewards["trl"].append(reward)
                _print("TRL", k, seconds, self.tokens, reward, split)
                torch.set_num_threads(threads)
                it = ours.iteration()
                if k > 0:
                    series["posttrain"].add(it["seconds"], it["tokens"])
                    phases["posttrain"].append({p: it[p] for p in ("rollout", "update", "sync")})
                    rewards["posttrain"].append(it["mean_reward"])
                _print("posttrain", k, it["seconds"], it["tokens"], it["mean_reward"], it)
                self.t0, self.tokens, self.rewards = None, 0, []
                self.inside = dict.fromkeys(self.inside, 0.0)

        interleave = Interleave()
        trainer.add_callback(interleave)

        def timed(method, key):
            def wrapper(*a, **kw):
                t0 = time.perf_counter()
                try:
                    return method(*a, **kw)
                finally:
                    interleave.inside[key] += time.perf_counter() - t0

            return wrapper

        trainer._generate = timed(trainer._generate, "generate")
        calculate_rewards = timed(trainer._calculate_rewards, "reward")

        def scored(*a, **kw):  # the task's mean reward of this generation batch
            rewards = calculate_rewards(*a, **kw)
            interleave.rewards.append(float(torch.nanmean(rewards)))
            return rewards

        trainer._calculate_rewards = scored
        generation = getattr(trainer, "vllm_generation", None)
        if generation is not None:
            generation.sync_weights = timed(generation.sync_weights, "sync")
        compute_loss = trainer.compute_loss

        def counted(model, inputs, *a, **kw):
            interleave.tokens += int(inputs["completion_mask"].sum())
            return compute_loss(model, inputs, *a, **kw)

        trainer.compute_loss = counted
        trainer.train()
        return {
            "machine": machine,
            "precision": precision.describe(),
            "trl_attempts": trl_side.attempts,
            "trl_mode": trl_side.mode,
            "series": series,
            "phases": phases,
            "rewards": rewards,
            "posttrain_startup_seconds": round(ours.startup_seconds, 1),
        }


# -- --async: the demo's job, serial loop against async_depth 1 ------------------------------------------

DEMO_TOML = REPO / "examples" / "demo" / "rl.toml"
ROLLOUT_CORE, TRAINER_CORE = 0, 1


def run_summary(mode: str, seed: int, wall: float, iterations: list[dict[str, Any]], held_out: float | None) -> dict[str, Any]:
    """One run's record from the trainer's per-iteration metrics (pure)."""

    def mean_of(key: str) -> float | None:
        values = [m[key] for m in iterations if isinstance(m.get(key), int | float)]
        return round(statistics.fmean(values), 4) if values else None

    return {
        "mode": mode,
        "seed": seed,
        "iterations": len(iterations),
        "wall_s": round(wall, 1),
        "iterations_per_hour": round(len(iterations) / wall * 3600.0, 1) if wall > 0 else None,
        "trainer_idle_share": mean_of("trainer_idle_share"),
        "rollout_idle_share": mean_of("rollout_idle_share"),
        "staleness_mean": mean_of("staleness_mean"),
        "stale_dropped": sum(int(m.get("stale_dropped") or 0) for m in iterations),
        "rollout_s": mean_of("rollout_seconds"),
        "rollout_wait_s": mean_of("rollout_wait_seconds"),
        "update_s": mean_of("update_seconds"),
        "sync_s": mean_of("weight_sync_seconds"),
        "weight_sync_stale_s": mean_of("weight_sync_stale_seconds"),
        "final_mean_return": iterations[-1].get("mean_return") if iterations else None,
        "held_out": held_out,
        # the training curve against iterations and against the wall clock (iteration_seconds summed)
        "curve": [[round(t, 1), m.get("mean_return")] for t, m in
                  zip(itertools.accumulate(float(m.get("iteration_seconds") or 0.0) for m in iterations),
                      iterations, strict=True)],  # fmt: skip
    }


def plot_async(result: dict[str, Any], path: Path) -> Path | None:
    """Each run's mean_return per iteration and over wall seconds, sync beside async (PNG)."""
    records = [r for r in result["records"] if r.get("curve")]
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)
    colours = {"sync": "tab:blue", "async": "tab:orange"}
    for r in records:
        seconds = [t for t, _ in r["curve"]]
        returns = [v for _, v in r["curve"]]
        label = f"{r['mode']} (held-out {r['held_out']:.3f})" if isinstance(r.get("held_out"), float) else r["mode"]
        by_step.plot(range(1, len(returns) + 1), returns, color=colours[r["mode"]], alpha=0.7, label=label)
        by_time.plot(seconds, returns, color=colours[r["mode"]], alpha=0.7)
    by_step.set(xlabel="iteration", ylabel="training mean_return", title="per iteration")
    by_time.set(xlabel="seconds of training", title="over the wall clock")
    by_step.legend(fontsize=7)
    fig.suptitle(f"async_depth 1 vs 0, {result['runs']} runs each: {result['cpu']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if isinstance(v, int | float)]
    return statistics.median(values) if values else None


def async_comparison(records: list[dict[str, Any]], cpu: str) -> dict[str, Any]:
    """Medians per mode and the ratios async/sync (pure)."""
    by = {m: [r for r in records if r["mode"] == m] for m in ("sync", "async")}
    med = {m: {k: _median([r[k] for r in rs]) for k in ("iterations_per_hour", "trainer_idle_share",
                                                          "rollout_idle_share", "held_out", "wall_s")}
           for m, rs in by.items()}  # fmt: skip

    def ratio(key: str) -> float | None:
        a, b = med["async"][key], med["sync"][key]
        return round(a / b, 3) if a is not None and b else None

    held = (med["async"]["held_out"], med["sync"]["held_out"])
    return {
        "bench": "rl_iteration_async",
        "iterations_per_hour_ratio": ratio("iterations_per_hour"),
        "trainer_idle_share_ratio": ratio("trainer_idle_share"),
        "rollout_idle_share_ratio": ratio("rollout_idle_share"),
        "held_out_ratio": ratio("held_out"),
        "held_out_delta": round(held[0] - held[1], 4) if None not in held else None,
        "held_out_sync": [r["held_out"] for r in by["sync"]],
        "held_out_async": [r["held_out"] for r in by["async"]],
        "medians": med,
        "runs": min(len(by["sync"]), len(by["async"])),
        "cpu": cpu,
        "records": records,
    }


class DemoServices:
    """The demo job's `posttrain train --local` services on core 0, and RLRuns of it on core 1."""

    def __init__(self, args, work: Path, stack: contextlib.ExitStack):
        from posttrain.api import convert
        from posttrain.api.config import normalized_config
        from posttrain.local.processes import ProcessSet
        from posttrain.local.runner import LocalOptions, LocalRun

        text = DEMO_TOML.read_text().replace("[training]\n", f"[training]\nseed = {args.seed_base}\n", 1)
        config_path = work / "bench-rl-async.toml"
        config_path.write_text(text)
        _, config, _ = convert.load(text, kind="rl", file=str(config_path), model=None)
        opts = LocalOptions(kind="rl", config_path=config_path, config=normalized_config(config),
                            name="bench-rl-async", runs_dir=args.runs_dir)  # fmt: skip
        run = LocalRun(opts)
        run.check_inputs()
        run.procs = stack.enter_context(ProcessSet(run.run_dir / "pids.json"))
        stack.callback(lambda: run.s3 is not None and run.s3.stop())
        # what starts now (S3, the task app, the rollout server and its vLLM) inherits core 0
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(ROLLOUT_CORE)
        os.sched_setaffinity(0, {ROLLOUT_CORE})
        started = time.monotonic()
        run.start_storage()
        run.verify()
        job_path = run.provision()
        from posttrain.api.jobfile import load_jobfile
        from posttrain_trainer.rollouts import wait_for_servers

        self.job = load_jobfile(job_path)
        wait_for_servers(self.job.endpoints.policy)
        print(f"[bench] services up in {time.monotonic() - started:.0f} s on core {ROLLOUT_CORE}; run folder "
              f"{run.run_dir}", flush=True)  # fmt: skip
        os.environ.update(run.child_env)
        os.environ.pop("POSTTRAIN_METRICS_PORT", None)  # one RLRun after another: no /metrics server each
        os.sched_setaffinity(0, {TRAINER_CORE})  # the trainer: this process and its threads
        import torch

        torch.set_num_threads(1)
        self.run_dir = run.run_dir
        self.iterations = args.iterations

    def train(self, mode: str, seed: int, index: int) -> dict[str, Any]:
        import gc

        from posttrain_trainer.rl import RLRun
        from posttrain_trainer.rollouts import RolloutLoop

        depth = 1 if mode == "async" else 0
        update: dict[str, Any] = {"seed": seed, "async_depth": depth}
        if depth:
            update["old_logprobs"] = "sampler"  # what the settings resolve for async_depth > 0
        if self.iterations:
            update.update(num_epochs=1, iterations_per_epoch=self.iterations)
        settings = self.job.settings.model_copy(update=update)
        workdir = self.run_dir / "bench" / f"{index:02d}-{mode}"
        # a uid of its own: the rollout server counts each cid's calls (the call index seeds the request), so a
        # run reusing the previous run's cids would sample with other seeds; with its own, both modes of a run
        # sample their first batch with the same seeds from the same base weights
        identity = self.job.job.model_copy(update={"uid": str(uuid.uuid4())})
        job = self.job.model_copy(update={"settings": settings, "workdir": str(workdir), "checkpoint_every": 0,
                                          "job": identity})  # fmt: skip
        with RolloutLoop() as loop:
            rl = RLRun(job, loop)
            try:
                rl.connect()
                rl.sync(0)  # the rollout server back to the base weights (the previous run left its own)
                rl.clocks.idle_share()  # the servers' idle share from here
                started = time.perf_counter()
                while rl.iteration < rl.total:
                    rl.step()
                wall = time.perf_counter() - started
                rl.close()
                held_out = rl.evaluate(rl.iteration)
                iterations = [h for h in rl.history if "eval_score" not in h]
            finally:
                rl.close()
            record = run_summary(mode, seed, wall, iterations, held_out)
        del rl
        gc.collect()
        return record


def async_bench(args) -> int:
    from posttrain import hardware

    if (os.cpu_count() or 1) < 2 or not hasattr(os, "sched_setaffinity"):
        raise SystemExit("--async pins the rollout server and the trainer to two cores: this machine has fewer")
    cpu = f"{hardware.cpu_label()}; {hardware.probe().describe()}; {os.cpu_count()} cores"
    print(f"machine: {cpu}; {uptime()}", flush=True)
    records: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-rl-async-") as tmp:
        services = DemoServices(args, Path(tmp), stack)
        for i in range(args.runs):
            seed = args.seed_base + i
            for mode in ("sync", "async") if i % 2 == 0 else ("async", "sync"):
                print(f"== run {i + 1} of {args.runs}, {mode}, trainer seed {seed} ({uptime()})", flush=True)
                record = services.train(mode, seed, len(records))
                records.append(record)
                print(f"[bench] {json.dumps(record)}", flush=True)
    result = async_comparison(records, cpu)
    print_async(result)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(result, indent=2))
    if png := plot_async(result, args.json_out.with_suffix(".png")):
        print(f"curves: {png}")
    print(json.dumps({k: v for k, v in result.items() if k != "records"}), flush=True)
    return 0


def print_async(result: dict[str, Any]) -> None:
    def fmt(v: Any, spec: str) -> str:
        return format(v, spec) if isinstance(v, int | float) else "-"

    print(f"\n== {result['runs']} run(s) each on {result['cpu']} ({uptime()})")
    print(f"{'mode':>6} {'seed':>5} {'wall s':>7} {'it/h':>6} {'idle trainer':>13} {'idle rollout':>13} "
          f"{'lag':>5} {'dropped':>8} {'held-out':>9}")  # fmt: skip
    for r in result["records"]:
        print(f"{r['mode']:>6} {r['seed']:>5} {fmt(r['wall_s'], '.0f'):>7} {fmt(r['iterations_per_hour'], '.0f'):>6} "
              f"{fmt(r['trainer_idle_share'], '.0%'):>13} {fmt(r['rollout_idle_share'], '.0%'):>13} "
              f"{fmt(r['staleness_mean'], '.2f'):>5} {r['stale_dropped']:>8} {fmt(r['held_out'], '.3f'):>9}")  # fmt: skip
    med = result["medians"]
    for key, name, spec in (("iterations_per_hour", "iterations per hour", ".0f"),
                            ("trainer_idle_share", "trainer idle share", ".0%"),
                            ("rollout_idle_share", "rollout server idle share", ".0%"),
                            ("held_out", "held-out accuracy", ".3f")):  # fmt: skip
        ratio = {"iterations_per_hour": "iterations_per_hour_ratio", "trainer_idle_share": "trainer_idle_share_ratio",
                 "rollout_idle_share": "rollout_idle_share_ratio", "held_out": "held_out_ratio"}[key]  # fmt: skip
        print(f"{name}: async {fmt(med['async'][key], spec)} / sync {fmt(med['sync'][key], spec)} (medians) = "
              f"{fmt(result[ratio], '.2f')}x")  # fmt: skip
    print(f"held-out async - sync (medians): {fmt(result['held_out_delta'], '+.3f')} (goal: within 0.03); "
          f"iterations per hour {fmt(result['iterations_per_hour_ratio'], '.2f')}x (goal: >= 1.4x)")


def _print(side: str, k: int, seconds: float, tokens: int, reward, split: dict[str, Any]) -> None:
    parts = ", ".join(f"{p} {split[p]:.1f} s" for p in ("rollout", "update", "sync"))
    reward_text = f"{reward:.3f}" if isinstance(reward, int | float) else "-"
    print(f"  iteration {k}{' (warm-up)' if k == 0 else ''} {side:>9}: {seconds:.1f} s ({parts}), "
          f"{tokens} sampled tokens trained, mean reward {reward_text}", flush=True)  # fmt: skip



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed iterations per side (after a warm-up)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (groups) per iteration")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--minibatches", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--trl-mode", choices=["auto", "server", "server-vllm", "colocate", "transformers"], default="auto",
                        help="auto: each in this order until one runs")  # fmt: skip
    parser.add_argument(
        "--server-timeout", type=float, default=300.0, help="seconds for a TRL vLLM server to start"
    )
    parser.add_argument("--runs-dir", type=Path, default=REPO / ".runs")
    parser.add_argument("--json-out", type=Path, default=None,
                        help="default bench-results/rl_iteration.json (--async: rl_iteration_async.json)")  # fmt: skip
    parser.add_argument("--async", dest="async_mode", action="store_true",
                        help="the demo's job, async_depth 0 against 1 (see above)")  # fmt: skip
    parser.add_argument("--runs", type=int, default=5, help="--async: runs of each mode")
    parser.add_argument("--seed-base", type=int, default=1, help="--async: the first run's trainer seed")
    parser.add_argument("--iterations", type=int, default=None,
                        help="--async: iterations per run (default the demo's 14; fewer for a quick look)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.json_out is None:
        name = "rl_iteration_async.json" if args.async_mode else "rl_iteration.json"
        args.json_out = REPO / "bench-results" / name
    if (args.prompts * args.group) % args.minibatches:
        parser.error("--prompts x --group must divide into --minibatches")
    args.runs_dir = args.runs_dir.resolve()
    from posttrain.local.processes import sigterm_as_keyboard_interrupt

    if args.async_mode:
        with sigterm_as_keyboard_interrupt():
            return async_bench(args)

    with sigterm_as_keyboard_interrupt():  # a timeout's SIGTERM still stops every server this started
        result = run(args)
    ours, trl = result["series"]["posttrain"], result["series"]["trl"]
    summary = {
        "bench": "rl_iteration",
        "machine": result["machine"],
        "precision": result["precision"],
        "batch": f"{args.prompts} prompts x {args.group}, <= {args.max_tokens} new tokens, "
        f"{args.minibatches} optimizer steps",
        "order": "interleaved per iteration: TRL, posttrain, TRL, ... (iteration 0 = warm-up of both)",
        "trl_attempts": result["trl_attempts"],
        "trl_mode": result["trl_mode"],
        "posttrain": {
            **ours.as_dict(),
            "phases": result["phases"]["posttrain"],
            "mean_reward": result["rewards"]["posttrain"],
        },  # fmt: skip
        "trl": {**trl.as_dict(), "phases": result["phases"]["trl"], "mean_reward": result["rewards"]["trl"]},
        "posttrain_services_startup_seconds": result["posttrain_startup_seconds"],
        "seconds_ratio_trl_over_posttrain": round(ratio_of_medians(trl.seconds, ours.seconds), 3),
        "throughput_ratio_posttrain_over_trl": round(ratio_of_medians(ours.throughput, trl.throughput), 3),
        "uptime": uptime(),
    }
    print(json.dumps(summary, indent=2))
    for name, side in (("posttrain", "posttrain"), ("TRL", "trl")):
        s = summary[side]
        medians = {p: statistics.median(x[p] for x in s["phases"]) for p in ("rollout", "update", "sync")}
        print(f"{name:>9}: {spread_line(s['seconds_summary'], 's/iteration')}; "
              f"{spread_line(s['tokens_per_second_summary'], 'sampled tokens/s', '.0f')}; median rollout "
              f"{medians['rollout']:.1f} s, update {medians['update']:.1f} s, sync {medians['sync']:.1f} s")  # fmt: skip
    for attempt in result["trl_attempts"]:
        if not attempt["ok"]:
            print(f"TRL vllm_mode={attempt['mode']!r} did not run: {attempt['error']}")
    print(
        f"RL iteration (rollouts + update + weight sync) posttrain vs TRL GRPOTrainer ({result['trl_mode']}): "
        f"{summary['seconds_ratio_trl_over_posttrain']:.2f}x (median seconds per iteration TRL / posttrain), "
        f"{summary['throughput_ratio_posttrain_over_trl']:.2f}x in sampled tokens/s; {args.repeats} interleaved "
        f"repeats, SmolLM2-135M, {args.prompts}x{args.group} rollouts; {result['machine']}"
    )
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
