"""Operator benchmark (`make bench`, not a test): N RLJobs of 2 GPUs each (1 rollout, 1 trainer) applied at
once on a kwok cluster of 128 nodes x 8 GPUs (the real control plane from posttrain.dev.devcluster), the real
operator as a subprocess, the real math task app on 127.0.0.1 verifying every job.

Prints: apply-to-Running latency p50/p99, jobs reconciled per second (Running jobs / wall time from the
first apply to the last Running), the operator's peak RSS, and API requests per job (the operator's own
client + kopf's, as counted inside the operator process and served on its liveness endpoint).

    .venv/bin/python hack/bench_operator.py [--jobs 500] [--nodes 128] [--gpus-per-node 8]"""

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

from fixtures.operator_process import (  # noqa: E402
    OperatorProcess,
    api_client_of,
    ensure_crds,
    kubeconfig_of,
    rljob_manifest,
)
from posttrain.api.resources import GROUP, VERSION  # noqa: E402

KEY = "sk_env_bench_0001"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            self.stop.wait(0.25)


def cpu_by_process() -> dict[str, float]:
    """user+system CPU seconds of every process on this machine, summed by a short name (kube-apiserver,
    etcd, kwok, posttrain operator, ...)."""
    out: dict[str, float] = {}
    for proc in psutil.process_iter(["name", "cmdline", "cpu_times"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            times = proc.info["cpu_times"]
        except (psutil.Error, TypeError):
            continue
        if times is None:
            continue
        if "posttrain" in cmd and " operator" in cmd:
            name = "posttrain operator"
        elif "bench_operator" in cmd:
            name = "benchmark client"
        elif "taskapps/math" in cmd or "app.py" in cmd:
            name = "math task app"
        else:
            name = proc.info["name"] or "?"
        out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def run_bench(cluster: Any, jobs: int, workdir: Path, timeout: float) -> dict[str, Any]:
    from kubernetes import client, watch
    from posttrain.local.processes import ProcessSet
    from posttrain.local.taskapp import start_taskapp

    api = api_client_of(cluster)
    ensure_crds(api)
    core = client.CoreV1Api(api)
    co = client.CustomObjectsApi(api)
    ns = f"bench-{int(time.time())}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_secret(
        ns,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name="task-key"), string_data={"ENVIRONMENT_API_KEY": KEY}
        ),
    )
    with ProcessSet() as procs:
        url, _ = start_taskapp(procs, api_key=KEY, log_dir=workdir)
        operator = OperatorProcess(
            kubeconfig_of(cluster),
            workdir / "operator.log",
            namespace=ns,
            env={"POSTTRAIN_COUNT_KOPF_REQUESTS": "1", "POSTTRAIN_S3_ENDPOINT": "http://127.0.0.1:9"},
        )
        operator.start()
        sampler = RssSampler(operator.pid)
        sampler.start()
        baseline = operator.counters()
        cpu_before = cpu_by_process()
        applied: dict[str, float] = {}
        running: dict[str, float] = {}
        done = threading.Event()

        def watch_jobs() -> None:
            w = watch.Watch()
            for event in w.stream(
                co.list_namespaced_custom_object, GROUP, VERSION, ns, "rljobs", timeout_seconds=int(timeout)
            ):
                obj = event["object"]
                name = obj["metadata"]["name"]
                if (obj.get("status") or {}).get("phase") == "Running" and name not in running:
                    running[name] = time.monotonic()
                    if len(running) >= jobs:
                        done.set()
                        w.stop()
                        return

        watcher = threading.Thread(target=watch_jobs, daemon=True)
        watcher.start()
        time.sleep(0.5)
        names = [f"bench-{i:04d}" for i in range(jobs)]

        def create(name: str) -> None:
            applied[name] = time.monotonic()
            co.create_namespaced_custom_object(GROUP, VERSION, ns, "rljobs", rljob_manifest(name, url))

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, names))
        apply_s = time.monotonic() - t0
        done.wait(timeout)
        t_end = max(running.values()) if running else time.monotonic()
        cpu_after = cpu_by_process()
        counters = operator.counters()
        sampler.stop.set()
        peak = sampler.peak
        operator.stop()
        latencies = [running[n] - applied[n] for n in names if n in running]

    def total(c: dict[str, Any]) -> int:
        return sum((c.get("operator_requests") or {}).values()) + sum((c.get("kopf_requests") or {}).values())

    requests = total(counters) - total(baseline)
    return {
        "jobs": jobs,
        "running": len(running),
        "apply_seconds": round(apply_s, 2),
        "latency_p50_s": round(percentile(latencies, 0.50), 2),
        "latency_p99_s": round(percentile(latencies, 0.99), 2),
        "latency_max_s": round(max(latencies), 2) if latencies else None,
        "jobs_per_second": round(len(running) / (t_end - t0), 2) if running else 0.0,
        "operator_peak_rss_mib": round(peak / 2**20, 1),
        "api_requests_per_job": round(requests / max(1, len(running)), 2),
        "operator_requests": counters.get("operator_requests"),
        "kopf_requests": counters.get("kopf_requests"),
        "reconcile_passes": counters.get("reconciles"),
        # CPU seconds each component spent while the jobs were applied and reconciled: where the time went
        "cpu_seconds": {
            name: round(cpu_after.get(name, 0.0) - cpu_before.get(name, 0.0), 1)
            for name in sorted(cpu_after, key=lambda n: -(cpu_after[n] - cpu_before.get(n, 0.0)))
            if cpu_after[name] - cpu_before.get(name, 0.0) >= 0.1
        },
        "namespace": ns,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    from posttrain.dev.devcluster import DevCluster

    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        workdir = Path(tmp)
        (workdir / "cluster").mkdir()
        dev = DevCluster(
            workdir / "cluster", nodes=args.nodes, gpus_per_node=args.gpus_per_node, start_timeout=300
        )
        with dev as cluster:
            result = run_bench(cluster, args.jobs, workdir, args.timeout)
            result["nodes"] = args.nodes
            result["gpus_per_node"] = args.gpus_per_node
    print(
        f"operator bench: {result['jobs']} RLJobs x 2 GPUs on {args.nodes} kwok nodes x {args.gpus_per_node} GPUs"
    )
    print(f"  reached Running          {result['running']}/{result['jobs']}")
    print(f"  apply-to-Running p50     {result['latency_p50_s']} s")
    print(f"  apply-to-Running p99     {result['latency_p99_s']} s (max {result['latency_max_s']} s)")
    print(f"  jobs reconciled/second   {result['jobs_per_second']}")
    print(f"  operator peak RSS        {result['operator_peak_rss_mib']} MiB")
    print(f"  API requests per job     {result['api_requests_per_job']}")
    print(f"    operator client: {result['operator_requests']}; kopf: {result['kopf_requests']}")
    wall = result["jobs"] / result["jobs_per_second"] if result["jobs_per_second"] else 0.0
    busiest = list(result["cpu_seconds"].items())[:6]
    print(
        f"  CPU seconds while reconciling ({wall:.0f} s wall): " + ", ".join(f"{k} {v}" for k, v in busiest)
    )
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if result["running"] == result["jobs"] else 1


if __name__ == "__main__":
    sys.exit(main())
