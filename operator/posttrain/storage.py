"""S3 helpers on the minio SDK: the trainer's only way to object storage.

Credentials come only from the environment (S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY) and are never logged.
URIs look like s3://bucket/key; a "directory" is a key prefix ending in "/"."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from minio import Minio
from minio.error import S3Error

from posttrain.api.jobfile import StorageRef

ACCESS_KEY_ENV = "S3_ACCESS_KEY_ID"
SECRET_KEY_ENV = "S3_SECRET_ACCESS_KEY"
_CACHE_MARKER = ".posttrain-s3-etags.json"


def s3_uri(bucket: str, key: str) -> str:
    return f"s3://{bucket}/{key.lstrip('/')}"


def is_s3_uri(value: str | os.PathLike | None) -> bool:
    return isinstance(value, str) and value.startswith("s3://")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/key -> ("bucket", "some/key")."""
    if not is_s3_uri(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    rest = uri[len("s3://") :]
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def _endpoint_and_secure(endpoint: str, secure: bool) -> tuple[str, bool]:
    if "://" in endpoint:
        parsed = urlparse(endpoint)
        return parsed.netloc, parsed.scheme == "https"
    return endpoint, secure


def client_from_env(storage: StorageRef | dict[str, Any]) -> Minio:
    """A minio client for the job's storage; keys from S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY."""
    if isinstance(storage, dict):
        storage = StorageRef.model_validate(storage)
    access, secret = os.environ.get(ACCESS_KEY_ENV), os.environ.get(SECRET_KEY_ENV)
    if not access or not secret:
        raise RuntimeError(f"S3 credentials missing: set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}")
    endpoint, secure = _endpoint_and_secure(storage.endpoint, storage.secure)
    # A region skips GetBucketLocation, which keys limited to the namespace's folder may not be allowed.
    region = storage.region or os.environ.get("S3_REGION") or None
    return Minio(endpoint, access_key=access, secret_key=secret, secure=secure, region=region)


def ensure_bucket(client: Minio, bucket: str) -> None:
    """Make the bucket when it is missing. Keys limited to a namespace's folder may not ask (AccessDenied):
    the bucket is the install's then, and exists."""
    try:
        if not client.bucket_exists(bucket):
            client.make_bucket(bucket)
    except S3Error as err:
        if err.code != "AccessDenied":
            raise


def put_bytes(
    client: Minio, bucket: str, key: str, data: bytes, content_type: str = "application/octet-stream"
) -> str:
    client.put_object(bucket, key, io.BytesIO(data), len(data), content_type=content_type)
    return s3_uri(bucket, key)


def get_bytes(client: Minio, bucket: str, key: str) -> bytes:
    response = client.get_object(bucket, key)
    try:
        return response.read()
    finally:
        response.close()
        response.release_conn()


def put_json(client: Minio, bucket: str, key: str, obj: Any) -> str:
    return put_bytes(client, bucket, key, json.dumps(obj, indent=2, default=str).encode(), "application/json")


def get_json(client: Minio, bucket: str, key: str) -> Any:
    return json.loads(get_bytes(client, bucket, key))


def exists(client: Minio, bucket: str, key: str) -> bool:
    try:
        client.stat_object(bucket, key)
        return True
    except S3Error as err:
        if err.code in ("NoSuchKey", "NoSuchObject", "NotFound", "NoSuchBucket"):
            return False
        raise


def list_prefix(client: Minio, bucket: str, prefix: str, recursive: bool = True) -> list[str]:
    """Object keys under prefix (recursive), or immediate children (keys and "dir/" prefixes) otherwise."""
    return [obj.object_name for obj in client.list_objects(bucket, prefix=prefix, recursive=recursive)]


def upload_file(client: Minio, local: str | Path, bucket: str, key: str) -> str:
    client.fput_object(bucket, key, str(local))
    return s3_uri(bucket, key)


def upload_dir(client: Minio, local_dir: str | Path, bucket: str, prefix: str) -> str:
    """Upload every file under local_dir to bucket/prefix/...; returns the s3:// URI of the prefix."""
    local_dir = Path(local_dir)
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    for path in sorted(local_dir.rglob("*")):
        if path.is_file() and path.name != _CACHE_MARKER:
            client.fput_object(bucket, prefix + path.relative_to(local_dir).as_posix(), str(path))
    return s3_uri(bucket, prefix)


def download_file(client: Minio, uri: str, local: str | Path) -> Path:
    bucket, key = parse_s3_uri(uri)
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    client.fget_object(bucket, key, str(local))
    return local


def default_cache_dir() -> Path:
    return Path(os.environ.get("POSTTRAIN_S3_CACHE", Path.home() / ".cache" / "posttrain" / "s3"))


def download_dir(client: Minio, uri: str, local_dir: str | Path | None = None) -> Path:
    """Mirror an s3:// prefix into a local folder and return it.

    Cached: without local_dir the folder is <cache>/<sha of the URI>; a marker file records the etags, and a
    second call with an unchanged listing downloads nothing."""
    bucket, prefix = parse_s3_uri(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if local_dir is None:
        local_dir = default_cache_dir() / hashlib.sha256(uri.encode()).hexdigest()[:16]
    local_dir = Path(local_dir)
    objects = [o for o in client.list_objects(bucket, prefix=prefix, recursive=True) if not o.is_dir]
    if not objects:
        raise FileNotFoundError(f"nothing stored under {uri}")
    etags = {o.object_name[len(prefix) :]: o.etag for o in objects}
    marker = local_dir / _CACHE_MARKER
    if marker.exists():
        try:
            if json.loads(marker.read_text()) == etags:
                return local_dir
        except ValueError:
            pass
    if marker.exists():  # a stale copy made by us: start clean (never wipe a folder we did not create)
        shutil.rmtree(local_dir)
    local_dir.mkdir(parents=True, exist_ok=True)
    for obj in objects:
        rel = obj.object_name[len(prefix) :]
        client.fget_object(bucket, obj.object_name, str(local_dir / rel))
    marker.write_text(json.dumps(etags))
    return local_dir


def delete_prefix(client: Minio, bucket: str, prefix: str) -> None:
    from minio.deleteobjects import DeleteObject

    errors = client.remove_objects(bucket, [DeleteObject(k) for k in list_prefix(client, bucket, prefix)])
    for error in errors:
        raise RuntimeError(f"could not delete {error.name}: {error.message}")
