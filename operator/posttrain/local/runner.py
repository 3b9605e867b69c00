"""`posttrain train --local`: the cluster topology as processes on this machine.

embedded S3 (SeaweedFS, .runs/s3, shared by every local job so that a later job can start from an earlier
job's fine_tuned_model) -> task app process -> rollout server (policy; reference when configured) -> the
trainer under `torchrun --nproc-per-node N -m posttrain_trainer rl|sft --config job.json` (report.mode=file).
Prints the phases Verifying / Provisioning / Running / Succeeded (or Failed) with progress lines, and ends with
the fine_tuned_model id and its S3 URI. Every process started here is stopped on exit, failure or Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.api import model_ids, topology
from posttrain.api.sections import ReferenceConfig, TopologyConfig
from posttrain.api.vision import rollout_server_args
from posttrain.dataset_upload import check_dataset
from posttrain.errors import Problem, UserError
from posttrain.local.models import REPO_ROOT, ResolvedModel, resolve_model
from posttrain.local.processes import (
    ManagedProcess,
    ProcessFailed,
    ProcessSet,
    sigterm_as_keyboard_interrupt,
    tail,
    wait_http,
)
from posttrain.local.registry import RunRecord
from posttrain.local.taskapp import choose_task_app, start_taskapp
from posttrain.localhost import free_port

RUNS_DIR = REPO_ROOT / ".runs"
LOCAL_NAMESPACE = "local"


VERIFY_TIMEOUT_S = 120.0  # seconds per verification request of a local run's task app


@dataclass
class LocalOptions:
    kind: str  # rl | sft
    config_path: Path
    config: dict[str, Any]  # the normalised synth config (snake_case, extras kept)
    dataset: str | None = None
    nproc: int = 1
    name: str | None = None
    runs_dir: Path = RUNS_DIR
    task_url: str | None = None  # an already running task app (else the bundled one is started)
    task_app: Path | None = None  # a task app script to start instead of the math one
    model_path: str | None = None
    timeout: float | None = None  # seconds for the whole run
    vllm_kv_cache_gib: int = 1
    rollout_ready_timeout: float = 900.0  # a cold torch.compile of SmolLM2 took 5.5 min on 2 busy cores
    extra_env: dict[str, str] = field(default_factory=dict)
    out: Any = None  # where lines go (default sys.stdout)


@dataclass
class LocalResult:
    phase: str
    fine_tuned_model: str | None
    s3_uri: str | None
    artifacts: dict[str, str]
    run_dir: Path
    progress: list[dict[str, Any]]
    events: list[dict[str, Any]]
    seconds: float
    message: str = ""


def slug(value: str, limit: int = 40) -> str:
    text = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return (text[:limit].strip("-")) or "job"


def model_fields(kind: str, config: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(base, source, label) from [model] / [policy] (RL) or [job] / [model] (SFT)."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    policy = config.get("policy") if isinstance(config.get("policy"), dict) else {}
    job = config.get("job") if isinstance(config.get("job"), dict) else {}
    base = model.get("base") or policy.get("model_name") or policy.get("model")
    source = model.get("source") or policy.get("source")
    if kind == "sft":
        base = base or job.get("model")
    label = model.get("label") or policy.get("label")
    return base, source, label


def needs_reference(config: dict[str, Any]) -> bool:
    """A reference server runs beside the policy's when the config places the reference model at all
    (posttrain.api.topology; on one machine "shared" and "dedicated" are both a server process)."""
    reference = _section(config, "reference")
    topo = _section(_section(config, "compute"), "topology")
    placement = topology.reference_placement(
        ReferenceConfig.model_validate(reference) if reference else None,
        TopologyConfig.model_validate(topo) if topo else None,
    )
    return placement != "none"


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _lora_policy(config: dict[str, Any]) -> bool:
    """An RL policy trained as a LoRA, which the policy rollout server serves merged."""
    from posttrain import hardware
    from posttrain.api.settings import trainer_mode

    return hardware.is_lora_mode(trainer_mode(config))


def _precision_line(config: dict[str, Any]) -> str:
    """This machine and the dtypes the trainer will pick for the config's parallelism (where the trainer
    reads it: hyperparameters.parallelism, else training.parallelism), as the trainer's log will say."""
    from posttrain import hardware

    parallelism = _section(_section(config, "hyperparameters"), "parallelism") or _section(
        _section(config, "training"), "parallelism"
    )
    precision = hardware.plan(parallelism.get("bf16"), parallelism.get("force_bf16"), _lora_policy(config))
    warning = f"; WARNING: {precision.warning}" if precision.warning else ""
    return f"machine: {hardware.probe().describe()}; {precision.describe()}{warning}"


def seed_line(config: dict[str, Any]) -> str:
    """The RL job's seed, printed at the start: it seeds the trainer and every sampling request (a rerun with
    it on the same machine repeats the run)."""
    from posttrain.api.sampling_seed import job_seed

    return f"seed {job_seed(config)} (trainer and sampling; set with --set training.seed=N)"


def _find_dataset(value: str, config_path: Path) -> Path:
    for candidate in (Path(value), config_path.parent / value):
        if candidate.is_file():
            return candidate.resolve()
    raise UserError(
        Problem(
            f"dataset not found: {value}", file=str(config_path), fix="pass --dataset PATH to a JSONL file"
        )
    )


class Printer:
    def __init__(self, out: Any = None):
        self.out = out or sys.stdout
        self.started = time.monotonic()
        self.record: RunRecord | None = None  # the run's run.json (posttrain status reads it)

    def line(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def phase(self, name: str, detail: str = "") -> None:
        self.line(f"phase: {name:<13}{detail}")
        if self.record is not None:
            self.record.update(phase=name, message=detail.splitlines()[0] if detail else "")

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def format_progress(progress: dict[str, Any]) -> str:
    parts = []
    if progress.get("step") is not None:
        total = progress.get("total")
        parts.append(f"step {progress['step']}/{total}" if total else f"step {progress['step']}")
    for key, label in (
        ("meanReturn", "mean_return"),
        ("loss", "loss"),
        ("evalScore", "eval_score"),
        ("tokensPerSecond", "tok/s"),
    ):
        value = progress.get(key)
        if isinstance(value, int | float):
            parts.append(f"{label} {value + 0.0:.4g}")  # + 0.0: no "-0" for a loss of -0.0
    if progress.get("judgeScores"):
        parts.append(f"judges {progress['judgeScores']}")
    if progress.get("judgeFailed"):
        parts.append(f"judge_failed {progress['judgeFailed']}")
    if progress.get("lastCheckpoint"):
        parts.append(f"checkpoint {progress['lastCheckpoint']}")
    return "  ".join(parts)


def format_iteration(event: dict[str, Any]) -> str:
    """The trainer's per-iteration detail line: signal (groups with mixed rewards), update, time split."""

    def num(key: str, fmt: str) -> str:
        value = event.get(key)
        return format(value, fmt) if isinstance(value, int | float) else "-"

    failed = f", {event['failed_rollouts']} failed" if event.get("failed_rollouts") else ""
    if event.get("truncated"):
        failed += f", {event['truncated']} cut at max_tokens"
    if event.get("empty_responses"):
        failed += f", {event['empty_responses']} empty"
    if event.get("judged") is not None:
        unjudged = event.get("judge_failed") or 0
        failed += f", judged {event['judged']}" + (
            f" ({unjudged} without a judge score, left out)" if unjudged else ""
        )
    turns = event.get("mean_turns")
    if isinstance(turns, int | float) and (turns > 1 or event.get("decision_rewards_nonzero")):
        # multi-turn episodes: how long they ran and how many decisions earned a step reward
        failed += (f", {turns:.1f} turns/episode, decision rewards {event.get('decision_rewards_nonzero') or 0} "
                   f"non-zero (sum {num('decision_reward_sum', '.3g')})")  # fmt: skip
    if event.get("staleness_max"):  # asynchronous sampling ([training] async_depth): how far behind, how idle
        failed += (f", lag {num('staleness_mean', '.2f')} mean / {event['staleness_max']} max versions"
                   f", {event.get('stale_dropped') or 0} stale dropped")  # fmt: skip
    sampled = ""
    if event.get("groups_sampled"):  # dynamic sampling: the groups rolled out to find those with signal
        rounds = event.get("sampling_rounds") or 1
        sampled = f" ({event['groups_sampled']} sampled, {rounds} round{'s' if rounds != 1 else ''})"
    packed = ""
    ran, padded = event.get("forward_positions"), event.get("padded_positions")
    if isinstance(ran, int) and isinstance(padded, int) and ran < padded:  # shared-prefix packing saved work
        packed = f" (packed: {ran:,} of {padded:,} positions)"
    idle = ""
    if event.get("trainer_idle_share") is not None or event.get("rollout_idle_share") is not None:
        idle = f", idle: trainer {num('trainer_idle_share', '.0%')}, rollout {num('rollout_idle_share', '.0%')}"
    return (
        f"rollouts {event.get('rollouts')}{failed}, mixed groups {event.get('mixed_groups')}/{event.get('groups')}{sampled}, "
        f"trained {event.get('train_sequences')} seqs{packed}, grad_norm {num('grad_norm', '.3g')}, "
        f"clipped {num('clip_fraction', '.0%')} | rollout {num('rollout_seconds', '.1f')} s, "
        f"update {num('update_seconds', '.1f')} s, sync {num('weight_sync_seconds', '.1f')} s{idle}"
    )


def format_restem_iteration(event: dict[str, Any]) -> str:
    """The ReST-EM trainer's per-iteration line: what the E-step kept, what the M-step did, where time went."""

    def num(key: str, fmt: str) -> str:
        value = event.get(key)
        return format(value, fmt) if isinstance(value, int | float) else "-"

    failed = f", {event['failed_rollouts']} failed" if event.get("failed_rollouts") else ""
    return (
        f"sampled {event.get('rollouts')}{failed}, kept {event.get('kept')} from {event.get('prompts_with_kept')} "
        f"prompts, M-step {event.get('sft_steps')} steps from the base model (loss {num('first_loss', '.3g')} -> "
        f"{num('last_loss', '.3g')}) | sample {num('sampling_seconds', '.1f')} s, "
        f"fine-tune {num('sft_seconds', '.1f')} s, sync {num('weight_sync_seconds', '.1f')} s"
    )


def _rollout_argv(role: str, model: str, port: int, served_name: str, max_len: int) -> list[str]:
    return [
        sys.executable, "-m", "posttrain_rollout", "serve", "--role", role, "--model", model,
        "--host", "127.0.0.1", "--port", str(port), "--served-model-name", served_name,
        "--max-model-len", str(max_len),
    ]  # fmt: skip


def _vllm_env(base_env: dict[str, str], runs_dir: Path, run_dir: Path, kv_gib: int) -> dict[str, str]:
    env = dict(base_env)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_gib))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{max(0, (os.cpu_count() or 1) - 1)}")
    # One compile cache for every local run (keyed by vLLM itself on model and settings): a second start of
    # the same model skips most of torch.compile (minutes on 2 busy cores).
    env.setdefault("VLLM_CACHE_ROOT", str(RUNS_DIR / "cache" / "vllm"))
    tmp = run_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env["TMPDIR"] = str(tmp)
    return env


def _read_report(path: Path, offset: int) -> tuple[int, list[dict[str, Any]]]:
    if not path.exists():
        return offset, []
    with path.open() as handle:
        handle.seek(offset)
        data = handle.read()
    complete, _, _ = data.rpartition("\n")
    if not complete:
        return offset, []
    lines = []
    for raw in complete.split("\n"):
        try:
            lines.append(json.loads(raw))
        except ValueError:
            continue
    return offset + len(complete) + 1, lines


class LocalRun:
    """One job on this machine, phase by phase: storage -> verify -> provision -> train (watch the report)
    -> finish. Every process it starts is in `procs` and is stopped when run() returns."""

    def __init__(self, opts: LocalOptions):
        self.opts = opts
        self.printer = Printer(opts.out)
        self.config = dict(opts.config)
        self.base, self.source, label = model_fields(opts.kind, self.config)
        self.uid = str(uuid.uuid4())
        self.name = slug(opts.name or label or opts.config_path.stem)
        self.run_dir = (opts.runs_dir / f"{self.name}-{model_ids.uid8(self.uid)}").resolve()
        self.logs = self.run_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.prefix = model_ids.job_artifact_prefix(LOCAL_NAMESPACE, self.name, self.uid)
        self.report_path = self.run_dir / "report.jsonl"
        self.progress: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.result: dict[str, Any] | None = None
        self.phase = "Pending"
        self.message = ""
        self.env_key = os.environ.get("ENVIRONMENT_API_KEY") or "sk_env_local_" + secrets.token_hex(12)
        self.s3: Any = None
        self.storage: dict[str, Any] = {}
        self.starting_servers: list[tuple[str, ManagedProcess, str]] = []  # (role, process, url)

    def check_inputs(self) -> None:
        """Bad input fails before anything starts: the SFT dataset, the task app's key."""
        opts = self.opts
        self.dataset_path: Path | None = None
        if opts.kind == "sft":
            job_section = _section(self.config, "job")
            value = opts.dataset or job_section.get("data") or job_section.get("data_path")
            if not value:
                raise UserError(
                    Problem("an SFT job needs a dataset", field="job.data", fix="pass --dataset FILE.jsonl")
                )
            self.dataset_path = _find_dataset(str(value), opts.config_path)
            check_dataset(self.dataset_path)
        self.task_choice = (
            choose_task_app(self.config, cli_url=opts.task_url, env=dict(os.environ), script=opts.task_app)
            if opts.kind == "rl"
            else ("none", "")
        )
        if self.task_choice[0] == "url" and not os.environ.get("ENVIRONMENT_API_KEY"):
            raise UserError(
                Problem(
                    f"the task app at {self.task_choice[1]} needs its key: ENVIRONMENT_API_KEY is not set",
                    field="ENVIRONMENT_API_KEY",
                    fix="export ENVIRONMENT_API_KEY=<the task app's key>",
                )
            )

    def run(self) -> LocalResult:
        self.check_inputs()
        opts, printer = self.opts, self.printer
        printer.line(
            f"posttrain train --local: {opts.kind} job {LOCAL_NAMESPACE}/{self.name} (uid {self.uid}), "
            f"run folder {self.run_dir}"
        )
        printer.line(_precision_line(self.config))
        if opts.kind == "rl":
            printer.line(seed_line(self.config))
        printer.record = RunRecord(self.run_dir, name=self.name, kind=opts.kind, uid=self.uid,
                                   model=self.source or self.base, config=str(opts.config_path))  # fmt: skip
        with sigterm_as_keyboard_interrupt(), ProcessSet(self.run_dir / "pids.json") as self.procs:
            try:
                self.start_storage()
                self.verify()
                job_path = self.provision()
                self.train(job_path)
                self.phase = "Succeeded"
            except KeyboardInterrupt:
                self.fail("interrupted", "interrupted (Ctrl-C): stopping every process")
            except ProcessFailed as err:
                self.fail(str(err), f"during {self.phase}: {err}")
            except (
                RuntimeError,
                OSError,
                TimeoutError,
            ) as err:  # infrastructure (S3, ports, files), not the user
                message = f"{type(err).__name__}: {err}"
                self.fail(message, f"during {self.phase}: {message}")
            finally:
                self.procs.stop_all()
                if self.s3 is not None:
                    self.s3.stop()
        return self.finish()

    def fail(self, message: str, detail: str) -> None:
        self.message = message
        self.printer.phase("Failed", detail)
        self.phase = "Failed"

    def start_storage(self) -> None:
        """The embedded S3, the children's environment, and where the model comes from."""
        from posttrain import s3server

        opts = self.opts
        self.s3 = s3 = s3server.start(opts.runs_dir / "s3")
        if s3.process is not None:
            self.procs.record("s3", s3.process.pid)
        self.storage = s3.storage(self.prefix)
        self.printer.line(f"storage: embedded S3 {s3.url} bucket {s3.bucket} (data {opts.runs_dir / 's3'})")
        self.child_env = {
            **os.environ,
            **s3.env(),
            "ENVIRONMENT_API_KEY": self.env_key,
            # the rollout servers' weight sync and captures answer only the trainer (as in a cluster)
            "POSTTRAIN_ROLLOUT_TOKEN": secrets.token_urlsafe(24),
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **opts.extra_env,
        }
        self.resolved: ResolvedModel = resolve_model(
            self.base,
            self.source,
            bucket=s3.bucket,
            model_path=opts.model_path,
            config_file=str(opts.config_path),
        )

    def verify(self) -> None:
        """Verifying: the task app answers (RL), the source model exists."""
        self.phase = "Verifying"
        self.task_url = None
        if self.opts.kind == "rl":
            self.task_url = self.verify_task_app()
        else:
            self.printer.phase(self.phase, f"dataset {self.dataset_path}")
        if self.resolved.source_id:
            _check_source_exists(self.s3, self.resolved)
            self.printer.line(f"  PASS  source     {self.resolved.source_id} -> {self.resolved.model_path}")

    def verify_task_app(self) -> str:
        from posttrain.taskapp_client import TaskAppClient, verify

        how, where = self.task_choice
        if how == "url":
            task_url = str(where)
        else:
            task_url, _ = start_taskapp(
                self.procs, api_key=self.env_key, log_dir=self.logs, app_path=Path(where)
            )
        self.printer.phase(
            self.phase, f"task app {task_url}" + (f" (started {where})" if how == "start" else "")
        )
        # a generous timeout: synth's Crafter app builds a world per seed of /task_info (ten of them), which
        # takes well over 10 s on a busy machine; a local run would rather wait than fail
        with TaskAppClient(task_url, self.env_key, timeout=VERIFY_TIMEOUT_S) as client:
            checks = verify(client)
        for check in checks:
            self.printer.line(f"  {check.verdict}  {check.name:<10} {check.detail}")
        if not all(c.ok for c in checks):
            raise ProcessFailed("task app verification failed")
        return task_url

    def provision(self) -> Path:
        """Provisioning: rollout servers (RL) or the dataset in S3 (SFT), the model in the S3 cache, the
        job file; returns the job file's path."""
        from posttrain.api.jobfile import build_jobfile, dump_jobfile

        self.phase = "Provisioning"
        resolved = self.resolved
        self.printer.phase(self.phase, f"model {resolved.base_model} from {resolved.model_path}")
        endpoints: dict[str, Any] = {"policy": [], "reference": None, "judges": {}}
        dataset_ref: dict[str, Any] = {}
        if self.opts.kind == "rl":
            self.start_rollout_servers(endpoints)  # waited for once the trainer starts (train)
        else:
            dataset_ref = self.upload_dataset()
        # The trainer's ranks share one S3 download cache; fill it here once so that they never race
        # on the same files (the model and, for a LoRA result, the chain of bases it names).
        self.child_env["POSTTRAIN_S3_CACHE"] = str(self.opts.runs_dir / "cache" / "s3")
        _prefetch(self.s3, resolved.model_path, Path(self.child_env["POSTTRAIN_S3_CACHE"]))
        job = build_jobfile(
            self.opts.kind,
            self.config,
            job={"name": self.name, "namespace": LOCAL_NAMESPACE, "uid": self.uid},
            base_model=resolved.base_model,
            model_path=resolved.model_path,
            task_app={"url": self.task_url, "api_key_env": "ENVIRONMENT_API_KEY"} if self.task_url else None,
            endpoints=endpoints,
            dataset=dataset_ref,
            storage=self.storage,
            checkpoint_default=0,  # one machine: no replacement pod resumes
            report={"mode": "file", "path": str(self.report_path)},
            workdir=str(self.run_dir / "work"),
            weight_sync={"via": "path", "shared_dir": str(self.run_dir / "weights")},
        )
        return dump_jobfile(job, self.run_dir / "job.json")

    def start_rollout_servers(self, endpoints: dict[str, Any]) -> None:
        """The policy's rollout server, and the reference's where the config places one, into `endpoints`;
        wait_rollout_servers waits for them (the trainer loads its model meanwhile)."""
        opts, printer, resolved = self.opts, self.printer, self.resolved
        max_len = int(_section(self.config, "vllm").get("max_model_len") or 1024)
        vllm_env = _vllm_env(self.child_env, opts.runs_dir, self.run_dir, opts.vllm_kv_cache_gib)
        servers: list[tuple[str, ManagedProcess, str]] = []
        for role in ["policy"] + (["reference"] if needs_reference(self.config) else []):
            port = free_port()
            argv = _rollout_argv(role, resolved.model_path, port, resolved.base_model, max_len)
            if role == "policy" and _lora_policy(self.config):
                argv.append("--lora-policy")  # float32 on a CPU: see posttrain.hardware
            if role == "policy":
                argv += rollout_server_args(self.config)
            role_env = {**vllm_env, "POSTTRAIN_RUN_DIR": str(self.run_dir / f"rollout-{role}")}
            proc = self.procs.start(f"rollout-{role}", argv, self.logs / f"rollout-{role}.log", env=role_env)
            url = f"http://127.0.0.1:{port}"
            servers.append((role, proc, url))
            printer.line(f"  starting {role} rollout server on 127.0.0.1:{port} (log {proc.log_path})")
            if role == "policy":
                endpoints["policy"].append(url)
            else:
                endpoints["reference"] = url
        self.starting_servers = servers

    def wait_rollout_servers(self) -> None:
        """Until every rollout server start_rollout_servers started answers /health (or one exits)."""
        for role, proc, url in self.starting_servers:
            wait_http(f"{url}/health", timeout=self.opts.rollout_ready_timeout, proc=proc, interval=1.0)
            self.printer.line(f"  ready    {role} rollout server {url} ({self.printer.elapsed():.0f} s)")
        self.starting_servers = []

    def upload_dataset(self) -> dict[str, Any]:
        """The SFT dataset (and validation set) into S3; returns the job file's dataset section."""
        s3, prefix = self.s3, self.prefix
        client = s3.client()
        dataset_ref: dict[str, Any] = {}
        key = f"{prefix}data/train.jsonl"
        client.fput_object(s3.bucket, key, str(self.dataset_path))
        dataset_ref["train"] = f"s3://{s3.bucket}/{key}"
        validation = _section(self.config, "data").get("validation_path")
        if validation and str(validation).startswith("s3://"):
            dataset_ref["validation"] = str(validation)  # the trainer reads it from the (same) S3
        elif validation:
            vpath = _find_dataset(str(validation), self.opts.config_path)
            check_dataset(vpath)
            vkey = f"{prefix}data/validation.jsonl"
            client.fput_object(s3.bucket, vkey, str(vpath))
            dataset_ref["validation"] = f"s3://{s3.bucket}/{vkey}"
        self.printer.line(f"  uploaded dataset -> {dataset_ref['train']}")
        return dataset_ref

    def train(self, job_path: Path) -> None:
        """Running: the trainer under torchrun, watched until it exits; raises ProcessFailed unless it
        ended with a result."""
        opts = self.opts
        self.phase = "Running"
        trainer_argv = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(opts.nproc), "-m", "posttrain_trainer", opts.kind,
            "--config", str(job_path),
        ]  # fmt: skip
        trainer_env = dict(self.child_env)
        trainer_env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, opts.nproc))))
        # rank 0's Prometheus metrics (posttrain_trainer/telemetry.py) on a free loopback port, unless given
        if "POSTTRAIN_METRICS_PORT" not in trainer_env:
            trainer_env["POSTTRAIN_METRICS_PORT"] = str(free_port())
        trainer_env.setdefault("POSTTRAIN_METRICS_HOST", "127.0.0.1")
        if trainer_env["POSTTRAIN_METRICS_PORT"] != "0":
            host, port = trainer_env["POSTTRAIN_METRICS_HOST"], trainer_env["POSTTRAIN_METRICS_PORT"]
            self.printer.line(f"metrics: http://{host}:{port}/metrics (rank 0, Prometheus)")
        trainer = self.procs.start(
            "trainer", trainer_argv, self.logs / "trainer.log", env=trainer_env, cwd=self.run_dir
        )
        self.printer.phase(
            self.phase,
            f"torchrun --nproc-per-node {opts.nproc} -m posttrain_trainer {opts.kind} "
            f"--config {job_path} (log {trainer.log_path})",
        )
        # The trainer loads its model while vLLM starts and waits for the servers itself before its first
        # rollout (posttrain_trainer.rollouts.wait_for_servers): the two start-ups overlap.
        self.wait_rollout_servers()
        code = self.watch(trainer)
        if code != 0:
            raise ProcessFailed(
                f"trainer exited with code {code}; log {trainer.log_path}:\n{tail(trainer.log_path)}"
            )
        if not self.result or not self.result.get("fine_tuned_model"):
            raise ProcessFailed(f"trainer finished without a result line in {self.report_path}")

    def watch(self, trainer: ManagedProcess) -> int:
        """Follow the trainer's report until it exits (the other processes must stay alive); its exit code."""
        offset = 0
        self.last_step: Any = None
        self.last_fields: set[str] = set()
        deadline = time.monotonic() + self.opts.timeout if self.opts.timeout else None
        while True:
            code = trainer.poll()
            offset, lines = _read_report(self.report_path, offset)
            for line in lines:
                self.follow(line)
            if code is not None:
                return code
            for proc in self.procs.processes:
                if proc is not trainer:
                    proc.check_alive()
            if deadline and time.monotonic() > deadline:
                raise ProcessFailed(
                    f"timed out after {self.opts.timeout:.0f} s (trainer log {trainer.log_path})"
                )
            time.sleep(1.0)

    def follow(self, line: dict[str, Any]) -> None:
        """One report line: progress (printed when it says something new), the result, or an event."""
        printer = self.printer
        if "progress" in line:
            self.progress.append(line["progress"])
            printer.record.update(progress=line["progress"])
            text = format_progress(line["progress"])
            fields = {k for k, v in line["progress"].items() if v is not None} - {"updatedAt"}
            step = line["progress"].get("step")
            if text and not (step == self.last_step and fields <= self.last_fields):
                printer.line(f"  {text}")
            self.last_step, self.last_fields = step, fields
        elif "result" in line:
            self.result = line["result"]
        elif "event" in line:
            self.events.append(line)
            if line["event"] in ("evaluation", "eval"):
                printer.line(f"  event {json.dumps(line)}")
            elif line["event"] == "iteration":
                printer.line(f"    {format_iteration(line)}")
            elif line["event"] == "restem_iteration":
                printer.line(f"    {format_restem_iteration(line)}")

    def finish(self) -> LocalResult:
        """The result: on success printed and written to result.json and run.json."""
        printer = self.printer
        seconds = printer.elapsed()
        artifacts = dict((self.result or {}).get("artifacts") or {})
        fine_tuned = (self.result or {}).get("fine_tuned_model")
        s3_uri = artifacts.get("model") or (
            f"s3://{self.storage['bucket']}/{self.prefix}final/" if fine_tuned else None
        )
        if self.phase == "Succeeded":
            printer.phase(self.phase, f"in {seconds:.0f} s")
            printer.line(f"fine_tuned_model: {fine_tuned}")
            printer.line(f"s3 uri: {s3_uri}")
            printer.record.update(fine_tuned_model=fine_tuned, s3_uri=s3_uri)
            (self.run_dir / "result.json").write_text(
                json.dumps({"fine_tuned_model": fine_tuned, "s3_uri": s3_uri, "artifacts": artifacts,
                            "seconds": round(seconds, 1)}, indent=2)
            )  # fmt: skip
        return LocalResult(
            self.phase, fine_tuned, s3_uri, artifacts, self.run_dir, self.progress, self.events, seconds,
            self.message,
        )  # fmt: skip


def run_local(opts: LocalOptions) -> LocalResult:
    """Run one job on this machine; raises UserError for a bad config, returns the final phase otherwise."""
    return LocalRun(opts).run()


def _prefetch(s3: Any, model_path: str, cache: Path) -> None:
    from posttrain import storage

    previous = os.environ.get("POSTTRAIN_S3_CACHE")
    os.environ["POSTTRAIN_S3_CACHE"] = str(cache)
    try:
        for _ in range(8):
            if not storage.is_s3_uri(model_path):
                return
            folder = storage.download_dir(s3.client(), model_path)
            ref = folder / "posttrain-base.json"
            if not ref.exists() or (folder / "config.json").exists():
                return
            model_path = json.loads(ref.read_text()).get("model_path") or ""
    finally:
        if previous is None:
            os.environ.pop("POSTTRAIN_S3_CACHE", None)
        else:
            os.environ["POSTTRAIN_S3_CACHE"] = previous


def _check_source_exists(s3: Any, resolved: ResolvedModel) -> None:
    from posttrain.storage import parse_s3_uri

    bucket, key = parse_s3_uri(resolved.model_path)
    found = any(True for _ in s3.client().list_objects(bucket, prefix=key, recursive=True))
    if not found:
        raise UserError(
            Problem(
                f"no earlier local job produced {resolved.source_id} (nothing at {resolved.model_path})",
                field="model.source",
                fix="run the job that prints this fine_tuned_model first, with the same .runs/ folder",
            )
        )
