"""Storage per tenant on a real S3 server (SeaweedFS): a namespace's keys reach only jobs/<namespace>/
(and read the shared models/), never another namespace's folder (operator/posttrain/storage_policy.py)."""

from __future__ import annotations

import io

import pytest
import torch
from fixtures.s3 import TENANTS
from minio.deleteobjects import DeleteObject
from minio.error import S3Error
from posttrain import storage as s3
from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer.distributed import ParallelConfig, build_engine


@pytest.fixture(scope="module")
def server(tenant_s3_server):
    root = tenant_s3_server.client()
    for ns in TENANTS:
        data = b"w" + ns.encode()
        root.put_object(tenant_s3_server.bucket, f"jobs/{ns}/job-1/final/model.safetensors", io.BytesIO(data), len(data))
    root.put_object(tenant_s3_server.bucket, "models/tiny/config.json", io.BytesIO(b"{}"), 2)
    return tenant_s3_server


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
    assert shared in s3.list_prefix(client, server.bucket, "jobs/team/job-1/final/")
    # a share is the final models: not the owner's datasets, checkpoints or traces
    admin = server.client()
    admin.put_object(server.bucket, "jobs/team/job-1/traces/t.jsonl", io.BytesIO(b"conversation"), 12)
    _denied(lambda: s3.get_bytes(client, server.bucket, "jobs/team/job-1/traces/t.jsonl"))
    _denied(lambda: s3.put_bytes(client, server.bucket, shared, b"evil"))
    _denied(lambda: client.remove_object(server.bucket, shared))
    _denied(lambda: s3.get_bytes(client, server.bucket, "jobs/teamb/job-1/final/model.safetensors"))


def test_the_cli_uploads_datasets_into_the_namespaces_folder(server, monkeypatch, tmp_path):
    """`posttrain train/convert -n NS` upload with the namespace's own keys, into jobs/NS/datasets/."""
    from posttrain import dataset_upload
    from posttrain.errors import UserError

    for key, value in server.namespace_env("team").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("S3_BUCKET", server.bucket)
    data = tmp_path / "train.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    uri = dataset_upload.upload(data, field="job.data", namespace="team")
    assert uri.startswith(f"s3://{server.bucket}/jobs/team/datasets/") and uri.endswith("-train.jsonl")
    with pytest.raises(UserError, match=r"failed \(AccessDenied\)"):  # another namespace's folder
        dataset_upload.upload(data, field="job.data", namespace="teamb")


def test_a_real_trainer_runs_on_its_namespaces_keys_and_not_in_anothers_folder(server, tiny_model_dir, tmp_path):
    """The SFT trainer (base model from models/, dataset, checkpoints with retention, final model, manifest)
    works with nothing but its namespace's keys; pointed at another namespace's folder it fails."""
    import json
    import subprocess

    from test_trainer_sft import make_dataset, make_job, report_lines, trainer_cmd, trainer_env

    root = server.client()
    for path in tiny_model_dir.iterdir():  # the admin uploads base models (POSTTRAIN_BASE_MODEL_URI)
        if path.is_file():
            root.fput_object(server.bucket, f"models/tiny-sft/{path.name}", str(path))
    keys = server.namespace_env("team")
    train, _ = make_dataset(tmp_path / "data", n_train=32)
    team = server.namespace_client("team")
    train_uri = s3.upload_file(team, train, server.bucket, "jobs/team/datasets/train.jsonl")
    hp = {"n_epochs": 1, "batch_size": 8, "learning_rate": 1e-3, "sequence_length": 64}

    def run(folder: str, name: str) -> subprocess.CompletedProcess:
        job_path, job = make_job(tmp_path / name, tiny_model_dir, train_uri, None, hp=hp,
                                 storage=server.storage(), name=name, checkpoint_every=2)  # fmt: skip
        job["model_path"] = f"s3://{server.bucket}/models/tiny-sft/"
        job["storage"]["prefix"] = f"jobs/{folder}/{name}-1/"
        job_path.write_text(json.dumps(job))
        return subprocess.run(trainer_cmd(job_path, 1), env=trainer_env(keys), capture_output=True, text=True,
                              timeout=240)  # fmt: skip

    ok = run("team", "own")
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    result = report_lines(tmp_path / "own" / "report.jsonl")[-1]["result"]
    assert result["artifacts"]["model"] == f"s3://{server.bucket}/jobs/team/own-1/final/"
    assert s3.exists(root, server.bucket, "jobs/team/own-1/manifest.json")

    refused = run("teamb", "theirs")
    assert refused.returncode != 0
    assert "AccessDenied" in refused.stdout + refused.stderr
    assert not list(root.list_objects(server.bucket, prefix="jobs/teamb/theirs-1/", recursive=True))
