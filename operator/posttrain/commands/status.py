"""`posttrain status NAME [--type rl|sft] [-n NAMESPACE]`: a job's phase, progress, fine-tuned model,
artifacts and conditions from the current kube context. Exit 0 when the job exists (1 when Failed, 3 when not
found). Also the polling helpers that `posttrain train` uses."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from posttrain.errors import Problem, UserError

GROUP = "posttrain.dev"
VERSION = "v1alpha1"
PLURALS = {"rl": "rljobs", "sft": "sftjobs"}
KINDS = {"rl": "RLJob", "sft": "SFTJob"}
TERMINAL = {"Succeeded", "Failed"}
EXIT_FAILED = 1
EXIT_NOT_FOUND = 3
EXIT_TIMEOUT = 4


def load_kube(context: str | None = None) -> tuple[Any, str]:
    """(ApiClient, namespace of the current context). A missing kubeconfig is the user's to fix."""
    from kubernetes import client, config

    try:
        config.load_kube_config(context=context)
    except (config.ConfigException, FileNotFoundError, TypeError) as err:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            raise UserError(
                Problem(
                    f"no usable kube context: {err}",
                    fix="set KUBECONFIG or run `make cluster-up`; or pass --local to train on this machine",
                )
            ) from err
    namespace = "default"
    try:
        _, active = config.list_kube_config_contexts()
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except (config.ConfigException, FileNotFoundError, TypeError):
        pass
    return client.ApiClient(), namespace


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


def describe(job: dict[str, Any]) -> list[str]:
    meta, status = job.get("metadata", {}), job.get("status") or {}
    lines = [
        f"{job.get('kind', 'Job')} {meta.get('namespace')}/{meta.get('name')}",
        f"  phase:            {status.get('phase') or 'Pending'}",
    ]
    if status.get("model"):
        lines.append(f"  model:            {status['model']}")
    if status.get("progress"):
        lines.append(f"  progress:         {format_progress(status['progress'])}")
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


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("status", help="show a job's phase, progress and fine-tuned model")
    parser.add_argument("name")
    parser.add_argument("--type", choices=["rl", "sft"], help="job kind (default: look for both)")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kube context's)")
    parser.add_argument("--context", help="kube context (default: current)")
    parser.add_argument("--json", action="store_true", help="print the job's status as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    api, namespace = load_kube(args.context)
    namespace = args.namespace or namespace
    kinds = [args.type] if args.type else ["rl", "sft"]
    job = None
    for kind in kinds:
        job = get_job(api, kind, namespace, args.name)
        if job is not None:
            break
    if job is None:
        kinds_text = " or ".join(KINDS[k] for k in kinds)
        print(f"no {kinds_text} named {args.name!r} in namespace {namespace!r}")
        return EXIT_NOT_FOUND
    if args.json:
        print(json.dumps(job.get("status") or {}, indent=2, default=str))
    else:
        print("\n".join(describe(job)))
    return EXIT_FAILED if (job.get("status") or {}).get("phase") == "Failed" else 0
