"""`posttrain logs NAME [-f] [--role trainer|rollout|reference|judge|task-app|eval]`: a job's logs.

Cluster: the pods labelled posttrain.dev/job=NAME (and posttrain.dev/role=ROLE), each line prefixed with
its role and pod when there are several; `-f` follows them until they end (Ctrl-C stops). Local runs: the run
folder's logs/ (trainer.log, rollout-policy.log, taskapp.log, ...); `-f` follows them until the run ends.
`--tail N` shows the last N lines of each (default: all)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

from posttrain.commands.argtypes import namespace, positive_int
from posttrain.errors import Problem, UserError

LABEL_JOB = "posttrain.dev/job"
LABEL_ROLE = "posttrain.dev/role"
# --role as people say it -> the prefix of a local log file's name
LOCAL_ROLE_FILES = {"task-app": "taskapp", "taskapp": "taskapp", "rollout": "rollout", "policy": "rollout-policy",
                    "reference": "rollout-reference", "trainer": "trainer", "eval": "eval"}  # fmt: skip


# Shown at the end of --help (cli.py adds them).
EXAMPLES = """\
  posttrain logs math-rl-qwen3-4b-1cb328f8 -n team-a --role trainer -f
  posttrain logs demo-rl-1821bbe6 --tail 50     # a local run
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "logs", help="a job's logs (cluster pods or a local run)", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("name", help="the job (a local run: its name or <name>-<uid8>)")
    parser.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    parser.add_argument("--role", help="trainer, rollout, reference, judge, task-app, eval (default: all)")
    parser.add_argument("--tail", type=positive_int, default=None, help="only the last N lines of each log")
    parser.add_argument("-n", "--namespace", type=namespace, help="namespace (default: the kube context's)")
    parser.add_argument("--context", help="kube context (default: current)")
    parser.add_argument("--local", action="store_true", help="a local run (no cluster)")
    parser.add_argument("--runs-dir", type=Path, default=None, help="local runs folder (default .runs/)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from posttrain.kubeaccess import has_kube_context
    from posttrain.local.registry import find_run
    from posttrain.local.runner import RUNS_DIR

    runs_dir = (args.runs_dir or RUNS_DIR).resolve()
    if not args.local and (args.context or has_kube_context()):
        pods = cluster_pods(args)
        if pods is not None:
            return cluster_logs(args, *pods)
    local = find_run(runs_dir, args.name)
    if local is None:
        raise UserError(Problem(f"no job or local run named {args.name!r}", field="NAME",
                                fix="list them with `posttrain status` (-A for every namespace)"))  # fmt: skip
    return local_logs(args, local)


# -- cluster -----------------------------------------------------------------------------------------------


def cluster_pods(args: argparse.Namespace) -> tuple[Any, str, list[Any]] | None:
    """(api, namespace, pods) of the job, or None when no pod carries its label."""
    from kubernetes import client

    from posttrain.kubeaccess import load_kube

    api, namespace = load_kube(args.context)
    namespace = args.namespace or namespace
    selector = f"{LABEL_JOB}={args.name}" + (f",{LABEL_ROLE}={args.role}" if args.role else "")
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items
    if not pods:
        return None
    return (
        api,
        namespace,
        sorted(pods, key=lambda p: ((p.metadata.labels or {}).get(LABEL_ROLE, ""), p.metadata.name)),
    )


def _prefix(pod: Any, many: bool) -> str:
    return f"[{(pod.metadata.labels or {}).get(LABEL_ROLE, '?')} {pod.metadata.name}] " if many else ""


def cluster_logs(args: argparse.Namespace, api: Any, namespace: str, pods: list[Any]) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    many = len(pods) > 1
    lock = threading.Lock()

    def show(pod: Any) -> None:
        container = pod.spec.containers[0].name
        prefix = _prefix(pod, many)
        try:
            if args.follow:
                stream = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=container,
                                                      follow=True, tail_lines=args.tail, _preload_content=False)  # fmt: skip
                for raw in stream.stream():
                    with lock:
                        for line in raw.decode(errors="replace").splitlines():
                            print(f"{prefix}{line}", flush=True)
            else:
                text = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=container,
                                                    tail_lines=args.tail)  # fmt: skip
                with lock:
                    for line in (text or "").splitlines():
                        print(f"{prefix}{line}")
        except ApiException as err:  # a pod not started yet has no log: say so, go on with the others
            with lock:
                print(f"{prefix}no log from pod {pod.metadata.name} (HTTP {err.status} {err.reason}; a pod that has "
                      "not started has none)", file=sys.stderr)  # fmt: skip

    if not args.follow or not many:
        for pod in pods:
            show(pod)
        return 0
    threads = [threading.Thread(target=show, args=(pod,), daemon=True) for pod in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
    return 0


# -- local -------------------------------------------------------------------------------------------------


def local_files(run_dir: Path, role: str | None) -> list[Path]:
    files = sorted((run_dir / "logs").glob("*.log"))
    if role:
        prefix = LOCAL_ROLE_FILES.get(role, role)
        files = [f for f in files if f.stem.startswith(prefix)]
    return files


def local_logs(args: argparse.Namespace, local: Any) -> int:
    from posttrain.local.registry import TERMINAL, LocalRun

    files = local_files(local.run_dir, args.role)
    if not files:
        roles = sorted({f.stem for f in local_files(local.run_dir, None)})
        raise UserError(Problem(f"no {args.role or ''} log in {local.run_dir / 'logs'}".replace("  ", " "),
                                field="--role", fix=f"pick one of {', '.join(roles) or '(none yet)'}"))  # fmt: skip
    many = len(files) > 1
    offsets: dict[Path, int] = {}
    for path in files:
        lines = path.read_text(errors="replace").splitlines()
        for line in lines[-args.tail :] if args.tail else lines:
            print(f"[{path.stem}] {line}" if many else line)
        offsets[path] = path.stat().st_size
    sys.stdout.flush()
    while args.follow:
        time.sleep(0.5)
        for path in local_files(local.run_dir, args.role):
            size = path.stat().st_size
            start = offsets.get(path, 0)
            if size > start:
                with path.open("rb") as handle:
                    handle.seek(start)
                    chunk = handle.read(size - start)
                complete, _, _ = chunk.rpartition(b"\n")
                if complete:
                    for line in complete.decode(errors="replace").split("\n"):
                        print(f"[{path.stem}] {line}" if many else line, flush=True)
                    offsets[path] = start + len(complete) + 1
        current = LocalRun.load(local.run_dir)
        if current is None or current.phase in TERMINAL:
            break
    return 0
