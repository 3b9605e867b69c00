"""Scheduling benchmark (not a test): many jobs competing for GPUs, with and without all-or-nothing
admission, in one process on one dev control plane with the real Kueue (posttrain_dev.devcluster with
kueue=True; hack/build-kueue.sh builds it): --nodes kwok nodes x 8 GPUs (128 x 8 = 1,024 GPUs).

The workload: --jobs jobs (300) arrive at random over --arrival-seconds from five namespaces (team-0 sends
the most, team-4 the least). Each job is one of these topologies (GPUs per pod; each pod fits one node):
  sft-8    trainer 1 x 8
  sft-16   trainer 2 x 8
  rl-28    rollout 2 x 4, reference 1 x 4, trainer 2 x 8
  rl-64    rollout 4 x 8, trainer 4 x 8
A job runs for a random --min-run..--max-run seconds once every one of its pods runs, then its pods go.
The pods are real pods on the real kube-scheduler and kwok; a job is only simulated in that its pods do no
work.

  gang     each job first gets the Kueue Workload the operator writes (posttrain.controller.render.workload:
           one pod set per role), in its namespace's LocalQueue; its pods are created once Kueue admits it.
           One ClusterQueue per namespace, each with a fifth of the GPUs, all in one cohort (borrowing), and
           Kueue's fair sharing on (posttrain_dev.kueue).
  no_gang  each job's pods are created as it arrives, and the scheduler places them one by one (as with no
           Kueue, or with Kueue admitting the trainer Job alone while the servers go straight to the
           scheduler).

Figures per mode:
  partial_admissions  jobs that, for more than --partial-grace seconds, held GPUs with some pods while
                      others could not be placed
  deadlocked_jobs     jobs holding GPUs with only part of their pods when the run stopped: the run stops at
                      --horizon or when nothing started or finished for --stall seconds after the last arrival
  gpu_utilization     GPUs held by jobs whose every pod runs (work can happen), over the cluster's GPUs,
                      averaged over the run (from the first arrival to its end); gpu_allocated counts every
                      bound pod (also the idle halves of partial jobs)
  jobs_finished       jobs that ran to the end
  queue_wait_p50_s    per namespace: median seconds from arrival to every pod running, of the jobs that ran

    .venv/bin/python hack/bench_scheduling.py [--jobs 300] [--nodes 128] [--seed 1] [--json]

With --json the last line is one JSON object {"gang": {...}, "no_gang": {...}, "setup": {...}}."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "operator"))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402
from posttrain.controller.gpu_types import DEFAULT_GPU_PRODUCTS, GFD_PRODUCT_LABEL  # noqa: E402
from posttrain.controller.objects import Owner  # noqa: E402
from posttrain.controller.render.gpu import gpu_affinity  # noqa: E402
from posttrain.controller.render.workload import admission, render_workload  # noqa: E402
from posttrain_dev.devcluster import DevCluster  # noqa: E402

KUEUE = ("kueue.x-k8s.io", "v1beta2")
GPU = "nvidia.com/gpu"
NAMESPACES = 5
NS_WEIGHTS = (5, 3, 3, 2, 1)  # team-0 sends the most jobs
# (name, weight, [(role, pods, gpus per pod)])
TOPOLOGIES = (
    ("sft-8", 0.30, (("trainer", 1, 8),)),
    ("sft-16", 0.25, (("trainer", 2, 8),)),
    ("rl-28", 0.25, (("rollout", 2, 4), ("reference", 1, 4), ("trainer", 2, 8))),
    ("rl-64", 0.20, (("rollout", 4, 8), ("trainer", 4, 8))),
)


@dataclass
class SimJob:
    name: str
    namespace: str
    topology: str
    roles: tuple[tuple[str, int, int], ...]
    arrival: float
    duration: float
    state: str = "future"  # future -> submitted -> admitted (gang) -> running -> finished
    started: float | None = None
    partial_since: float | None = None
    partial_counted: bool = False
    bound: int = 0

    @property
    def pods(self) -> int:
        return sum(n for _, n, _ in self.roles)

    @property
    def gpus(self) -> int:
        return sum(n * g for _, n, g in self.roles)


@dataclass
class Result:
    partial_admissions: int = 0
    deadlocked_jobs: int = 0
    gpu_utilization: float = 0.0
    gpu_allocated: float = 0.0
    jobs_finished: int = 0
    jobs_started: int = 0
    queue_wait_p50_s: dict[str, float | None] = field(default_factory=dict)
    window_s: float = 0.0
    stopped_by: str = ""


def make_jobs(args: argparse.Namespace, prefix: str) -> list[SimJob]:
    rng = random.Random(args.seed)  # the same jobs, arrivals and durations in both modes
    out = []
    for i in range(args.jobs):
        ns = rng.choices(range(NAMESPACES), weights=NS_WEIGHTS)[0]
        name, _, roles = rng.choices(TOPOLOGIES, weights=[t[1] for t in TOPOLOGIES])[0]
        out.append(SimJob(f"j{i:03d}-{name}", f"{prefix}-team-{ns}", name, roles,
                          arrival=rng.uniform(0, args.arrival_seconds),
                          duration=rng.uniform(args.min_run, args.max_run)))  # fmt: skip
    return sorted(out, key=lambda j: j.arrival)


def pod_template(gpus: int) -> dict[str, Any]:
    return {
        "containers": [{"name": "main", "image": "bench", "resources": {"limits": {GPU: str(gpus)}}}],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        **{"affinity": gpu_affinity("H100", gpus, GFD_PRODUCT_LABEL, DEFAULT_GPU_PRODUCTS)},
    }


def workload(job: SimJob) -> dict[str, Any]:
    """The Workload posttrain's operator writes for such a job (render_workload from the pod-bearing
    children: the trainer as an Indexed Job, the servers as Deployments), without the owner reference (no
    RLJob exists here; the garbage collector would take it)."""
    children = []
    for role, count, gpus in job.roles:
        labels = {"posttrain.dev/role": role}
        template = {"spec": pod_template(gpus)}
        if role == "trainer":
            spec: dict[str, Any] = {"parallelism": count, "template": template}
            children.append({"kind": "Job", "metadata": {"labels": labels}, "spec": spec})
        else:
            spec = {"replicas": count, "template": template}
            children.append({"kind": "Deployment", "metadata": {"labels": labels}, "spec": spec})
    owner = Owner(kind="RLJob", name=job.name, namespace=job.namespace, uid="00000000-0000-0000-0000-000000000000")
    wl = render_workload(owner, children, "gpus")
    del wl["metadata"]["ownerReferences"]
    return wl


def pods_of(job: SimJob) -> list[dict[str, Any]]:
    out = []
    for role, count, gpus in job.roles:
        for i in range(count):
            out.append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"{job.name}-{role}-{i}", "namespace": job.namespace,
                             "labels": {"bench": "1", "bench/job": job.name}},
                "spec": pod_template(gpus),
            })  # fmt: skip
    return out


def setup_queues(co: client.CustomObjectsApi, core: client.CoreV1Api, prefix: str, gpus: int, gang: bool) -> None:
    for n in range(NAMESPACES):
        ns = f"{prefix}-team-{n}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    if not gang:
        return
    with_quota = [gpus // NAMESPACES + (1 if n < gpus % NAMESPACES else 0) for n in range(NAMESPACES)]
    try:
        co.create_cluster_custom_object(*KUEUE, "resourceflavors", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {GFD_PRODUCT_LABEL: DEFAULT_GPU_PRODUCTS["H100"][0]}}})  # fmt: skip
    except ApiException as err:
        if err.status != 409:
            raise
    for n in range(NAMESPACES):
        ns = f"{prefix}-team-{n}"
        co.create_cluster_custom_object(*KUEUE, "clusterqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
            "spec": {
                "cohortName": f"{prefix}-cohort",
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "queueingStrategy": "BestEffortFIFO",
                "fairSharing": {"weight": "1"},
                "preemption": {"reclaimWithinCohort": "Never", "withinClusterQueue": "Never"},
                "resourceGroups": [{"coveredResources": [GPU], "flavors": [
                    {"name": "h100", "resources": [{"name": GPU, "nominalQuota": with_quota[n]}]}]}],
            }})  # fmt: skip
        co.create_namespaced_custom_object(*KUEUE, ns, "localqueues", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": {"name": "gpus", "namespace": ns}, "spec": {"clusterQueue": ns}})  # fmt: skip


def run_mode(api: client.ApiClient, args: argparse.Namespace, gang: bool, total_gpus: int) -> Result:
    prefix = "g" if gang else "n"
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    setup_queues(co, core, prefix, total_gpus, gang)
    jobs = make_jobs(args, prefix)
    by_name = {j.name: j for j in jobs}
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
    errors: list[str] = []

    def submit(fn: Any, *a: Any, **kw: Any) -> None:
        def call() -> None:
            try:
                fn(*a, **kw)
            except ApiException as err:
                if err.status not in (404, 409):
                    errors.append(f"{fn.__name__}: {err.status} {err.reason}")

        pool.submit(call)

    def create_pods(job: SimJob) -> None:
        for pod in pods_of(job):
            submit(core.create_namespaced_pod, job.namespace, pod)

    def finish(job: SimJob) -> None:
        for pod in pods_of(job):
            submit(core.delete_namespaced_pod, pod["metadata"]["name"], job.namespace,
                   grace_period_seconds=0)  # fmt: skip
        if gang:
            submit(co.delete_namespaced_custom_object, *KUEUE, job.namespace, "workloads", f"{job.name}-workload")

    t0 = time.monotonic()
    useful_gpu_s = allocated_gpu_s = 0.0
    last_tick = t0
    last_change = t0
    stopped_by = "all jobs finished"
    while True:
        now = time.monotonic() - t0
        for job in jobs:
            if job.state == "future" and job.arrival <= now:
                job.state = "submitted"
                if gang:
                    submit(co.create_namespaced_custom_object, *KUEUE, job.namespace, "workloads", workload(job))
                else:
                    create_pods(job)
        if gang:
            wls = co.list_cluster_custom_object(*KUEUE, "workloads")["items"]
            for wl in wls:
                job = by_name.get(wl["metadata"]["name"].removesuffix("-workload"))
                if job is not None and job.state == "submitted" and admission(wl)[0]:
                    job.state = "admitted"
                    create_pods(job)
        pods = core.list_pod_for_all_namespaces(label_selector="bench=1").items
        bound: dict[str, int] = {}
        bound_gpus: dict[str, int] = {}
        running: dict[str, int] = {}
        for pod in pods:
            if pod.metadata.deletion_timestamp is not None:
                continue
            name = pod.metadata.labels["bench/job"]
            if not name.startswith("j") or pod.metadata.namespace.split("-")[0] != prefix:
                continue
            if pod.spec.node_name:
                bound[name] = bound.get(name, 0) + 1
                gpus = int(pod.spec.containers[0].resources.limits[GPU])
                bound_gpus[name] = bound_gpus.get(name, 0) + gpus
            if pod.status.phase == "Running":
                running[name] = running.get(name, 0) + 1
        tick = time.monotonic()
        dt, last_tick = tick - last_tick, tick
        for job in jobs:
            if job.state in ("future", "finished"):
                continue
            job.bound = bound.get(job.name, 0)
            if job.state != "running" and running.get(job.name, 0) == job.pods:
                job.state, job.started, last_change = "running", now, tick
            if job.state == "running":
                useful_gpu_s += job.gpus * dt
                allocated_gpu_s += job.gpus * dt
                if now - (job.started or now) >= job.duration:
                    job.state, last_change = "finished", tick
                    finish(job)
                continue
            allocated_gpu_s += bound_gpus.get(job.name, 0) * dt
            if 0 < job.bound < job.pods:
                job.partial_since = job.partial_since if job.partial_since is not None else now
                if now - job.partial_since > args.partial_grace:
                    job.partial_counted = True
            else:
                job.partial_since = None
        if all(j.state == "finished" for j in jobs):
            break
        if now > args.horizon:
            stopped_by = f"horizon ({args.horizon:.0f} s)"
            break
        if now > args.arrival_seconds and tick - last_change > args.stall:
            stopped_by = f"nothing started or finished for {args.stall:.0f} s"
            break
        time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    window = time.monotonic() - t0
    result = Result(stopped_by=stopped_by, window_s=round(window, 1))
    result.partial_admissions = sum(j.partial_counted for j in jobs)
    result.deadlocked_jobs = sum(1 for j in jobs if j.state not in ("running", "finished") and 0 < j.bound < j.pods)
    result.gpu_utilization = round(useful_gpu_s / (total_gpus * window), 3)
    result.gpu_allocated = round(allocated_gpu_s / (total_gpus * window), 3)
    result.jobs_finished = sum(j.state == "finished" for j in jobs)
    result.jobs_started = sum(j.started is not None for j in jobs)
    for n in range(NAMESPACES):
        ns = f"{prefix}-team-{n}"
        waits = [j.started - j.arrival for j in jobs if j.namespace == ns and j.started is not None]
        result.queue_wait_p50_s[f"team-{n}"] = round(statistics.median(waits), 1) if waits else None
    # Clean up before the other mode: every pod of this one gone.
    pool.shutdown(wait=True)
    for n in range(NAMESPACES):
        core.delete_collection_namespaced_pod(f"{prefix}-team-{n}", grace_period_seconds=0)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and core.list_pod_for_all_namespaces(label_selector="bench=1").items:
        time.sleep(1)
    if errors:
        print(f"{len(errors)} API errors, e.g. {errors[:3]}", file=sys.stderr)
    return result


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--arrival-seconds", type=float, default=90.0)
    parser.add_argument("--min-run", type=float, default=10.0)
    parser.add_argument("--max-run", type=float, default=20.0)
    parser.add_argument("--horizon", type=float, default=420.0)
    parser.add_argument("--stall", type=float, default=30.0)
    parser.add_argument("--partial-grace", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--modes", default="gang,no_gang")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    total = args.nodes * 8
    with tempfile.TemporaryDirectory(prefix="bench-scheduling-") as tmp:
        began = time.monotonic()
        with DevCluster(Path(tmp) / "cluster", nodes=args.nodes, kueue=True, start_timeout=300) as dev:
            print(f"control plane + Kueue ready in {time.monotonic() - began:.0f} s: {args.nodes} kwok nodes x 8 GPUs",
                  flush=True)  # fmt: skip
            api = config.new_client_from_config(config_file=str(dev.kubeconfig))
            out: dict[str, Any] = {}
            for mode in args.modes.split(","):
                began = time.monotonic()
                result = run_mode(api, args, gang=(mode == "gang"), total_gpus=total)
                out[mode] = result.__dict__
                print(f"{mode}: {json.dumps(result.__dict__)} ({time.monotonic() - began:.0f} s)", flush=True)
    out["setup"] = {"nodes": args.nodes, "gpus": total, "jobs": args.jobs, "namespaces": NAMESPACES,
                    "arrival_seconds": args.arrival_seconds, "run_seconds": [args.min_run, args.max_run],
                    "seed": args.seed, "kueue": "v0.17.0 (hack/build-kueue.sh)", "cpu": cpu_model()}  # fmt: skip
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
