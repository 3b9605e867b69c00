"""Operator watch-filtering benchmark (`make bench`, not a test): does the operator pay for objects it did not
make? On the real control plane (posttrain_dev.devcluster), the real `posttrain operator` runs cluster-wide and
idles; then N ConfigMaps and N Pods are created in other namespaces and every ConfigMap is updated once
(3N watch events of kinds the operator watches, none of them its own). The operator's RSS and CPU seconds
are read from /proc (psutil) before, during and after.

The API server filters the operator's child watches by label (kopf settings.watching.label_selectors), so
none of these events should reach it. `--baseline-source DIR` runs the same measurement first with the
operator's code from another checkout (e.g. one from before the filters: `git archive <rev> | tar -x -C
DIR`) in the same cluster, for a before/after table.

    .venv/bin/python hack/bench_operator_watches.py [--objects 2000] [--baseline-source DIR]"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))
sys.path.insert(0, str(REPO / "tests"))  # fixtures.operator_process: the operator as a subprocess

from fixtures.operator_process import OperatorProcess, api_client_of, ensure_crds, kubeconfig_of  # noqa: E402

NOISE_NAMESPACES = 4


class Sampler(threading.Thread):
    """Peak RSS of one process, sampled every 0.2 s."""

    def __init__(self, proc: psutil.Process):
        super().__init__(daemon=True)
        self.proc = proc
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            self.stop.wait(0.2)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def mib(value: float) -> float:
    return round(value / 2**20, 1)


def make_noise(api: Any, run: str, objects: int) -> tuple[list[str], float]:
    """N ConfigMaps and N gated (never scheduled) Pods across a few fresh namespaces, then one update of
    every ConfigMap. Returns the namespaces and the seconds it took."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    namespaces = [f"noise-{run}-{i}" for i in range(NOISE_NAMESPACES)]
    for ns in namespaces:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    labels = {"app": "unrelated", "tier": "noise"}

    def config_map(i: int) -> None:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"cm-{i}", labels=labels), data={"payload": "x" * 512}
        )
        core.create_namespaced_config_map(namespaces[i % NOISE_NAMESPACES], body)

    def pod(i: int) -> None:
        body = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"pod-{i}", labels=labels),
            spec=client.V1PodSpec(
                scheduling_gates=[client.V1PodSchedulingGate(name="bench.posttrain.dev/hold")],
                containers=[client.V1Container(name="c", image="registry.invalid/noise:1")],
            ),
        )
        core.create_namespaced_pod(namespaces[i % NOISE_NAMESPACES], body)

    def update(i: int) -> None:
        core.patch_namespaced_config_map(
            f"cm-{i}", namespaces[i % NOISE_NAMESPACES], {"data": {"payload": "y" * 512}}
        )

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for fn in (config_map, pod, update):
            list(pool.map(fn, range(objects)))
    return namespaces, time.monotonic() - started


def delete_namespaces(api: Any, namespaces: list[str], timeout: float = 300) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    for ns in namespaces:
        core.delete_namespace(ns, grace_period_seconds=0)
    deadline = time.monotonic() + timeout
    for ns in namespaces:
        while time.monotonic() < deadline:
            try:
                core.read_namespace(ns)
            except ApiException as err:
                if err.status == 404:
                    break
            time.sleep(1)


def measure(cluster: Any, label: str, source: Path | None, objects: int, workdir: Path, idle: float) -> dict:
    api = api_client_of(cluster)
    env = {"POSTTRAIN_WATCH_PODS": "true", "POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}
    if source is not None:
        env["PYTHONPATH"] = f"{source / 'operator'}"
    operator = OperatorProcess(kubeconfig_of(cluster), workdir / f"operator-{label}.log", env=env).start()
    proc = psutil.Process(operator.pid)
    sampler = Sampler(proc)
    try:
        time.sleep(5.0)  # kopf's initial listings and watches settle
        rss_idle = proc.memory_info().rss
        cpu_start = cpu_seconds(proc)
        time.sleep(idle)
        cpu_idle = cpu_seconds(proc) - cpu_start
        sampler.start()
        cpu_before = cpu_seconds(proc)
        namespaces, took = make_noise(api, label, objects)
        time.sleep(idle)  # events still in flight reach the operator
        cpu_noise = cpu_seconds(proc) - cpu_before
        rss_after = proc.memory_info().rss
        sampler.stop.set()
        result = {
            "run": label,
            "source": str(source or REPO),
            "objects": {"configmaps": objects, "pods": objects, "configmap_updates": objects},
            "noise_seconds": round(took, 1),
            "rss_idle_mib": mib(rss_idle),
            "rss_after_mib": mib(rss_after),
            "rss_peak_mib": mib(max(sampler.peak, rss_after)),
            "cpu_idle_seconds": round(cpu_idle, 2),
            "idle_window_seconds": idle,
            "cpu_noise_seconds": round(cpu_noise, 2),
            "noise_window_seconds": round(took + idle, 1),
        }
    finally:
        sampler.stop.set()
        operator.stop()
    delete_namespaces(api, namespaces)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=2000, help="ConfigMaps and Pods each")
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of each idle window")
    parser.add_argument("--baseline-source", type=Path, default=None, help="another checkout to compare")
    parser.add_argument("--out", type=Path, default=REPO / "bench-results" / "operator_watches.json")
    args = parser.parse_args()
    from posttrain_dev.devcluster import DevCluster

    runs = []
    with tempfile.TemporaryDirectory(prefix="posttrain-watch-bench-") as tmp:
        workdir = Path(tmp)
        with DevCluster(workdir / "cluster") as cluster:
            ensure_crds(api_client_of(cluster))
            if args.baseline_source is not None:
                runs.append(
                    measure(
                        cluster, "baseline", args.baseline_source.resolve(), args.objects, workdir, args.idle
                    )
                )
            runs.append(measure(cluster, "this-tree", None, args.objects, workdir, args.idle))
    print(f"{'run':<10} {'RSS idle':>9} {'RSS after':>10} {'RSS peak':>9} {'CPU idle':>14} {'CPU noise':>16}")
    for r in runs:
        print(
            f"{r['run']:<10} {r['rss_idle_mib']:>7} M {r['rss_after_mib']:>8} M {r['rss_peak_mib']:>7} M "
            f"{r['cpu_idle_seconds']:>6} s/{r['idle_window_seconds']:.0f} s {r['cpu_noise_seconds']:>7} s/"
            f"{r['noise_window_seconds']:.0f} s"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
