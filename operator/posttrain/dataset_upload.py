"""Local SFT datasets on their way to a cluster job: checked with the trainer's rules, then uploaded to S3
(when S3_ENDPOINT, S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY are set), or refused with the fix. A job
spec never carries a path that only exists on the machine that wrote it."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from posttrain.api.model_ids import namespace_prefix
from posttrain.errors import Problem, UserError

S3_VARIABLES = ("S3_ENDPOINT", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY")


def s3_configured(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return all(env.get(name) for name in S3_VARIABLES)


def find_local(value: str, config_path: Path | None, *, field: str, file: str | None = None) -> Path:
    """A dataset path as synth reads it (relative to the current folder; the config's folder also works)."""
    candidates = [Path(value)] + ([config_path.parent / value] if config_path is not None else [])
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise UserError(Problem(f"dataset not found: {value}", file=file, field=field,
                            fix="pass an existing JSONL (relative paths resolve against the current folder)"))  # fmt: skip


def check_dataset(path: Path, *, max_images_per_message: int | None = None) -> int:
    """The trainer's rules (posttrain.api.dataset); the number of rows. Warnings go to stderr."""
    import sys

    from posttrain.api.dataset import validate_jsonl

    report = validate_jsonl(path, max_images_per_message=max_images_per_message)
    if report.problems:
        raise UserError(report.problems)
    for warning in report.warnings[:20]:
        print(f"warning: {warning}", file=sys.stderr)
    return report.examples


def upload(path: Path, *, field: str, file: str | None = None, namespace: str | None = None) -> str:
    """s3://$S3_BUCKET/jobs/<namespace>/datasets/<sha16>-<name> (content-addressed: the same file uploads to
    the same key; inside the namespace's folder, the only one its jobs' keys may read: docs/storage.md), or
    datasets/<sha16>-<name> when no namespace is known (keys of the whole bucket). A UserError says how to
    make the file reachable."""
    if not s3_configured():
        raise UserError(
            Problem(
                f"{path} is a local file, which a cluster job cannot read",
                file=file,
                field=field,
                fix="set S3_ENDPOINT, S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY to upload it, or pass an "
                "s3:// URI (posttrain train also puts small files in a ConfigMap)",
            )
        )
    from posttrain import storage

    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    bucket = os.environ.get("S3_BUCKET", "posttrain")
    client = storage.client_from_env({"endpoint": os.environ["S3_ENDPOINT"], "bucket": bucket})
    folder = f"{namespace_prefix(namespace)}datasets/" if namespace else "datasets/"
    key = f"{folder}{digest}-{path.name}"
    try:
        storage.ensure_bucket(client, bucket)
        client.fput_object(bucket, key, str(path))
    except Exception as err:  # noqa: BLE001 - urllib3 and minio errors alike: say S3, not the API server
        raise UserError(
            Problem(
                f"uploading {path} to S3 at {os.environ['S3_ENDPOINT']} failed ({_s3_failure(err)})",
                file=file,
                field=field,
                fix="check S3_ENDPOINT, S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY and S3_BUCKET, and that the "
                "S3 server is up and has room; or pass an s3:// URI",
            )
        ) from err
    return f"s3://{bucket}/{key}"


def _s3_failure(err: BaseException) -> str:
    """A short name for the failure, never the server's own text (it may echo the request)."""
    code = getattr(err, "code", None)
    if isinstance(code, str) and code.isalnum() and len(code) <= 40:
        return code  # an S3 error code: AccessDenied, NoSuchBucket, ...
    reason = getattr(err, "reason", None)
    return type(reason).__name__ if isinstance(reason, BaseException) else type(err).__name__
