"""hack/registry.sh for real: Debian's docker-registry started on 127.0.0.1, the five images `make push`
sends (tiny stand-ins here, built with buildah under the names `make images` gives) pushed with buildah,
and read back over the registry's HTTP API down to a file inside a layer; start is idempotent, stop ends
the process, push refuses what it cannot do with exit 2."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import httpx
import pytest
from posttrain.localhost import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "hack" / "registry.sh")
NAMES = ("operator", "taskapp-math", "rollout", "trainer", "minio")
MANIFESTS = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"

pytestmark = pytest.mark.skipif(
    shutil.which("buildah") is None or shutil.which("docker-registry") is None or os.geteuid() != 0,
    reason="needs root, buildah and docker-registry (make registry-deps)",
)


def script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", SCRIPT, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def tiny_images(tmp_path: Path):
    """localhost/posttrain/<name>:<tag>, each FROM scratch with one file naming it."""
    tag = f"test-{uuid.uuid4().hex[:8]}"
    refs = []
    for name in NAMES:
        (tmp_path / f"{name}.txt").write_text(f"posttrain {name}\n")
        ctr = subprocess.run(
            ["buildah", "from", "scratch"], check=True, capture_output=True, text=True
        ).stdout.strip()
        subprocess.run(["buildah", "copy", "--quiet", ctr, str(tmp_path / f"{name}.txt"), "/name.txt"], check=True,
                       capture_output=True)  # fmt: skip
        ref = f"localhost/posttrain/{name}:{tag}"
        subprocess.run(["buildah", "commit", "--quiet", "--rm", ctr, ref], check=True, capture_output=True)
        refs.append(ref)
    yield tag
    subprocess.run(["buildah", "rmi", *refs], capture_output=True)


@pytest.fixture
def registry(tmp_path: Path):
    folder = tmp_path / "registry"
    started = script("start", str(folder), str(free_port()))
    assert started.returncode == 0, started.stderr
    yield folder, started.stdout.strip().splitlines()[-1]
    script("stop", str(folder))


def file_in_image(client: httpx.Client, name: str, tag: str) -> str:
    manifest = client.get(f"/v2/posttrain/{name}/manifests/{tag}", headers={"Accept": MANIFESTS})
    assert manifest.status_code == 200, manifest.text
    (layer,) = manifest.json()["layers"]
    blob = client.get(f"/v2/posttrain/{name}/blobs/{layer['digest']}", follow_redirects=True)
    with tarfile.open(fileobj=io.BytesIO(blob.content), mode="r:*") as tar:
        member = next(m for m in tar.getmembers() if m.name.lstrip("./") == "name.txt")
        return tar.extractfile(member).read().decode()


def test_push_round_trips_every_image_through_a_loopback_registry(registry, tiny_images):
    folder, address = registry
    host, port = address.split(":")
    assert host == "127.0.0.1"  # loopback only: nothing off this host reaches it
    pid = (folder / "registry.pid").read_text().strip()
    again = script("start", str(folder), port)  # make e2e again: the running registry is reused
    assert again.returncode == 0 and again.stdout.strip() == address, again.stderr
    assert (folder / "registry.pid").read_text().strip() == pid

    pushed = script("push", f"{address}/posttrain", "0.0.1-test", env={"POSTTRAIN_IMAGE_TAG": tiny_images})
    assert pushed.returncode == 0, pushed.stderr
    with httpx.Client(base_url=f"http://{address}", timeout=30) as client:
        catalog = client.get("/v2/_catalog").json()["repositories"]
        assert {f"posttrain/{n}" for n in NAMES} <= set(catalog)
        for name in NAMES:
            assert client.get(f"/v2/posttrain/{name}/tags/list").json()["tags"] == ["0.0.1-test"]
            assert file_in_image(client, name, "0.0.1-test") == f"posttrain {name}\n"

    stopped = script("stop", str(folder))
    assert stopped.returncode == 0 and not (folder / "registry.pid").exists()
    assert (
        not Path(f"/proc/{pid}").exists() or "docker-registry" not in Path(f"/proc/{pid}/cmdline").read_text()
    )
    assert (folder / "data" / "docker" / "registry").is_dir()  # the blobs stay for the next run


def test_push_refuses_a_registry_without_a_path_and_images_never_built(registry):
    _, address = registry
    no_path = script("push", address, "0.0.1-test")
    assert no_path.returncode == 2 and "REGISTRY is host[:port]/path" in no_path.stderr
    missing = script("push", f"{address}/posttrain", "0.0.1-test", env={"POSTTRAIN_IMAGE_TAG": "never-built"})
    assert missing.returncode == 2 and "build it first (make images)" in missing.stderr
    bad_tag = script("push", f"{address}/posttrain", "no:tag")
    assert bad_tag.returncode == 2 and "is not an image tag" in bad_tag.stderr
