"""`posttrain eval --cluster`: the same evaluation as a Kubernetes Job (pure rendering here; the command
applies it and follows it).

The Job runs `posttrain eval` in the rollout image (vLLM + this package) with the model served on the pod's
GPUs, the task app's key from a Secret (ENVIRONMENT_API_KEY), S3 keys from the operator's S3 Secret, and
uploads traces.jsonl and summary.json to s3://<bucket>/jobs/<namespace>/evals/<name>/ (the namespace's
folder: its S3 keys reach no other, docs/storage.md). Its pod carries the
labels posttrain.dev/job=<name> and posttrain.dev/role=eval, so `posttrain logs <name>` finds it. The pod is
locked down: non-root, no privilege escalation, every capability dropped, RuntimeDefault seccomp, no service
account token."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from posttrain.api.model_ids import namespace_prefix

ROLE_EVAL = "eval"
WORKDIR = "/work"
TRACES = f"{WORKDIR}/eval/traces.jsonl"


def eval_job_name(model: str, task: str, seeds: list[int]) -> str:
    """A DNS-1123 name from the evaluation's content: the same evaluation gets the same name."""
    digest = hashlib.sha256(json.dumps([model, task, seeds[:1000]]).encode()).hexdigest()[:8]
    slug = (
        re.sub(r"[^a-z0-9-]+", "-", model.lower().rsplit("/", 1)[-1].split(":")[0]).strip("-")[:30].strip("-")
    )
    return f"eval-{slug or 'model'}-{digest}"


def results_uri(bucket: str, namespace: str, name: str) -> str:
    return f"s3://{bucket}/{namespace_prefix(namespace)}evals/{name}/"


def _eval_env(api_key_secret: str, s3_endpoint: str, s3_secret: str) -> list[dict[str, Any]]:
    """The task app's key and the S3 keys from Secrets (never values in the Job), HOME and HF_HOME on the
    writable work volume."""
    return [
        {"name": "ENVIRONMENT_API_KEY", "valueFrom": {"secretKeyRef": {"name": api_key_secret,
                                                                        "key": "ENVIRONMENT_API_KEY"}}},
        {"name": "S3_ENDPOINT", "value": s3_endpoint},
        *({"name": key, "valueFrom": {"secretKeyRef": {"name": s3_secret, "key": key, "optional": True}}}
          for key in ("S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY")),
        {"name": "HOME", "value": f"{WORKDIR}/home"},
        {"name": "HF_HOME", "value": f"{WORKDIR}/hf"},
    ]  # fmt: skip


def render_eval_job(
    *,
    name: str,
    namespace: str,
    image: str,
    eval_args: list[str],
    results: str,
    api_key_secret: str,
    s3_endpoint: str,
    s3_secret: str,
    gpus: int = 1,
    pull_policy: str = "IfNotPresent",
    deadline_seconds: int = 24 * 3600,
) -> dict[str, Any]:
    """The batch/v1 Job: one pod, no retries (an evaluation that failed is looked at, not repeated)."""
    labels = {"posttrain.dev/job": name, "posttrain.dev/role": ROLE_EVAL,
              "app.kubernetes.io/managed-by": "posttrain-cli"}  # fmt: skip
    env = _eval_env(api_key_secret, s3_endpoint, s3_secret)
    resources: dict[str, Any] = {"requests": {"cpu": "1", "memory": "4Gi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    container = {
        "name": ROLE_EVAL,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": [
            "posttrain",
            "eval",
            *eval_args,
            "--output",
            TRACES,
            "--results-uri",
            results,
            "--runs-dir",
            f"{WORKDIR}/runs",
            "--no-progress",
        ],  # fmt: skip
        "env": env,
        "resources": resources,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [{"name": "work", "mountPath": WORKDIR}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_seconds,
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 65532,
                        "runAsGroup": 65532,
                        "fsGroup": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },  # fmt: skip
                    "containers": [container],
                    "volumes": [{"name": "work", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def job_phase(job: dict[str, Any] | None) -> tuple[str, str]:
    """(Pending | Running | Succeeded | Failed, message) of a batch/v1 Job object."""
    if job is None:
        return "Pending", "not created yet"
    status = job.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Succeeded", ""
        if condition.get("type") in ("Failed", "FailureTarget"):
            return "Failed", f"{condition.get('reason') or ''} {condition.get('message') or ''}".strip()
    if status.get("active"):
        return "Running", ""
    return "Pending", ""
