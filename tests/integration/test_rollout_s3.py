"""Model and weight folders from s3:// (the rollout server's --model s3://... and POST /v1/weights with an s3
path): a real S3 server (SeaweedFS), keys from the environment only."""

from __future__ import annotations

import pytest
from posttrain_rollout.weights import download_s3_dir, local_path


def _upload(client, bucket, folder, prefix):
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            client.fput_object(bucket, prefix + str(f.relative_to(folder)), str(f))


def test_s3_model_folder_is_mirrored(s3_env, tiny_model_dir, tmp_path):
    client = s3_env.client()
    _upload(client, s3_env.bucket, tiny_model_dir, "models/tiny/")
    got = local_path(f"s3://{s3_env.bucket}/models/tiny", tmp_path / "cache", "base")
    want = {f.name: f.read_bytes() for f in tiny_model_dir.iterdir() if f.is_file()}
    assert {f.name: f.read_bytes() for f in got.iterdir()} == want
    # a second download replaces the folder whole; no temp folders are left behind
    download_s3_dir(f"s3://{s3_env.bucket}/models/tiny/", got)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["base"]


def test_s3_missing_prefix_and_missing_keys(s3_env, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError):
        local_path(f"s3://{s3_env.bucket}/nothing/here/", tmp_path, "x")
    monkeypatch.delenv("S3_ACCESS_KEY_ID")
    with pytest.raises(RuntimeError, match="S3_ACCESS_KEY_ID"):
        local_path(f"s3://{s3_env.bucket}/models/tiny/", tmp_path, "y")
    with pytest.raises(FileNotFoundError):
        local_path(str(tmp_path / "absent"), tmp_path, "z")
