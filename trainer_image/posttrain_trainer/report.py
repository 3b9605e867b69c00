"""Progress and the final result: to stdout always, and by report.mode to a JSONL file or to the job's status.

Keys follow the custom resource (camelCase): step, total, loss, meanReturn, judgeScores, judgeFailed,
truncated, tokensPerSecond, evalScore, lastCheckpoint, updatedAt; result {fineTunedModel, artifacts}. Only rank 0
reports. Secrets never pass through here (the job file holds none, and nothing from the environment is written)."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from posttrain.api.jobfile import JobFile
from posttrain.api.resources import progress_display

from posttrain_trainer.live import LiveCurves
from posttrain_trainer.telemetry import StepMetrics
from posttrain_trainer.trackers import Trackers

PROGRESS_KEYS = {
    "step": "step",
    "total": "total",
    "display": "display",
    "loss": "loss",
    "mean_return": "meanReturn",
    "judge_scores": "judgeScores",
    "judge_failed": "judgeFailed",
    "truncated": "truncated",
    "tokens_per_second": "tokensPerSecond",
    "sampler_mismatch": "samplerMismatch",
    "sampler_kl": "samplerKl",
    "sampler_max_abs_delta": "samplerMaxAbsDelta",
    "eval_score": "evalScore",
    "last_checkpoint": "lastCheckpoint",
    "metrics": "metrics",
    "updated_at": "updatedAt",
}

# The job's managedFields name the trainer as the writer of status.progress and status.result (the client's
# default would be "OpenAPI-Generator", which says nothing).
FIELD_MANAGER = "posttrain-trainer"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def camel_progress(**fields: Any) -> dict[str, Any]:
    """snake_case or camelCase progress fields -> the status.progress shape (unknown keys dropped)."""
    out: dict[str, Any] = {}
    allowed = set(PROGRESS_KEYS.values())
    for key, value in fields.items():
        name = PROGRESS_KEYS.get(key, key)
        if name in allowed and value is not None:
            out[name] = _clean(value)
    if "step" in out:  # the Progress column of `kubectl get` (a JSONPath cannot join step and total)
        out["display"] = progress_display(out["step"], out.get("total"))
    out.setdefault("updatedAt", _now())
    return out


def camel_result(fine_tuned_model: str, artifacts: dict[str, str]) -> dict[str, Any]:
    """status.result: camelCase keys, as the custom resource's schema spells them (reward_curve ->
    rewardCurve); the API server would prune snake_case ones."""
    camel = {re.sub(r"_([a-z])", lambda m: m.group(1).upper(), k): v for k, v in artifacts.items()}
    return {"fineTunedModel": fine_tuned_model, "artifacts": camel}


class Reporter:
    """Reporter(jobfile).progress(step=..., total=..., loss=...); .result(fine_tuned_model, artifacts);
    .event(name, **fields) for extra JSONL lines (file mode) such as evaluations and resumes."""

    def __init__(self, job: JobFile, *, enabled: bool = True, min_patch_interval_s: float | None = None):
        self.job = job
        self.mode = job.report.mode
        self.enabled = enabled
        # Status patches are throttled (default 1 s, POSTTRAIN_STATUS_INTERVAL_S) so that fast steps do not
        # flood the API server; the last step and the result are always sent. stdout/file get every step.
        if min_patch_interval_s is None:
            min_patch_interval_s = float(os.environ.get("POSTTRAIN_STATUS_INTERVAL_S", "1.0"))
        self.min_patch_interval_s = min_patch_interval_s
        self._last_patch = 0.0
        self._api = None
        self.path = Path(job.report.path) if job.report.path else Path(job.workdir) / "report.jsonl"
        if self.enabled and self.mode == "file":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        # rank 0's /metrics (telemetry.py) and the curve uploaded while the job runs (live.py)
        self.metrics = StepMetrics(job, enabled=enabled)
        self.live = LiveCurves(job, enabled=enabled)
        self.trackers = Trackers(job, enabled=enabled)  # [training] report_to (trackers.py)
        self.live.extra_uploads.append(self.trackers.upload)

    # -- sinks ---------------------------------------------------------------------------------------
    def _stdout(self, kind: str, payload: dict[str, Any]) -> None:
        print(f"[posttrain] {kind} {json.dumps(payload, default=str)}", flush=True)

    def _file(self, line: dict[str, Any]) -> None:
        with self.path.open("a") as handle:
            handle.write(json.dumps(line, default=str) + "\n")

    def _k8s_api(self):
        """In-cluster config in a pod; elsewhere the kubeconfig named by $KUBECONFIG (read now, not at import)."""
        if self._api is None:
            from kubernetes import client, config

            configuration = client.Configuration()
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(
                    config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration
                )
            self._api = client.CustomObjectsApi(client.ApiClient(configuration))
        return self._api

    def _patch_status(self, status: dict[str, Any]) -> None:
        ref = self.job.job
        try:
            self._k8s_api().patch_namespaced_custom_object_status(
                ref.group,
                ref.version,
                ref.namespace,
                self.job.plural,
                ref.name,
                {"status": status},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
            )
        except Exception as err:  # progress must never kill training
            print(
                f"[posttrain] status patch failed: {type(err).__name__}: {getattr(err, 'reason', '')}",
                file=sys.stderr,
                flush=True,
            )

    # -- API -----------------------------------------------------------------------------------------
    def record(self, line: dict[str, Any], history: list[dict[str, Any]]) -> None:
        """One metrics.jsonl line (already appended to `history`): to /metrics and, when due, the live curve."""
        if not self.enabled:
            return
        self.metrics.observe(line)
        self.trackers.log(line)
        self.live.update(history)

    def progress(self, **fields: Any) -> dict[str, Any]:
        if self.live.uri and "metrics" not in fields:
            fields["metrics"] = self.live.uri
        progress = camel_progress(**fields)
        if not self.enabled:
            return progress
        self._stdout("progress", progress)
        if self.mode == "file":
            self._file({"progress": progress})
        elif self.mode == "kubernetes":
            now = time.monotonic()
            final = fields.get("step") is not None and fields.get("step") == fields.get("total")
            if final or not self._last_patch or now - self._last_patch >= self.min_patch_interval_s:
                self._last_patch = now
                self._patch_status({"progress": progress})
        return progress

    def progress_now(self, **fields: Any) -> dict[str, Any]:
        """progress(), patched at once (the last report of a run that stops: no later step would send it)."""
        self._last_patch = 0.0
        return self.progress(**fields)

    def event(self, name: str, **fields: Any) -> None:
        if not self.enabled:
            return
        payload = {"event": name, **{k: _clean(v) for k, v in fields.items()}, "at": _now()}
        self._stdout("event", payload)
        if self.mode == "file":
            self._file(payload)

    def result(self, fine_tuned_model: str, artifacts: dict[str, str]) -> None:
        if not self.enabled:
            return
        snake = {"fine_tuned_model": fine_tuned_model, "artifacts": dict(artifacts)}
        self._stdout("result", snake)
        if self.mode == "file":
            self._file({"result": snake})
        elif self.mode == "kubernetes":
            self._patch_status({"result": camel_result(fine_tuned_model, artifacts)})

    def final(self, fine_tuned_model: str, artifacts: dict[str, str], **progress: Any) -> dict[str, Any]:
        """The job's last progress line and its result; returns the result as metrics fields."""
        self.progress(**progress)
        self.result(fine_tuned_model, artifacts)
        self.metrics.close()
        self.trackers.close()
        self.live.upload_extra()  # the last event files
        return {"fine_tuned_model": fine_tuned_model, "artifacts": artifacts}
