"""`python -m posttrain.minio_tenants`: give each namespace its own MinIO user, limited to its folder.

The install's half of storage per tenant (docs/storage.md) for MinIO: for every file in --keys-dir (the
file's name is a namespace, its content that namespace's secret key) a MinIO user named after the
namespace, and a policy posttrain-ns-<namespace> (storage_policy.iam_policy: jobs/<namespace>/ read/write,
models/ and the folders of namespaces that share with it read-only) attached to it. The same pair goes into
that namespace's Secret posttrain-s3 (S3_ACCESS_KEY_ID = the namespace, S3_SECRET_ACCESS_KEY = the key),
the only S3 keys its jobs see. MinIO's root keys come from MINIO_ROOT_USER / MINIO_ROOT_PASSWORD and stay
in this process. Idempotent: run again after adding a namespace (the dev overlay runs it as a Job)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from posttrain import storage_policy

POLICY_PREFIX = "posttrain-ns-"


@dataclass(frozen=True)
class TenantUser:
    namespace: str
    secret_key: str
    policy_name: str
    policy: dict[str, Any]


def plan(keys: dict[str, str], bucket: str, shared_models: dict[str, list[str]]) -> list[TenantUser]:
    """Pure: the MinIO user and policy of each namespace in `keys` ({namespace: secret key})."""
    users = []
    for namespace, secret in sorted(keys.items()):
        if len(secret) < 8:
            raise ValueError(f"the key of namespace {namespace!r} is shorter than MinIO's 8 characters")
        read_from = storage_policy.read_from(namespace, shared_models)
        users.append(
            TenantUser(
                namespace,
                secret,
                POLICY_PREFIX + namespace,
                storage_policy.iam_policy(bucket, namespace, read_from),
            )
        )
    return users


def read_keys(folder: Path) -> dict[str, str]:
    """{namespace: key} from a mounted Secret (one file per key; kubelet's ..data links skipped)."""
    return {p.name: p.read_text().strip() for p in sorted(folder.iterdir()) if p.is_file() and not p.name.startswith(".")}


def apply(users: list[TenantUser], endpoint: str, bucket: str, root_user: str, root_password: str) -> None:
    from minio import Minio
    from minio.credentials import StaticProvider
    from minio.minioadmin import MinioAdmin

    parsed = urlparse(endpoint if "://" in endpoint else f"http://{endpoint}")
    secure = parsed.scheme == "https"
    client = Minio(parsed.netloc, access_key=root_user, secret_key=root_password, secure=secure)
    if not client.bucket_exists(bucket):
        client.make_bucket(bucket)
    admin = MinioAdmin(endpoint=parsed.netloc, credentials=StaticProvider(root_user, root_password), secure=secure)
    for user in users:
        admin.policy_add(user.policy_name, policy=user.policy)
        admin.user_add(user.namespace, user.secret_key)
        try:
            admin.attach_policy([user.policy_name], user=user.namespace)
        except Exception as err:  # noqa: BLE001 - MinIO refuses to attach an attached policy again
            if "already" not in str(err).lower():
                raise
        print(f"namespace {user.namespace}: user and policy {user.policy_name} (jobs/{user.namespace}/)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m posttrain.minio_tenants", description=__doc__.split("\n")[0])
    parser.add_argument("--endpoint", default=os.environ.get("POSTTRAIN_S3_ENDPOINT", "http://minio:9000"))
    parser.add_argument("--bucket", default=os.environ.get("POSTTRAIN_S3_BUCKET", "posttrain"))
    parser.add_argument("--keys-dir", type=Path, required=True, help="one file per namespace: its secret key")
    parser.add_argument(
        "--shared-models",
        default=os.environ.get("POSTTRAIN_SHARED_MODELS", "{}"),
        help="the operator's POSTTRAIN_SHARED_MODELS (JSON): who may read whose folder",
    )
    args = parser.parse_args(argv)
    root_user, root_password = os.environ.get("MINIO_ROOT_USER"), os.environ.get("MINIO_ROOT_PASSWORD")
    if not root_user or not root_password:
        print("error: set MINIO_ROOT_USER and MINIO_ROOT_PASSWORD (MinIO's root keys)", file=sys.stderr)
        return 2
    users = plan(read_keys(args.keys_dir), args.bucket, json.loads(args.shared_models))
    apply(users, args.endpoint, args.bucket, root_user, root_password)
    return 0


if __name__ == "__main__":
    sys.exit(main())
