"""`posttrain status [NAME]`: jobs and their progress, on the cluster (the current kube context) and on this
machine (local runs from .runs/).

Without NAME it lists jobs: RLJobs and SFTJobs of the namespace (`-n`, default the context's; `-A` every
namespace; `--type rl|sft`) and the local runs (namespace "local"). With NAME it shows one job (phase,
progress, fine-tuned model, artifacts, conditions), and with `--watch` follows it until it ends: one line per
change with phase, step, reward, eval score, loss and an ETA. Exit 0 (1 when the job Failed, 3 when no job
has that name, 2 when the API server cannot be reached). Also the polling helpers `posttrain train` uses."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.commands.argtypes import namespace, positive_float
from posttrain.errors import Problem, UserError
from posttrain.kubeaccess import load_kube

EXIT_USER_ERROR = 2
GROUP = "posttrain.dev"
VERSION = "v1alpha1"
PLURALS = {"rl": "rljobs", "sft": "sftjobs"}
KINDS = {"rl": "RLJob", "sft": "SFTJob"}
TERMINAL = {"Succeeded", "Failed"}
EXIT_FAILED = 1
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4


def get_job(api: Any, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURALS[kind], name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def format_progress(progress: dict[str, Any]) -> str:
    from posttrain.local.runner import format_progress as fmt

    return fmt(progress or {})


def describe(job: dict[str, Any], curve: str | None = None) -> list[str]:
    """The job's lines; `curve`: its reward sparkline (plotting.sparkline of its metrics.jsonl), if read."""
    meta, status = job.get("metadata", {}), job.get("status") or {}
    lines = [
        f"{job.get('kind', 'Job')} {meta.get('namespace')}/{meta.get('name')}",
        f"  phase:            {status.get('phase') or 'Pending'}",
    ]
    if status.get("model"):
        lines.append(f"  model:            {status['model']}")
    if status.get("progress"):
        lines.append(f"  progress:         {format_progress(status['progress'])}")
    if curve:
        lines.append(f"  curve:            {curve}")
    live = (status.get("progress") or {}).get("metrics")
    if live and not status.get("artifacts"):
        lines.append(f"  live metrics:     {live} (posttrain plot {meta.get('name')})")
    for key, label in (
        ("fineTunedModel", "fine_tuned_model"),
        ("message", "message"),
        ("reason", "reason"),
        ("startTime", "started"),
        ("completionTime", "completed"),
    ):
        if status.get(key):
            lines.append(f"  {label + ':':<18}{status[key]}")
    for name, uri in sorted((status.get("artifacts") or {}).items()):
        if uri:
            lines.append(f"  artifact {name + ':':<9}{uri}")
    for cond in status.get("conditions") or []:
        text = f"{cond.get('type')}={cond.get('status')}"
        if cond.get("reason"):
            text += f" ({cond['reason']})"
        if cond.get("message"):
            text += f": {cond['message']}"
        lines.append(f"  condition:        {text}")
    return lines


def read_curve(job: dict[str, Any]) -> str | None:
    """The sparkline of a cluster job's metrics.jsonl in S3 (live or final), when S3_ENDPOINT and keys are
    set; None otherwise or when it cannot be read (status still answers)."""
    from posttrain.commands.plot import metrics_uri, read_jsonl
    from posttrain.dataset_upload import s3_configured
    from posttrain.plotting import sparkline

    uri = metrics_uri(job.get("status") or {})
    if not uri or not s3_configured():
        return None
    from posttrain.commands.plot import _s3_text
    from posttrain.errors import UserError

    try:
        return sparkline(read_jsonl(_s3_text(uri)))
    except UserError:
        return None


def poll(
    fetch: Callable[[], dict[str, Any] | None],
    *,
    timeout: float,
    interval: float,
    out: Callable[[str], None] = print,
) -> tuple[str | None, dict[str, Any] | None]:
    """Print phase changes and new progress until a terminal phase or the timeout; returns (phase, job)."""
    deadline = time.monotonic() + timeout
    last_phase, last_progress, job = None, None, None
    while True:
        job = fetch()
        status = (job or {}).get("status") or {}
        phase = status.get("phase") or "Pending"
        if phase != last_phase:
            detail = status.get("message") or ""
            out(f"phase: {phase:<13}{detail}")
            last_phase = phase
        progress = status.get("progress")
        if progress and progress != last_progress:
            shown = {k: v for k, v in progress.items() if k != "updatedAt"}
            if shown != {k: v for k, v in (last_progress or {}).items() if k != "updatedAt"}:
                out(f"  {format_progress(progress)}")
            last_progress = progress
        if phase in TERMINAL:
            return phase, job
        if time.monotonic() >= deadline:
            return None, job
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain status                              # jobs of the context's namespace and local runs
  posttrain status -A -o wide                   # every namespace, with the fine-tuned model ids
  posttrain status math-rl-qwen3-4b-1cb328f8 -n team-a --watch
  posttrain status -o json | jq '.[].phase'
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "status",
        help="list jobs, or show / follow one (cluster and local runs)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", nargs="?", help="a job (omit to list jobs)")
    parser.add_argument("--type", choices=["rl", "sft"], help="job kind (default: both)")
    parser.add_argument("-n", "--namespace", type=namespace, help="namespace (default: the kube context's)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="list jobs of every namespace")
    parser.add_argument("--context", help="kube context (default: current)")
    parser.add_argument("-w", "--watch", action="store_true", help="follow NAME until it ends")
    parser.add_argument(
        "--interval", type=positive_float, default=5.0, help="--watch poll seconds (default 5)"
    )
    parser.add_argument("--local", action="store_true", help="only local runs (no cluster)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="local runs folder (default .runs/)")
    parser.add_argument(
        "-o", "--output", choices=["json", "yaml", "wide"], help="json or yaml (machine-readable), wide (adds columns)"
    )
    parser.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    parser.set_defaults(func=run)


def _runs_dir(args: argparse.Namespace) -> Path:
    from posttrain.local.runner import RUNS_DIR

    return (args.runs_dir or RUNS_DIR).resolve()


def _use_cluster(args: argparse.Namespace) -> bool:
    from posttrain.kubeaccess import has_kube_context

    return not args.local and (bool(args.context) or has_kube_context())


def list_objects(api: Any, kinds: list[str], namespace: str | None) -> list[dict[str, Any]]:
    """Every RLJob / SFTJob of `namespace` (None: all namespaces)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    objects = client.CustomObjectsApi(api)
    items: list[dict[str, Any]] = []
    for kind in kinds:
        try:
            if namespace is None:
                found = objects.list_cluster_custom_object(GROUP, VERSION, PLURALS[kind])
            else:
                found = objects.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURALS[kind])
        except ApiException as err:
            if err.status == 404:  # the CRDs are not installed: no jobs of that kind
                continue
            raise
        for item in found.get("items") or []:
            item.setdefault("kind", KINDS[kind])
            items.append(item)
    return items


def _dump(data: Any, fmt: str) -> str:
    if fmt == "yaml":
        import yaml

        return yaml.safe_dump(json.loads(json.dumps(data, default=str)), sort_keys=False).rstrip()
    return json.dumps(data, indent=2, default=str)


def run(args: argparse.Namespace) -> int:
    if args.all_namespaces and args.namespace:
        raise UserError(
            Problem("-A and -n both choose namespaces", field="--namespace", fix="pass one of them")
        )
    if args.watch and not args.name:
        raise UserError(Problem("--watch follows one job", field="--watch", fix="pass the job's NAME"))
    if args.name is None:
        return list_jobs(args)
    return show_job(args)


def list_jobs(args: argparse.Namespace) -> int:
    from posttrain.jobs_view import row_from_local, row_from_object, table
    from posttrain.local.registry import list_runs

    kinds = [args.type] if args.type else ["rl", "sft"]
    rows = [row_from_local(r) for r in list_runs(_runs_dir(args)) if args.type in (None, r.kind)]
    failure = None
    if _use_cluster(args):
        try:
            api, namespace = load_kube(args.context)
            namespace = None if args.all_namespaces else (args.namespace or namespace)
            cluster = [row_from_object(o) for o in list_objects(api, kinds, namespace)]
            rows = sorted(cluster, key=lambda r: (r.namespace, r.name)) + rows
        except Exception as err:  # shown after the local runs, which are still worth seeing
            from posttrain.kubeaccess import problem_for

            failure = problem_for(err) if not isinstance(err, UserError) else err.problems[0]
            if failure is None:
                raise
    if args.output in ("json", "yaml"):
        print(_dump([r.as_dict() for r in rows], args.output))
    elif rows:
        print(table(rows, now=datetime.datetime.now(datetime.UTC), wide=args.output == "wide"))
    else:
        print("no jobs" + ("" if failure else " (local runs: none; cluster: none)"))
    if failure is not None:
        print(f"error: {failure}", file=sys.stderr)
        return EXIT_USER_ERROR
    return 0


def _find(args: argparse.Namespace) -> tuple[str, Any]:
    """("cluster", job object) or ("local", LocalRun); UserError-free None handling by the caller."""
    from posttrain.local.registry import find_run

    if _use_cluster(args):
        api, namespace = load_kube(args.context)
        namespace = args.namespace or namespace
        for kind in [args.type] if args.type else ["rl", "sft"]:
            job = get_job(api, kind, namespace, args.name)
            if job is not None:
                job.setdefault("kind", KINDS[kind])
                return "cluster", (api, kind, namespace, job)
    local = find_run(_runs_dir(args), args.name)
    if local is not None and args.type in (None, local.kind):
        return "local", local
    return "none", None


def describe_local(run: Any) -> list[str]:
    lines = [f"{KINDS.get(run.kind, run.kind)} local/{run.id} (this machine, {run.run_dir})",
             f"  phase:            {run.phase}"]  # fmt: skip
    if run.model:
        lines.append(f"  model:            {run.model}")
    if run.progress:
        lines.append(f"  progress:         {format_progress(run.progress)}")
    report = Path(run.run_dir) / "report.jsonl"
    if report.is_file():
        from posttrain.commands.plot import read_jsonl
        from posttrain.plotting import sparkline

        curve = sparkline(read_jsonl(report.read_text(errors="replace")))
        if curve:
            lines.append(f"  curve:            {curve}")
    for label, value in (("fine_tuned_model", run.fine_tuned_model), ("s3 uri", run.s3_uri),
                         ("message", run.message), ("started", run.started_at), ("updated", run.updated_at)):  # fmt: skip
        if value:
            lines.append(f"  {label + ':':<18}{value}")
    lines.append(f"  logs:             {run.run_dir / 'logs'} (posttrain logs {run.id})")
    return lines


def show_job(args: argparse.Namespace) -> int:
    where, found = _find(args)
    if where == "none":
        kinds_text = " or ".join(KINDS[k] for k in ([args.type] if args.type else ["rl", "sft"]))
        scope = "on this machine" if not _use_cluster(args) else "in the cluster or on this machine"
        hint = ""
        if not args.local and not _use_cluster(args):  # say why the cluster was not asked
            hint = " (no usable kube context, so no cluster was asked: set KUBECONFIG or pass --context; --local looks only here)"
        print(f"no {kinds_text} named {args.name!r} {scope}{hint}", file=sys.stderr)
        return EXIT_NOT_FOUND
    if args.watch:
        return watch(args, where, found)
    if where == "local":
        phase = found.phase
        if args.output in ("json", "yaml"):
            print(_dump({"phase": found.phase, "progress": found.progress, "message": found.message,
                         "fineTunedModel": found.fine_tuned_model, "s3Uri": found.s3_uri}, args.output))  # fmt: skip
        else:
            print("\n".join(describe_local(found)))
    else:
        job = found[3]
        phase = (job.get("status") or {}).get("phase")
        if args.output in ("json", "yaml"):
            print(_dump(job.get("status") or {}, args.output))
        else:
            print("\n".join(describe(job, read_curve(job))))
    return EXIT_FAILED if phase == "Failed" else 0


def watch(args: argparse.Namespace, where: str, found: Any) -> int:
    """A line whenever phase or progress changes, until the job ends (exit 0 Succeeded, 1 Failed)."""
    from posttrain.jobs_view import TERMINAL as DONE
    from posttrain.jobs_view import eta_seconds, row_from_local, row_from_object, watch_line
    from posttrain.local.registry import LocalRun

    def fetch():
        if where == "local":
            run = LocalRun.load(found.run_dir)
            return row_from_local(run) if run is not None else None
        api, kind, namespace, _ = found
        job = get_job(api, kind, namespace, args.name)
        if job is None:
            return None
        job.setdefault("kind", KINDS[kind])
        return row_from_object(job)

    samples: list[tuple[float, int]] = []
    last = None
    while True:
        row = fetch()
        if row is None:
            print(f"{args.name}: deleted", flush=True)
            return EXIT_NOT_FOUND
        if row.step is not None and (not samples or samples[-1][1] != row.step):
            samples.append((time.monotonic(), row.step))
        now = datetime.datetime.now(datetime.UTC)
        eta = eta_seconds(row.step, row.total, samples=samples, started=row.started, now=now)
        line = watch_line(row, eta)
        shown = watch_line(row, None)
        if shown != last:
            print(line, flush=True)
            last = shown
        if row.phase in DONE:
            return EXIT_FAILED if row.phase == "Failed" else 0
        time.sleep(args.interval)
