"""`posttrain plot NAME [-o curve.png]`: the reward / loss curve of any job as a PNG.

A local run: from its report.jsonl (every progress line and evaluation so far, also while it runs). A
cluster job: from the metrics.jsonl the trainer stores in S3 (status.artifacts.metrics, or .logs, once it has
ended; while it runs, status.progress.metrics, uploaded after its first step and every few steps), read with
S3_ENDPOINT / S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY. Training rollouts' mean reward and
held-out eval scores go in one panel, training and held-out loss in another."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from posttrain.commands.argtypes import namespace
from posttrain.errors import Problem, UserError

# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain plot demo-rl-1821bbe6 -o curve.png
  posttrain plot math-rl-qwen3-4b-1cb328f8 -n team-a -o curve.png
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plot", help="write a job's reward/loss curve PNG", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("name", help="the job (a local run: its name or <name>-<uid8>)")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: <name>-curve.png here)")
    parser.add_argument("--type", choices=["rl", "sft"], help="job kind (default: both)")
    parser.add_argument("-n", "--namespace", type=namespace, help="namespace (default: the kube context's)")
    parser.add_argument("--context", help="kube context (default: current)")
    parser.add_argument("--local", action="store_true", help="a local run (no cluster)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="local runs folder (default .runs/)")
    parser.set_defaults(func=run)


def read_jsonl(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(value, dict):
            out.append(value)
    return out


def _s3_text(uri: str) -> str:
    from posttrain.dataset_upload import S3_VARIABLES, s3_configured

    if not s3_configured():
        raise UserError(Problem(f"the job's metrics are in S3 ({uri})", field="S3_ENDPOINT",
                                fix=f"set {', '.join(S3_VARIABLES)} to read them"))  # fmt: skip
    import os

    from posttrain import storage

    bucket, key = storage.parse_s3_uri(uri)
    client = storage.client_from_env({"endpoint": os.environ["S3_ENDPOINT"], "bucket": bucket})
    try:
        response = client.get_object(bucket, key)
        try:
            return response.read(64 * 1024 * 1024).decode("utf-8", errors="replace")
        finally:
            response.close()
            response.release_conn()
    except Exception as err:  # minio's S3Error, or a transport error: one line either way
        raise UserError(Problem(f"cannot read {uri}: {type(err).__name__}: {err}"[:300], field="S3_ENDPOINT",
                                fix="check the S3 endpoint and keys")) from None  # fmt: skip


def metrics_uri(status: dict[str, Any]) -> str | None:
    """Where a cluster job's metrics.jsonl is: the final artifact, else the live one of a running job."""
    artifacts = status.get("artifacts") or (status.get("result") or {}).get("artifacts") or {}
    return artifacts.get("metrics") or artifacts.get("logs") or (status.get("progress") or {}).get("metrics")


def cluster_lines(args: argparse.Namespace) -> tuple[str, list[dict[str, Any]]] | None:
    from posttrain.commands.status import KINDS, get_job
    from posttrain.kubeaccess import load_kube

    api, namespace = load_kube(args.context)
    namespace = args.namespace or namespace
    for kind in [args.type] if args.type else ["rl", "sft"]:
        job = get_job(api, kind, namespace, args.name)
        if job is None:
            continue
        status = job.get("status") or {}
        uri = metrics_uri(status)
        if not uri:
            raise UserError(Problem(
                f"{KINDS[kind]} {namespace}/{args.name} is {status.get('phase') or 'Pending'}: its metrics.jsonl is "
                "uploaded after its first step", field="NAME",
                fix=f"follow it with `posttrain status {args.name} --watch`, plot it once it has trained a step"))  # fmt: skip
        return f"{namespace}/{args.name}", read_jsonl(_s3_text(uri))
    return None


def run(args: argparse.Namespace) -> int:
    from posttrain.inputs import check_output_path
    from posttrain.kubeaccess import has_kube_context
    from posttrain.local.registry import find_run
    from posttrain.local.runner import RUNS_DIR
    from posttrain.plotting import plot_curves

    output = check_output_path(args.output or Path(f"{args.name}-curve.png"), flag="--output")
    found = None
    if not args.local and (args.context or has_kube_context()):
        found = cluster_lines(args)
    if found is None:
        local = find_run((args.runs_dir or RUNS_DIR).resolve(), args.name)
        if local is None:
            raise UserError(Problem(f"no job or local run named {args.name!r}", field="NAME",
                                    fix="list them with `posttrain status`"))  # fmt: skip
        report = local.run_dir / "report.jsonl"
        lines = read_jsonl(report.read_text(errors="replace")) if report.is_file() else []
        found = (f"local/{local.id}", lines)
    title, lines = found
    path = plot_curves(lines, output, title=title)
    if path is None:
        raise UserError(Problem(f"{title} has no progress to plot yet", field="NAME",
                                fix="plot it again once it has trained a step"))  # fmt: skip
    print(f"wrote {path} ({title})")
    return 0
