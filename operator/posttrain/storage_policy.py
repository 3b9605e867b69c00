"""Pure: what a namespace's S3 credentials may do, rendered for each store posttrain meets (docs/storage.md).

A namespace's jobs read and write only `jobs/<namespace>/` of the bucket, and read the shared base models
under `models/` (POSTTRAIN_BASE_MODEL_URI). Another namespace's folder is readable only where that
namespace shares its models with it (`read_from`: the storage half of the operator setting
POSTTRAIN_SHARED_MODELS, see read_from()). One rule, three renderings:

- iam_policy: an AWS IAM policy document (prod S3), also MinIO's policy format. With the namespace
  `${aws:username}` it is one policy for every MinIO user named after its namespace (the dev overlay).
- seaweed_actions: SeaweedFS identities (`-s3.config`): "Action:bucket/prefix*" grants Action on every key
  starting with prefix (its canDo matches a trailing * as a prefix; without it an action names a bucket).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from posttrain.api.model_ids import SHARED_MODEL_PREFIX, namespace_prefix

SHARED_READ_PREFIXES = (SHARED_MODEL_PREFIX,)  # base models: the same for every namespace, read-only


def read_from(namespace: str, shared_models: dict[str, list[str]]) -> list[str]:
    """The namespaces whose folders `namespace` may read, from the operator's shared_models setting."""
    return sorted(
        owner
        for owner, readers in shared_models.items()
        if owner != namespace and (namespace in readers or "*" in readers)
    )


FINAL_DIR = "final/"  # a job's final model: jobs/<ns>/<name>-<uid8>/final/ (model_ids.resolve_model_source)


def shared_models_pattern(owner: str) -> str:
    """What a namespace that `owner` shares its models with may read of owner's folder: the final models
    only (jobs/<owner>/*/final/), never its datasets, checkpoints or traces. `*` is a wildcard of the
    policy languages (IAM's resources and StringLike, SeaweedFS's actions)."""
    return f"{namespace_prefix(owner)}*/{FINAL_DIR}"


def readable_prefixes(namespace: str, read_from: Iterable[str] = ()) -> list[str]:
    """Key prefixes (patterns) a namespace's credentials may read (the first one it may also write and
    delete): its own folder, the final models of the namespaces sharing theirs with it, the base models."""
    return [namespace_prefix(namespace), *(shared_models_pattern(ns) for ns in read_from), *SHARED_READ_PREFIXES]


def seaweed_actions(bucket: str, namespace: str, read_from: Iterable[str] = ()) -> list[str]:
    own = f"{bucket}/{namespace_prefix(namespace)}*"
    actions = [f"Read:{own}", f"Write:{own}", f"List:{own}", f"Tagging:{own}"]
    for prefix in readable_prefixes(namespace, read_from)[1:]:
        actions += [f"Read:{bucket}/{prefix}*", f"List:{bucket}/{prefix}*"]
    return actions


def seaweed_identity(name: str, access_key: str, secret_key: str, actions: list[str]) -> dict[str, Any]:
    return {"name": name, "credentials": [{"accessKey": access_key, "secretKey": secret_key}], "actions": actions}


def iam_policy(bucket: str, namespace: str = "${aws:username}", read_from: Iterable[str] = ()) -> dict[str, Any]:
    """Read/write/delete under jobs/<namespace>/, read under the shared and the sharing prefixes; listing
    only with those prefixes; GetBucketLocation so that S3 clients can find the bucket's region."""
    own = namespace_prefix(namespace)
    readable = readable_prefixes(namespace, read_from)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "Location",
                "Effect": "Allow",
                "Action": ["s3:GetBucketLocation"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
            },
            {
                "Sid": "ListOwnAndShared",
                "Effect": "Allow",
                "Action": ["s3:ListBucket"],
                "Resource": [f"arn:aws:s3:::{bucket}"],
                "Condition": {"StringLike": {"s3:prefix": [f"{p}*" for p in readable]}},
            },
            {
                "Sid": "ReadWriteOwnFolder",
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": [f"arn:aws:s3:::{bucket}/{own}*"],
            },
            {
                "Sid": "ReadSharedModels",
                "Effect": "Allow",
                "Action": ["s3:GetObject"],
                "Resource": [f"arn:aws:s3:::{bucket}/{p}*" for p in readable[1:]],
            },
        ],
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m posttrain.storage_policy --bucket B --namespace NS`: the IAM policy of one namespace."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m posttrain.storage_policy", description=main.__doc__)
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--read-from", action="append", default=[], help="a namespace that shares its models")
    parser.add_argument("--format", choices=["iam", "seaweedfs"], default="iam")
    args = parser.parse_args(argv)
    if args.format == "iam":
        print(json.dumps(iam_policy(args.bucket, args.namespace, args.read_from), indent=2))
    else:
        print(json.dumps(seaweed_actions(args.bucket, args.namespace, args.read_from), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
