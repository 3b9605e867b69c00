"""The job's end: final model (or LoRA adapter + base ref), manifest.json, metrics.jsonl, config.json in S3;
the fine_tuned_model id; the result reported to the job's status."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from posttrain import storage as s3
from posttrain.api.jobfile import JobFile
from posttrain.api.model_ids import fine_tuned_model_id

# The artifacts a job reports in its status (the keys of the status' Artifacts); other uploads (a ReST-EM
# iteration's kept samples, ...) are listed in manifest.json only.
REPORTED_ARTIFACTS = ("model", "manifest", "checkpoints", "logs", "config", "metrics", "reward_curve", "traces")


def reported_artifacts(artifacts: dict[str, str]) -> dict[str, str]:
    """The artifacts a job reports in its status, from all it uploaded (a restarted pod of a finished job
    reports the same set from manifest.json)."""
    return {k: artifacts[k] for k in REPORTED_ARTIFACTS if artifacts.get(k)}


def job_model_id(job: JobFile) -> str:
    """The fine_tuned_model id this job produces: `ft:<base>:<ns>.<name>.<uid8>` (SFT) or `rl:...` (RL)."""
    return fine_tuned_model_id(
        "rl" if job.kind == "rl" else "ft", job.base_model, job.job.namespace, job.job.name, job.job.uid
    )


def finalize(
    job: JobFile,
    model,
    tokenizer,
    *,
    metrics: dict[str, Any],
    steps: int,
    metrics_lines: list[dict[str, Any]] | None = None,
    extra_files: dict[str, Path] | None = None,
    client=None,
    state: dict[str, Any] | None = None,
) -> tuple[str, dict[str, str]]:
    """Rank 0 only. Saves final/ locally, uploads everything under storage.prefix when the job has storage
    (else the artifacts are local paths under workdir). Returns (fine_tuned_model, artifacts). `state`: a
    sharded model's gathered full weights (distributed.full_weights)."""
    from posttrain_trainer.modeling import save_final

    model_id = job_model_id(job)
    workdir = Path(job.workdir)
    final_dir = workdir / "final"
    save_final(
        model, tokenizer, final_dir, base_model=job.base_model, base_model_path=job.model_path, state=state
    )
    metrics_path = workdir / "metrics.jsonl"
    metrics_path.write_text("".join(json.dumps(line, default=str) + "\n" for line in (metrics_lines or [])))
    config_path = workdir / "config.json"
    config_path.write_text(json.dumps(job.record, indent=2, default=str))  # for the record: nothing reads it

    if job.storage is None:
        artifacts = {
            "model": str(final_dir) + "/",
            "manifest": str(workdir / "manifest.json"),
            "checkpoints": "",
            "logs": str(metrics_path),
            "config": str(config_path),
        }
        for name, path in (extra_files or {}).items():
            if Path(path).exists():
                artifacts[name] = str(path)
    else:
        bucket, prefix = job.storage.bucket, job.storage.prefix
        client = client or s3.client_from_env(job.storage)
        artifacts = {
            "model": s3.upload_dir(client, final_dir, bucket, prefix + "final/"),
            "manifest": s3.s3_uri(bucket, prefix + "manifest.json"),
            "checkpoints": s3.s3_uri(bucket, prefix + "checkpoints/"),
            "logs": s3.upload_file(client, metrics_path, bucket, prefix + "metrics.jsonl"),
            "config": s3.upload_file(client, config_path, bucket, prefix + "config.json"),
        }
        artifacts["metrics"] = artifacts["logs"]
        for name, path in (extra_files or {}).items():
            if Path(path).exists():
                artifacts[name] = s3.upload_file(client, path, bucket, prefix + Path(path).name)
    manifest = {
        "fine_tuned_model": model_id,
        "kind": job.kind,
        "base_model": job.base_model,
        "model_path": job.model_path,
        "trainer_mode": job.settings.trainer_mode,  # posttrain.api.settings.trainer_mode, resolved once
        "job": job.job.model_dump(),
        "steps": steps,
        "metrics": metrics,
        "config": job.record,
        "artifacts": artifacts,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (workdir / "manifest.json").write_text(json.dumps(manifest, indent=2, default=str))
    if job.storage is not None:
        s3.put_json(client, job.storage.bucket, job.storage.prefix + "manifest.json", manifest)
    reported = reported_artifacts(artifacts)
    return model_id, reported
