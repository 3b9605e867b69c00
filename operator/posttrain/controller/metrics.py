"""The operator's Prometheus metrics (docs/monitoring.md): jobs by kind, namespace and phase; reconcile passes
and their latency; API requests and errors; task-app verifications; watch restarts. Served by
prometheus_client's own HTTP server on OperatorSettings.metrics_port (the Deployment's `metrics` port).

The counters are incremented where the work happens (controller/loop.py, kube.py, runtime.py,
child_watch.py); the jobs gauge is read at scrape time from the objects the operator's loops hold
(JobLoops.bodies), so it never drifts from what the operator sees. One registry of our own: the process's
default one would mix in whatever else a test process imports."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.process_collector import ProcessCollector

from posttrain.api.resources import PHASES

logger = logging.getLogger("posttrain.operator")
T = TypeVar("T")

REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(namespace="posttrain_operator", registry=REGISTRY)

# Buckets from a fast pass (a few API reads, ~10 ms) to a slow one (a task app's check within a pass).
_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

RECONCILES = Counter(
    "posttrain_operator_reconcile", "Reconcile passes, by kind (rljob, sftjob, taskapp) and result (ok, error).",
    ["kind", "result"], registry=REGISTRY,
)  # fmt: skip
RECONCILE_SECONDS = Histogram(
    "posttrain_operator_reconcile_duration_seconds", "Duration of one reconcile pass, by kind.",
    ["kind"], buckets=_SECONDS, registry=REGISTRY,
)  # fmt: skip
API_REQUESTS = Counter(
    "posttrain_operator_api_requests", "Requests of the operator's own API client (kopf's not counted), by verb.",
    ["method"], registry=REGISTRY,
)  # fmt: skip
API_ERRORS = Counter(
    "posttrain_operator_api_errors",
    "Failed API requests (each try), by verb and HTTP status (0: no response: connection error, timeout).",
    ["method", "code"], registry=REGISTRY,
)  # fmt: skip
VERIFICATIONS = Counter(
    "posttrain_operator_verifications", "Task-app checks (GET /health and /task_info), by result: ok or the "
    "failure reason (Unreachable, Unauthorized, BadResponse, ...).", ["result"], registry=REGISTRY,
)  # fmt: skip
VERIFICATION_SECONDS = Histogram(
    "posttrain_operator_verification_duration_seconds", "Duration of one task-app check, by outcome (ok, failed).",
    ["outcome"], buckets=_SECONDS, registry=REGISTRY,
)  # fmt: skip
WATCH_RESTARTS = Counter(
    "posttrain_operator_watch_restarts",
    "The operator's child watches that failed and listed again, by resource (deployments, jobs, pods).",
    ["resource"], registry=REGISTRY,
)  # fmt: skip

JOB_PHASES = (*PHASES, "Unknown")
TASKAPP_PHASES = ("Pending", "Verified", "Unverified")


def job_phase(kind: str, body: dict[str, Any]) -> str:
    """The phase a job or TaskApp is counted under. A value outside the known set (a status written by hand)
    counts as Unknown: a label value never comes from a tenant's free text."""
    status = body.get("status") or {}
    if kind == "taskapp":
        verified = status.get("verified")
        return "Pending" if verified is None else ("Verified" if verified is True else "Unverified")
    phase = status.get("phase") or "Pending"
    return phase if phase in PHASES else "Unknown"


def phase_counts(bodies: dict[tuple[str, str, str], dict[str, Any]]) -> dict[tuple[str, str, str], int]:
    """{(kind, namespace, phase): count} of the objects a running operator holds (pure)."""
    counts: dict[tuple[str, str, str], int] = {}
    for (namespace, kind, _name), body in bodies.items():
        key = (kind, namespace, job_phase(kind, body))
        counts[key] = counts.get(key, 0) + 1
    return counts


class JobsCollector:
    """posttrain_operator_jobs{kind,namespace,phase}, computed at each scrape from the runtime's objects.
    The scrape runs on the HTTP server's thread: the dict is copied in one step (atomic under the GIL)."""

    def __init__(self) -> None:
        self.runtime: Any = None

    def describe(self) -> list[Any]:
        return []  # no fixed set: the families exist only once an operator runs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "posttrain_operator_jobs", "RLJobs, SFTJobs and TaskApps the operator serves, by kind, namespace and "
            "phase (a TaskApp's: Verified, Unverified, Pending).", labels=["kind", "namespace", "phase"],
        )  # fmt: skip
        runtime = self.runtime
        if runtime is not None:
            bodies = dict(runtime.loops.bodies)
            for (kind, namespace, phase), count in sorted(phase_counts(bodies).items()):
                family.add_metric([kind, namespace, phase], count)
        yield family


JOBS = JobsCollector()
REGISTRY.register(JOBS)


def count_request(method: str) -> None:
    API_REQUESTS.labels(method).inc()


def count_error(method: str, status: int) -> None:
    API_ERRORS.labels(method, str(status)).inc()


@contextlib.contextmanager
def reconcile_pass(kind: str) -> Iterator[None]:
    """Time one pass; an exception counts as an error (and goes on up)."""
    started = time.perf_counter()
    result = "error"
    try:
        yield
        result = "ok"
    finally:
        RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)
        RECONCILES.labels(kind, result).inc()


async def timed_check(check: Callable[[], Awaitable[T]]) -> T:
    """One task-app check (an object with .ok and .reason, controller/verify.py's Attempt), counted."""
    started = time.perf_counter()
    attempt: Any = await check()
    ok = bool(getattr(attempt, "ok", False))
    VERIFICATION_SECONDS.labels("ok" if ok else "failed").observe(time.perf_counter() - started)
    VERIFICATIONS.labels("ok" if ok else str(getattr(attempt, "reason", "") or "failed")[:64]).inc()
    return attempt


def watch_restarted(resource: str) -> None:
    WATCH_RESTARTS.labels(resource).inc()


class MetricsServer:
    """prometheus_client's HTTP server (a thread) serving REGISTRY on host:port."""

    def __init__(self, port: int, host: str):
        self.server, self.thread = start_http_server(port, addr=host, registry=REGISTRY)
        self.port = int(self.server.server_address[1])
        logger.info("metrics on http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def start(runtime: Any) -> MetricsServer | None:
    """Count the runtime's objects in the jobs gauge and serve /metrics on its settings' metrics_port (0: not
    served); the runtime's close() stops the server."""
    JOBS.runtime = runtime
    settings = runtime.settings
    if settings.metrics_port:
        runtime.metrics_server = MetricsServer(settings.metrics_port, settings.metrics_host)
    return runtime.metrics_server
