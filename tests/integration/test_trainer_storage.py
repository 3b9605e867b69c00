"""storage.py and s3server.py against a real SeaweedFS."""

from __future__ import annotations

import pytest
from minio.error import S3Error
from posttrain import storage as s3


def test_upload_download_dir_roundtrip_and_cache(s3_env, tmp_path):
    client = s3.client_from_env(s3_env.storage())
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.bin").write_bytes(b"\x00\x01" * 1000)
    uri = s3.upload_dir(client, src, s3_env.bucket, "t/roundtrip/")
    assert uri == f"s3://{s3_env.bucket}/t/roundtrip/"
    assert sorted(s3.list_prefix(client, s3_env.bucket, "t/roundtrip/")) == [
        "t/roundtrip/a.txt",
        "t/roundtrip/sub/b.bin",
    ]
    dst = s3.download_dir(client, uri, tmp_path / "dst")
    assert (dst / "a.txt").read_text() == "alpha"
    assert (dst / "sub" / "b.bin").read_bytes() == b"\x00\x01" * 1000
    # cached: an unchanged prefix is not downloaded again
    (dst / "a.txt").write_text("local edit")
    assert s3.download_dir(client, uri, tmp_path / "dst") == dst
    assert (dst / "a.txt").read_text() == "local edit"
    # changed remote -> fresh copy
    s3.put_bytes(client, s3_env.bucket, "t/roundtrip/a.txt", b"beta")
    s3.download_dir(client, uri, tmp_path / "dst")
    assert (dst / "a.txt").read_text() == "beta"


def test_json_and_exists(s3_env):
    client = s3.client_from_env(s3_env.storage())
    assert not s3.exists(client, s3_env.bucket, "t/j/missing.json")
    s3.put_json(client, s3_env.bucket, "t/j/x.json", {"step": 3, "loss": 1.5})
    assert s3.get_json(client, s3_env.bucket, "t/j/x.json") == {"step": 3, "loss": 1.5}
    assert s3.exists(client, s3_env.bucket, "t/j/x.json")


def test_wrong_keys_are_refused(s3_env, monkeypatch):
    monkeypatch.setenv("S3_SECRET_ACCESS_KEY", "not-the-secret")
    client = s3.client_from_env(s3_env.storage())
    with pytest.raises(S3Error):
        client.list_buckets()


def test_missing_keys_named(monkeypatch, s3_server):
    monkeypatch.delenv("S3_ACCESS_KEY_ID", raising=False)
    with pytest.raises(RuntimeError, match="S3_ACCESS_KEY_ID"):
        s3.client_from_env(s3_server.storage())


def test_server_binds_loopback_only(s3_server):
    assert s3_server.endpoint.startswith("127.0.0.1:")
    assert s3_server.client().bucket_exists(s3_server.bucket)
