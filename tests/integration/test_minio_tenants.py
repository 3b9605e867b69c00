"""The dev overlay's MinIO users (python -m posttrain.minio_tenants) on a real MinIO: each namespace's user
reaches only jobs/<namespace>/ (and reads models/), as on SeaweedFS (test_storage_tenancy.py).

MinIO is the binary `make images` builds from its Go module (hack/build-images.sh keeps it in
$POSTTRAIN_CACHE/images/minio-<recipe>/minio) or $POSTTRAIN_MINIO_BIN; without one the test is skipped
(building MinIO takes longer than make test's budget)."""

from __future__ import annotations

import io
import os
import subprocess
import time
from pathlib import Path

import pytest
from minio import Minio
from minio.deleteobjects import DeleteObject
from minio.error import S3Error
from posttrain import minio_tenants
from posttrain.localhost import free_ports, stop_group

ROOT = ("posttrain-root", "posttrain-root-secret")
BUCKET = "posttrain"


def minio_binary() -> Path | None:
    given = os.environ.get("POSTTRAIN_MINIO_BIN")
    if given:
        return Path(given)
    cache = Path(os.environ.get("POSTTRAIN_CACHE", Path.home() / ".cache" / "posttrain"))
    found = sorted((cache / "images").glob("minio-*/minio"))
    return found[-1] if found else None


@pytest.fixture(scope="module")
def minio(tmp_path_factory):
    binary = minio_binary()
    if binary is None or not binary.exists():
        pytest.skip("no MinIO binary (make images builds one; or set POSTTRAIN_MINIO_BIN)")
    port, console = free_ports(2)
    data = tmp_path_factory.mktemp("minio")
    env = {**os.environ, "MINIO_ROOT_USER": ROOT[0], "MINIO_ROOT_PASSWORD": ROOT[1], "HOME": str(data)}
    log = (data / "minio.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "server", str(data / "d"), "--address", f"127.0.0.1:{port}",
         "--console-address", f"127.0.0.1:{console}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    endpoint = f"127.0.0.1:{port}"
    try:
        root = Minio(endpoint, access_key=ROOT[0], secret_key=ROOT[1], secure=False)
        deadline = time.monotonic() + 60
        while True:
            try:
                root.list_buckets()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.5)
        yield endpoint, root
    finally:
        stop_group(proc, 15)
        log.close()


def _denied(call) -> None:
    with pytest.raises(S3Error) as err:
        call()
    assert err.value.code == "AccessDenied", err.value


def test_each_namespace_user_reaches_only_its_folder(minio, tmp_path, monkeypatch):
    endpoint, root = minio
    keys = tmp_path / "keys"
    keys.mkdir()
    for ns in ("team", "teamb", "reader"):
        (keys / ns).write_text(f"{ns}-secret-key\n")
    users = minio_tenants.plan(minio_tenants.read_keys(keys), BUCKET, {"team": ["reader"]})
    minio_tenants.apply(users, f"http://{endpoint}", BUCKET, *ROOT)
    # again, as the dev overlay's Job runs it (idempotent): root keys from the environment
    monkeypatch.setenv("MINIO_ROOT_USER", ROOT[0])
    monkeypatch.setenv("MINIO_ROOT_PASSWORD", ROOT[1])
    monkeypatch.setenv("POSTTRAIN_SHARED_MODELS", '{"team": ["reader"]}')
    assert minio_tenants.main(["--endpoint", f"http://{endpoint}", "--bucket", BUCKET, "--keys-dir", str(keys)]) == 0
    for ns in ("team", "teamb"):
        root.put_object(BUCKET, f"jobs/{ns}/j-1/final/model.safetensors", io.BytesIO(ns.encode()), len(ns))
    root.put_object(BUCKET, "models/tiny/config.json", io.BytesIO(b"{}"), 2)

    # no region: the client asks the bucket's location, which the policy allows
    team = Minio(endpoint, access_key="team", secret_key="team-secret-key", secure=False)
    team.put_object(BUCKET, "jobs/team/j-2/a.json", io.BytesIO(b"{}"), 2)
    assert team.get_object(BUCKET, "jobs/team/j-2/a.json").read() == b"{}"
    assert [o.object_name for o in team.list_objects(BUCKET, prefix="jobs/team/j-2/", recursive=True)]
    team.remove_object(BUCKET, "jobs/team/j-2/a.json")
    assert team.get_object(BUCKET, "models/tiny/config.json").read() == b"{}"

    other = "jobs/teamb/j-1/final/model.safetensors"
    _denied(lambda: team.get_object(BUCKET, other))
    _denied(lambda: team.stat_object(BUCKET, other))
    _denied(lambda: team.put_object(BUCKET, other, io.BytesIO(b"evil"), 4))
    _denied(lambda: list(team.list_objects(BUCKET, prefix="jobs/teamb/", recursive=True)))
    _denied(lambda: list(team.list_objects(BUCKET, prefix="jobs/", recursive=True)))
    _denied(lambda: team.put_object(BUCKET, "models/tiny/config.json", io.BytesIO(b"x"), 1))
    errors = list(team.remove_objects(BUCKET, [DeleteObject(other)]))
    assert errors and all(e.code == "AccessDenied" for e in errors), errors
    assert root.get_object(BUCKET, other).read() == b"teamb"

    reader = Minio(endpoint, access_key="reader", secret_key="reader-secret-key", secure=False)
    assert reader.get_object(BUCKET, "jobs/team/j-1/final/model.safetensors").read() == b"team"
    _denied(lambda: reader.put_object(BUCKET, "jobs/team/j-1/final/x", io.BytesIO(b"x"), 1))
    _denied(lambda: reader.get_object(BUCKET, other))
