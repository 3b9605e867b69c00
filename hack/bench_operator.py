"""Operator benchmark (`make bench`, not a test): the real operator as a subprocess, cluster-wide, on a kwok
cluster of 128 nodes x 8 GPUs (the real control plane from posttrain_dev.devcluster) that also holds
unrelated ConfigMaps and Pods in other namespaces (watch traffic the operator must not pay for); the real
math task app on 127.0.0.1; RLJobs of 2 GPUs each (1 rollout, 1 trainer), half of them naming a TaskApp.

Phases, one cluster:
  paced   N jobs applied at --rate jobs/s: apply->Running p50/p99 (a latency, not a queue length)
  idle    those N jobs Running, nothing changing: the operator's CPU over --idle-seconds
  burst   the paced jobs deleted, then N jobs applied at once: Running jobs / (last Running - first apply)
The operator's CPU (its process), peak RSS, and API requests (its own client and kopf's, counted inside the
operator process and served on its liveness endpoint) are summed over the paced and burst phases, from the
first apply to the last Running, and divided by the jobs that reached Running. The control plane's CPU
(kube-apiserver, etcd, controller-manager, scheduler, kwok) is printed beside the operator's, so that a
reader sees which one bounds a figure.

    .venv/bin/python hack/bench_operator.py [--jobs 500] [--rate 2] [--unrelated 2000] [--json]
        [--operator-pythonpath DIR]   run another tree's operator (a before/after in one sitting)
        [--profile FILE]              py-spy the operator through the paced phase: raw stacks to FILE

--memory-jobs N (e.g. 5000) runs only a memory phase instead: N suspended SFTJobs, each carrying the largest
originalToml the CRD admits (--toml-kib, 256 KiB), in one namespace; the operator's peak RSS once it runs a
loop for every one of them (each job's body without its TOML and its loop's state stay in memory), against the
memory limit of the install's Deployment (1 GiB in base and prod), and again through a restart.

With --json the last line is one JSON object: operator_cpu_s_per_job, requests_per_job, writes_per_job,
paced_p50_s, paced_p99_s, burst_jobs_per_s, peak_rss_mib, idle_cpu_pct, and the rest."""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import shutil
import signal
import subprocess
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
CONTROL_PLANE = ("kube-apiserver", "etcd", "kube-controller", "kube-scheduler", "kwok")
WRITES = ("POST", "PUT", "PATCH", "DELETE")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                flags = Path("/proc/cpuinfo").read_text()
                isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
                isa += ", native bf16" if "avx512_bf16" in flags or "amx_bf16" in flags else ""
                return f"{name}, {os.cpu_count()} cores, {isa}"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


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
    """user+system CPU seconds of every process on this machine, summed by a short name."""
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
        elif "py-spy" in cmd:
            name = "py-spy"
        elif "taskapps/math" in cmd or "app.py" in cmd:
            name = "math task app"
        else:
            name = proc.info["name"] or "?"
        out[name] = out.get(name, 0.0) + times.user + times.system
    return out


def operator_cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def requests_of(counters: dict[str, Any]) -> collections.Counter[str]:
    out: collections.Counter[str] = collections.Counter()
    out.update(counters.get("operator_requests") or {})
    out.update(counters.get("kopf_requests") or {})
    return out


class Phase:
    """What one phase cost: the operator's CPU and requests, every process's CPU, wall time."""

    def __init__(self, operator: OperatorProcess):
        self.operator = operator
        self.cpu0 = operator_cpu(operator.pid)
        self.all0 = cpu_by_process()
        self.req0 = requests_of(operator.counters())
        self.t0 = time.monotonic()

    def end(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        requests = requests_of(self.operator.counters())
        requests.subtract(self.req0)
        every = cpu_by_process()
        spent = {k: every[k] - self.all0.get(k, 0.0) for k in every}
        control = sum(v for k, v in spent.items() if k.startswith(CONTROL_PLANE))
        return {
            "wall_s": wall,
            "operator_cpu_s": operator_cpu(self.operator.pid) - self.cpu0,
            "control_plane_cpu_s": control,
            "requests": {k: v for k, v in requests.items() if v},
            "cpu_s": {k: round(v, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1]) if v >= 0.1},
        }


class RunningWatch(threading.Thread):
    """Notes when each RLJob of a namespace is first seen Running."""

    def __init__(self, co: Any, ns: str, timeout: float):
        super().__init__(daemon=True)
        self.co, self.ns, self.timeout = co, ns, timeout
        self.running: dict[str, float] = {}
        self.want = 0
        self.done = threading.Event()

    def run(self) -> None:
        from kubernetes import watch

        w = watch.Watch()
        for event in w.stream(self.co.list_namespaced_custom_object, GROUP, VERSION, self.ns, "rljobs",
                              timeout_seconds=int(self.timeout)):  # fmt: skip
            obj = event["object"]
            name = obj["metadata"]["name"]
            if (obj.get("status") or {}).get("phase") == "Running" and name not in self.running:
                self.running[name] = time.monotonic()
                if self.want and len(self.running) >= self.want:
                    self.done.set()
                    w.stop()
                    return


def make_unrelated(api: Any, count: int) -> float:
    """`count` ConfigMaps and `count` Pods in 10 namespaces the operator has no business with."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    spaces = [f"unrelated-{i}" for i in range(10)]
    for ns in spaces:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))

    def make(i: int) -> None:
        ns = spaces[i % len(spaces)]
        labels = {"app": f"other-{i % 7}"}
        core.create_namespaced_config_map(ns, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=f"cm-{i}", labels=labels), data={"k": "v" * 64}))  # fmt: skip
        core.create_namespaced_pod(ns, client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"pod-{i}", labels=labels),
            spec=client.V1PodSpec(containers=[client.V1Container(
                name="c", image="busybox", resources=client.V1ResourceRequirements(requests={"cpu": "1m"}))]),
        ))  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(make, range(count)))
    return time.monotonic() - t0


def wait_unrelated_running(api: Any, count: int, timeout: float = 600) -> float:
    """Wait until the scheduler and kwok have placed and started every unrelated Pod: those made at once
    are a queue in front of the first jobs' pods (with 2,000 of them, the jobs applied in the paced
    phase's first seconds waited about 25 s for it, all released together), which is the bench's own
    set-up, not the latency it measures."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        pods = core.list_pod_for_all_namespaces(label_selector="app", field_selector="status.phase=Running").items
        if sum(1 for p in pods if p.metadata.namespace.startswith("unrelated-")) >= count:
            return time.monotonic() - t0
        time.sleep(2.0)
    raise TimeoutError(f"unrelated pods not all Running after {timeout}s")


def job_namespace(api: Any, ns: str, url: str) -> None:
    """A namespace with the task app's key and a TaskApp `math` naming it."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="task-key", labels={"posttrain.dev/use": "task-app-key"}), string_data={"ENVIRONMENT_API_KEY": KEY}))  # fmt: skip
    client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, "taskapps", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "TaskApp", "metadata": {"name": "math"},
        "spec": {"url": url, "apiKeySecretRef": {"name": "task-key", "key": "ENVIRONMENT_API_KEY"}},
    })  # fmt: skip


def manifest(i: int, url: str) -> dict[str, Any]:
    name = f"bench-{i:04d}"
    body = rljob_manifest(name, url)
    if i % 2:  # half the jobs name the TaskApp
        body["spec"]["taskApp"] = {"name": "math"}
    return body


def wait_verified(co: Any, ns: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = co.get_namespaced_custom_object(GROUP, VERSION, ns, "taskapps", "math").get("status") or {}
        if status.get("verified"):
            return
        time.sleep(0.5)
    raise TimeoutError(f"TaskApp math in {ns} not verified")


def apply_jobs(co: Any, ns: str, url: str, jobs: int, rate: float | None, timeout: float) -> dict[str, Any]:
    """Apply `jobs` RLJobs, paced at `rate` jobs/s (None: all at once); wait until all are Running."""
    watcher = RunningWatch(co, ns, timeout)
    watcher.want = jobs
    watcher.start()
    time.sleep(0.5)
    applied: dict[str, float] = {}

    def create(i: int) -> None:
        body = manifest(i, url)
        applied[body["metadata"]["name"]] = time.monotonic()
        co.create_namespaced_custom_object(GROUP, VERSION, ns, "rljobs", body)

    t0 = time.monotonic()
    if rate is None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(create, range(jobs)))
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            for i in range(jobs):
                time.sleep(max(0.0, t0 + i / rate - time.monotonic()))
                pool.submit(create, i)
    apply_s = time.monotonic() - t0
    watcher.done.wait(timeout)
    running = dict(watcher.running)
    latencies = [running[n] - applied[n] for n in applied if n in running]
    t_end = max(running.values()) if running else time.monotonic()
    # the slowest jobs: name, apply->Running, seconds after the first apply it was applied
    slowest = sorted(((running[n] - applied[n], n) for n in applied if n in running), reverse=True)[:10]
    return {
        "slowest": [[n, round(lat, 2), round(applied[n] - t0, 1)] for lat, n in slowest],
        "jobs": jobs,
        "running": len(running),
        "apply_s": round(apply_s, 2),
        "p50_s": round(percentile(latencies, 0.50), 2),
        "p99_s": round(percentile(latencies, 0.99), 2),
        "max_s": round(max(latencies), 2) if latencies else None,
        "jobs_per_s": round(len(running) / (t_end - t0), 2) if running else 0.0,
    }


def delete_namespace(api: Any, ns: str, timeout: float = 300) -> float:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    t0 = time.monotonic()
    core.delete_namespace(ns)
    while time.monotonic() - t0 < timeout:
        try:
            core.read_namespace(ns)
        except ApiException as err:
            if err.status == 404:
                return time.monotonic() - t0
            raise
        time.sleep(1.0)
    raise TimeoutError(f"namespace {ns} not deleted after {timeout}s")


def top_frames(raw: Path, limit: int = 12) -> dict[str, list[tuple[str, float]]]:
    """From py-spy's raw (collapsed) stacks: the frames where the samples were taken (self) and the
    operator's own functions that held them (inclusive), as % of samples."""
    self_time: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.strip() for f in stack.split(";")]
        self_time[_short(frames[-1])] += n
        for frame in dict.fromkeys(_short(f) for f in frames if "posttrain" in f or "kopf" in f):
            inclusive[frame] += n

    def pct(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / max(1, total), 1)) for k, v in counter.most_common(limit)]

    return {"samples": [("total", float(total))], "self": pct(self_time), "inclusive": pct(inclusive)}


def _short(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (file.py)`; the package for site-packages."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    if "site-packages" in parts:
        rel = parts[parts.index("site-packages") + 1 :]
        path = "/".join(rel[:1] + rel[-1:]) if len(rel) > 1 else "/".join(rel)
    elif "posttrain" in parts:
        path = "/".join(parts[parts.index("posttrain") :])
    else:
        path = parts[-1] if parts else path
    return f"{func} ({path})"


def run_bench(cluster: Any, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from kubernetes import client
    from posttrain.local.processes import ProcessSet
    from posttrain.local.taskapp import start_taskapp

    api = api_client_of(cluster)
    ensure_crds(api)
    co = client.CustomObjectsApi(api)
    unrelated_s = make_unrelated(api, args.unrelated) if args.unrelated else 0.0
    unrelated_running_s = wait_unrelated_running(api, args.unrelated) if args.unrelated else 0.0
    stamp = int(time.time())
    paced_ns, burst_ns = f"bench-paced-{stamp}", f"bench-burst-{stamp}"
    env = {"POSTTRAIN_COUNT_KOPF_REQUESTS": "1", "POSTTRAIN_S3_ENDPOINT": "http://127.0.0.1:9",
           "POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128"}  # fmt: skip
    if args.operator_pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([args.operator_pythonpath, os.environ.get("PYTHONPATH", "")])
    out: dict[str, Any] = {"cpu": cpu_model(), "jobs": args.jobs, "nodes": args.nodes,
                           "gpus_per_node": args.gpus_per_node, "unrelated_configmaps": args.unrelated,
                           "unrelated_pods": args.unrelated, "unrelated_setup_s": round(unrelated_s, 1),
                           "unrelated_running_s": round(unrelated_running_s, 1),
                           "operator_pythonpath": args.operator_pythonpath or str(REPO / "operator")}  # fmt: skip
    with ProcessSet() as procs:
        url, _ = start_taskapp(procs, api_key=KEY, log_dir=workdir)
        job_namespace(api, paced_ns, url)
        operator = OperatorProcess(kubeconfig_of(cluster), workdir / "operator.log", env=env)  # cluster-wide
        operator.start()
        try:
            sampler = RssSampler(operator.pid)
            sampler.start()
            wait_verified(co, paced_ns)
            time.sleep(2.0)
            profiler = None
            if args.profile:
                cmd = [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(operator.pid), "-r", "50",
                       "-f", "raw", "-o", str(args.profile), "--nonblocking"]  # fmt: skip
                profiler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            phase = Phase(operator)
            out["paced"] = apply_jobs(co, paced_ns, url, args.jobs, args.rate, args.timeout)
            out["paced"].update(phase.end())
            if profiler is not None:
                profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT (not on SIGTERM)
                profiler.wait(60)
            time.sleep(5.0)  # the last Running jobs' status writes settle
            idle = Phase(operator)
            time.sleep(args.idle_seconds)
            out["idle"] = idle.end()
            out["delete_paced_s"] = round(delete_namespace(api, paced_ns), 1)
            job_namespace(api, burst_ns, url)
            wait_verified(co, burst_ns)
            time.sleep(2.0)
            phase = Phase(operator)
            out["burst"] = apply_jobs(co, burst_ns, url, args.jobs, None, args.timeout)
            out["burst"].update(phase.end())
            sampler.stop.set()
            out["peak_rss_mib"] = round(sampler.peak / 2**20, 1)
            out["reconcile_passes"] = operator.counters().get("reconciles")
        finally:
            operator.stop()
    paced, burst, idle = out["paced"], out["burst"], out["idle"]
    done = paced["running"] + burst["running"]
    requests = collections.Counter(paced["requests"]) + collections.Counter(burst["requests"])
    out.update(
        operator_cpu_s_per_job=round((paced["operator_cpu_s"] + burst["operator_cpu_s"]) / max(1, done), 4),
        control_plane_cpu_s_per_job=round(
            (paced["control_plane_cpu_s"] + burst["control_plane_cpu_s"]) / max(1, done), 4
        ),
        requests_per_job=round(sum(requests.values()) / max(1, done), 2),
        writes_per_job=round(sum(requests[m] for m in WRITES) / max(1, done), 2),
        requests_by_verb_per_job={k: round(v / max(1, done), 2) for k, v in sorted(requests.items())},
        paced_p50_s=paced["p50_s"],
        paced_p99_s=paced["p99_s"],
        burst_jobs_per_s=burst["jobs_per_s"],
        idle_cpu_pct=round(100.0 * idle["operator_cpu_s"] / idle["wall_s"], 2),
        idle_control_plane_cpu_pct=round(100.0 * idle["control_plane_cpu_s"] / idle["wall_s"], 2),
    )
    if args.profile and Path(args.profile).exists():
        out["profile_top"] = top_frames(Path(args.profile))
    return out


def big_toml(kib: int, i: int) -> str:
    """A TOML of `kib` KiB (the CRD's maxLength counts characters): comments after a real [job] table."""
    head = f"# bench job {i}\n[job]\nmodel = \"posttrain/tiny-random-qwen2\"\n"
    line = "# " + "x" * 97 + "\n"
    return (head + line * (kib * 1024 // len(line)))[: kib * 1024]


def memory_bench(cluster: Any, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """N suspended SFTJobs with the largest originalToml; the operator's RSS once it holds them all."""
    from kubernetes import client

    api = api_client_of(cluster)
    ensure_crds(api)
    co = client.CustomObjectsApi(api)
    ns = f"bench-memory-{int(time.time())}"
    client.CoreV1Api(api).create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    env = {"POSTTRAIN_S3_ENDPOINT": "http://127.0.0.1:9", "POSTTRAIN_NAMESPACE": ns}
    operator = OperatorProcess(kubeconfig_of(cluster), workdir / "operator.log", env=env)
    operator.start()
    out: dict[str, Any] = {"cpu": cpu_model(), "memory_jobs": args.memory_jobs, "toml_kib": args.toml_kib}
    try:
        sampler = RssSampler(operator.pid)
        sampler.start()
        out["rss_idle_mib"] = round(psutil.Process(operator.pid).memory_info().rss / 2**20, 1)

        def create(i: int) -> None:
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "SFTJob", "metadata": {"name": f"mem-{i:05d}"},
                    "spec": {"suspend": True, "model": {"base": "posttrain/tiny-random-qwen2"},
                             "algorithm": {"type": "offline", "method": "sft", "variety": "fft"},
                             "compute": {"gpuType": "H100", "gpuCount": 1},
                             "dataset": {"uri": "s3://posttrain/datasets/x.jsonl"},
                             "hyperparameters": {"nEpochs": 1}, "originalToml": big_toml(args.toml_kib, i)}}  # fmt: skip
            co.create_namespaced_custom_object(GROUP, VERSION, ns, "sftjobs", body)

        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, range(args.memory_jobs)))
        out["create_s"] = round(time.monotonic() - t0, 1)
        out["loops"] = wait_for_loops(operator, args.memory_jobs, args.timeout)
        time.sleep(10.0)  # every loop's first pass (parse, render) done
        out["rss_mib"] = rss_mib(operator)
        # kopf's per-object workers keep their last event (the whole body) until idle for
        # settings.queueing.idle_timeout (controller/main.py): the steady state is well after that
        out["rss_settled_mib"], out["peak_rss_mib"] = settled(operator, sampler, 75.0)
    finally:
        operator.stop()
    # A restart (a new version, a lost Lease) meets every job at once: kopf lists them all, and each
    # job's first event and loop start together.
    operator = OperatorProcess(kubeconfig_of(cluster), workdir / "operator-restart.log", env=env)
    try:
        t0 = time.monotonic()
        operator.start()
        sampler = RssSampler(operator.pid)
        sampler.start()
        out["restart_loops"] = wait_for_loops(operator, args.memory_jobs, args.timeout)
        out["restart_s"] = round(time.monotonic() - t0, 1)
        out["restart_rss_settled_mib"], out["restart_peak_rss_mib"] = settled(operator, sampler, 30.0)
    finally:
        operator.stop()
    return out


def rss_mib(operator: OperatorProcess) -> float:
    return round(psutil.Process(operator.pid).memory_info().rss / 2**20, 1)


def settled(operator: OperatorProcess, sampler: RssSampler, wait: float) -> tuple[float, float]:
    """After `wait` seconds: the operator's RSS then and its peak since the sampler started (MiB)."""
    time.sleep(wait)
    rss = rss_mib(operator)
    sampler.stop.set()
    return rss, round(sampler.peak / 2**20, 1)


def wait_for_loops(operator: OperatorProcess, jobs: int, timeout: float) -> int | None:
    """Until the operator runs a loop for each of `jobs` (or the timeout); the loops it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (operator.probe().get("posttrain") or {}).get("loops", 0) < jobs:
        time.sleep(1.0)
    return (operator.probe().get("posttrain") or {}).get("loops")


def share(phase: dict[str, Any]) -> str:
    op, cp = phase["operator_cpu_s"], phase["control_plane_cpu_s"]
    total = sum(phase["cpu_s"].values()) or 1.0
    return (f"operator {op:.1f} CPU-s ({100 * op / total:.0f} %), control plane {cp:.1f} CPU-s "
            f"({100 * cp / total:.0f} %) of {total:.1f} CPU-s on this machine over {phase['wall_s']:.0f} s")  # fmt: skip


def report(r: dict[str, Any]) -> None:
    print(f"operator bench on {r['cpu']}: {r['jobs']} RLJobs x 2 GPUs per phase, cluster-wide, on {r['nodes']} "
          f"kwok nodes x {r['gpus_per_node']} GPUs, {r['unrelated_configmaps']} unrelated ConfigMaps and "
          f"{r['unrelated_pods']} Pods elsewhere; half the jobs name a TaskApp")  # fmt: skip
    print(f"  operator: {r['operator_pythonpath']}")
    p, b = r["paced"], r["burst"]
    print(f"  paced ({p['jobs']} at the given rate): Running {p['running']}/{p['jobs']}, apply->Running "
          f"p50 {p['p50_s']} s, p99 {p['p99_s']} s (max {p['max_s']} s)")  # fmt: skip
    print(f"    {share(p)}")
    print(f"  idle ({p['running']} jobs Running, {r['idle']['wall_s']:.0f} s): operator {r['idle_cpu_pct']} % of a "
          f"core, control plane {r['idle_control_plane_cpu_pct']} %")  # fmt: skip
    print(f"  burst ({b['jobs']} at once): Running {b['running']}/{b['jobs']}, {r['burst_jobs_per_s']} jobs/s, "
          f"p50 {b['p50_s']} s, p99 {b['p99_s']} s")  # fmt: skip
    print(f"    {share(b)}")
    print(f"  per job (paced + burst): operator {r['operator_cpu_s_per_job']} CPU-s, control plane "
          f"{r['control_plane_cpu_s_per_job']} CPU-s; {r['requests_per_job']} API requests, "
          f"{r['writes_per_job']} writes {r['requests_by_verb_per_job']}")  # fmt: skip
    print(f"  operator peak RSS {r['peak_rss_mib']} MiB; reconcile passes {r['reconcile_passes']}")
    top = r.get("profile_top")
    if top:
        print(f"  py-spy, paced phase ({int(top['samples'][0][1])} samples), self time:")
        for frame, pct in top["self"]:
            print(f"    {pct:5.1f} %  {frame}")
        print("  inclusive (posttrain and kopf frames):")
        for frame, pct in top["inclusive"]:
            print(f"    {pct:5.1f} %  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500, help="RLJobs per phase")
    parser.add_argument("--rate", type=float, default=2.0, help="paced arrivals, jobs per second")
    parser.add_argument("--unrelated", type=int, default=2000, help="unrelated ConfigMaps (and as many Pods)")
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--operator-pythonpath", help="import the operator from this directory (another tree)")
    parser.add_argument("--profile", type=Path, help="py-spy the operator through the paced phase into this file")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object, last line")
    parser.add_argument("--json-file", type=Path, help="also write the figures to this file")
    parser.add_argument("--memory-jobs", type=int, default=0, help="only the memory phase, with this many jobs")
    parser.add_argument("--toml-kib", type=int, default=256, help="originalToml of each memory-phase job (KiB)")
    args = parser.parse_args()
    from posttrain_dev.devcluster import DevCluster

    with tempfile.TemporaryDirectory(prefix="bench-operator-") as tmp:
        workdir = Path(tmp)
        (workdir / "cluster").mkdir()
        dev = DevCluster(workdir / "cluster", nodes=args.nodes, gpus_per_node=args.gpus_per_node, start_timeout=300)
        with dev as cluster:
            try:
                if args.memory_jobs:
                    result = memory_bench(cluster, args, workdir)
                    print(f"operator memory on {result['cpu']}: {result['memory_jobs']} suspended SFTJobs x "
                          f"{result['toml_kib']} KiB originalToml: loops {result['loops']}, RSS {result['rss_mib']} MiB, "
                          f"{result['rss_settled_mib']} MiB 75 s later "
                          f"(peak {result['peak_rss_mib']}, idle {result['rss_idle_mib']}); after a restart: loops "
                          f"{result['restart_loops']} in {result['restart_s']} s, peak {result['restart_peak_rss_mib']} "
                          f"MiB, {result['restart_rss_settled_mib']} MiB 30 s later; limit 1024 MiB")  # fmt: skip
                    print(json.dumps(result))
                    return 0
                result = run_bench(cluster, args, workdir)
            finally:
                if args.json_file and (workdir / "operator.log").exists():  # kept beside the figures
                    shutil.copy(workdir / "operator.log", args.json_file.with_suffix(".operator.log"))
    report(result)
    if args.json_file:
        args.json_file.write_text(json.dumps(result, indent=2))
    if args.json:
        print(json.dumps(result))
    ok = result["paced"]["running"] == args.jobs and result["burst"]["running"] == args.jobs
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
