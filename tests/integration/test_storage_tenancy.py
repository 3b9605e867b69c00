"""Storage per tenant on a real S3 server (SeaweedFS): a namespace's keys reach only jobs/<namespace>/
(and read the shared models/), never another namespace's folder (operator/posttrain/storage_policy.py)."""

from __future__ import annotations

import io

import pytest
import torch
from minio.deleteobjects import DeleteObject
from minio.error import S3Error
from posttrain.s3server import s3_server
from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import storage as s3
from posttrain_trainer.distributed import ParallelConfig, build_engine

# "team" and "teamb": a prefix check without the trailing slash would let team read teamb's folder.
NAMESPACES = ("team", "teamb", "reader")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with s3_server(
        tmp_path_factory.mktemp("s3-tenants"), namespaces=NAMESPACES, shares={"reader": ("team",)}
    ) as srv:
        root = srv.client()
        for ns in NAMESPACES:
            root.put_object(
                srv.bucket,
                f"jobs/{ns}/job-1/final/model.safetensors",
                io.BytesIO(b"w" + ns.encode()),
                1 + len(ns),
            )
        root.put_object(srv.bucket, "models/tiny/config.json", io.BytesIO(b"{}"), 2)
        yield srv


def _client(server, namespace, monkeypatch):
    """The trainer's own client (storage.client_from_env) with the namespace's keys in its environment."""
    for key, value in server.namespace_env(namespace).items():
        monkeypatch.setenv(key, value)
    return s3.client_from_env(server.storage())


def _denied(call) -> None:
    with pytest.raises(S3Error) as err:
        call()
    assert err.value.code == "AccessDenied", err.value


def test_namespace_keys_reach_only_their_folder(server, monkeypatch):
    client = _client(server, "team", monkeypatch)
    bucket = server.bucket
    own = "jobs/team/job-2/"
    s3.put_bytes(client, bucket, own + "a.json", b"{}")
    assert s3.get_bytes(client, bucket, own + "a.json") == b"{}"
    assert own + "a.json" in s3.list_prefix(client, bucket, "jobs/team/")
    s3.delete_prefix(client, bucket, own)
    assert s3.get_bytes(client, bucket, "models/tiny/config.json") == b"{}"  # shared base models: read

    other = "jobs/teamb/job-1/final/model.safetensors"
    _denied(lambda: s3.get_bytes(client, bucket, other))
    _denied(lambda: client.stat_object(bucket, other))
    _denied(lambda: s3.put_bytes(client, bucket, "jobs/teamb/job-1/final/model.safetensors", b"evil"))
    _denied(lambda: s3.list_prefix(client, bucket, "jobs/teamb/"))
    _denied(lambda: s3.list_prefix(client, bucket, "jobs/"))
    _denied(lambda: s3.list_prefix(client, bucket, ""))
    _denied(lambda: client.remove_object(bucket, other))
    _denied(lambda: s3.put_bytes(client, bucket, "models/tiny/config.json", b"evil"))
    _denied(lambda: s3.put_bytes(client, bucket, "datasets/x.jsonl", b"{}"))
    try:  # a multi-object delete is a request on the bucket: each key is still checked
        errors = list(client.remove_objects(bucket, [DeleteObject(other)]))
    except S3Error as err:
        errors = [err]
    assert errors and all(e.code == "AccessDenied" for e in errors), errors
    assert server.client().get_object(bucket, other).read() == b"wteamb"  # untouched


def test_a_checkpoint_of_one_namespace_is_out_of_reach_of_another(server, monkeypatch, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine = build_engine(model, opt, None, ParallelConfig())
    client_b = _client(server, "teamb", monkeypatch)
    ckpt.save_checkpoint(
        engine, client=client_b, bucket=server.bucket, prefix="jobs/teamb/j-1/", step=1, workdir=tmp_path
    )
    client_a = _client(server, "team", monkeypatch)
    _denied(lambda: ckpt.find_latest(client_a, server.bucket, "jobs/teamb/j-1/"))
    _denied(
        lambda: ckpt.load_checkpoint(
            engine,
            client=client_a,
            bucket=server.bucket,
            prefix="jobs/teamb/j-1/",
            step=1,
            workdir=tmp_path / "a",
        )
    )
    _denied(
        lambda: ckpt.save_checkpoint(
            engine,
            client=client_a,
            bucket=server.bucket,
            prefix="jobs/teamb/j-1/",
            step=2,
            workdir=tmp_path / "w",
        )
    )
    assert ckpt.find_latest(client_b, server.bucket, "jobs/teamb/j-1/") == 1


def test_a_shared_folder_is_readable_not_writable(server, monkeypatch):
    client = _client(server, "reader", monkeypatch)
    shared = "jobs/team/job-1/final/model.safetensors"
    assert s3.get_bytes(client, server.bucket, shared) == b"wteam"
    assert shared in s3.list_prefix(client, server.bucket, "jobs/team/")
    _denied(lambda: s3.put_bytes(client, server.bucket, shared, b"evil"))
    _denied(lambda: client.remove_object(server.bucket, shared))
    _denied(lambda: s3.get_bytes(client, server.bucket, "jobs/teamb/job-1/final/model.safetensors"))


def test_the_cli_uploads_datasets_into_the_namespaces_folder(server, monkeypatch, tmp_path):
    """`posttrain train/convert -n NS` upload with the namespace's own keys, into jobs/NS/datasets/."""
    from posttrain import dataset_upload

    for key, value in server.namespace_env("team").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("S3_BUCKET", server.bucket)
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    uri = dataset_upload.upload(data, field="job.data", namespace="team")
    assert uri.startswith(f"s3://{server.bucket}/jobs/team/datasets/") and uri.endswith("-train.jsonl")
    with pytest.raises(S3Error):
        dataset_upload.upload(data, field="job.data", namespace="teamb")
