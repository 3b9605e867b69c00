"""Images from a registry: one kustomize `images:` list points a whole install at a registry and a tag (the
operator's own image, the trainer/rollout images it puts into job pods, TaskApp images); the prod overlay
names one registry and one release tag that `make release-manifests` sets; the install guide's override
renders what it says; `make e2e`'s overlay takes every image from its loopback registry."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "hack" / "release_manifests.py"
KUBECTL = shutil.which("kubectl") or str(ROOT / "bin" / "kubectl")
needs_kubectl = pytest.mark.skipif(
    not Path(KUBECTL).exists(), reason="kubectl (with kustomize) not installed"
)


def render(path: Path) -> list[dict]:
    proc = subprocess.run([KUBECTL, "kustomize", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def images(docs: list[dict]) -> dict[str, str]:
    """Where each image reference lands: operator/minio containers, the operator's image settings, TaskApps."""
    found: dict[str, str] = {}
    for doc in docs:
        kind, name = doc["kind"], doc["metadata"]["name"]
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in pod.get("containers", []):
            found[f"{kind}/{name}/{c['name']}"] = c["image"]
            for e in c.get("env", []):
                if e["name"].endswith("_IMAGE"):
                    found[f"{kind}/{name}/{e['name']}"] = e["value"]
        if kind == "TaskApp":
            found[f"TaskApp/{name}"] = doc["spec"]["image"]
    return found


def copy_manifests(tmp_path: Path) -> Path:
    dest = tmp_path / "posttrain" / "manifests"
    shutil.copytree(ROOT / "manifests", dest)
    return dest


@needs_kubectl
def test_prod_names_one_registry_and_one_release_tag_for_every_posttrain_image():
    """Before: the operator pinned to posttrain/operator:0.1.0 while the jobs it made ran the operator's
    default trainer/rollout images; now all three come from the registry and tag the release set."""
    found = images(render(ROOT / "manifests" / "overlays" / "prod"))
    ours = {k: v for k, v in found.items() if "minio" not in v}
    assert set(ours) == {
        "Deployment/posttrain-operator/operator",
        "Deployment/posttrain-operator/POSTTRAIN_TRAINER_IMAGE",
        "Deployment/posttrain-operator/POSTTRAIN_ROLLOUT_IMAGE",
    }
    refs = {re.fullmatch(r"(.+)/(operator|trainer|rollout):([^:/]+)", v) for v in ours.values()}
    assert None not in refs, ours
    assert len({(m.group(1), m.group(3)) for m in refs}) == 1, f"more than one registry or tag: {ours}"
    assert {m.group(3) for m in refs} - {"dev", "latest"}, ours


@needs_kubectl
def test_release_manifests_pins_prod_and_everything_on_it(tmp_path: Path):
    manifests = copy_manifests(tmp_path)
    before = (manifests / "overlays" / "prod" / "kustomization.yaml").read_text()
    proc = subprocess.run(
        [sys.executable, str(RELEASE), "--registry", "registry.test:5000/team/posttrain", "--tag", "0.2.0",
         "--overlay", str(manifests / "overlays" / "prod")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    after = (manifests / "overlays" / "prod" / "kustomization.yaml").read_text()
    # Only the image lines changed: the overlay's comments and patches stay as they were.
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert changed and all(re.match(r"\s+new(Name|Tag): ", line) for line in changed), changed
    for overlay in ("prod", "namespaced"):  # namespaced builds on prod: the same release
        found = images(render(manifests / "overlays" / overlay))
        reg = "registry.test:5000/team/posttrain"
        assert found["Deployment/posttrain-operator/operator"] == f"{reg}/operator:0.2.0"
        assert found["Deployment/posttrain-operator/POSTTRAIN_TRAINER_IMAGE"] == f"{reg}/trainer:0.2.0"
        assert found["Deployment/posttrain-operator/POSTTRAIN_ROLLOUT_IMAGE"] == f"{reg}/rollout:0.2.0"


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--registry", "posttrain", "--registry: 'posttrain' is not host[:port]/path"),
        ("--registry", "Registry.Example.com/x", "is not host[:port]/path"),
        ("--registry", "registry.example.com", "is not host[:port]/path"),  # no path: images land at the root
        ("--tag", "dev", "--tag: 'dev' is not a release tag"),
        ("--tag", "1.0:bad", "is not a release tag"),
    ],
)
def test_release_manifests_rejects_a_bad_registry_or_tag_and_leaves_prod_alone(
    tmp_path, flag, value, message
):
    manifests = copy_manifests(tmp_path)
    prod = manifests / "overlays" / "prod" / "kustomization.yaml"
    before = prod.read_text()
    args = {"--registry": "registry.example.com/posttrain", "--tag": "0.2.0", flag: value}
    proc = subprocess.run(
        [sys.executable, str(RELEASE), *[x for kv in args.items() for x in kv], "--overlay", str(prod.parent)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert prod.read_text() == before


@needs_kubectl
def test_the_install_guides_registry_override_renders_what_it_says(tmp_path: Path):
    """docs/how-to/cluster-install.md's my-cluster/kustomization.yaml, applied beside a copy of this
    repository's manifests, moves the operator and the images it starts to the named registry and tag."""
    guide = (ROOT / "docs" / "how-to" / "cluster-install.md").read_text()
    block = re.search(r"```yaml\n(# my-cluster/kustomization\.yaml\n.*?)```", guide, re.S)
    assert block, "the install guide lost its my-cluster/kustomization.yaml example"
    manifests = copy_manifests(tmp_path)
    # The guide's example is written against the unreleased prod (its placeholder registry); a release
    # commit pins another one, which the guide tells the reader to look up.
    pin = [sys.executable, str(RELEASE), "--registry", "registry.example.com/posttrain", "--tag", "0.1.0",
           "--overlay", str(manifests / "overlays" / "prod")]  # fmt: skip
    subprocess.run(pin, check=True, capture_output=True)
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(block.group(1))
    spec = yaml.safe_load(block.group(1))
    wanted = {e["name"].rsplit("/", 1)[1]: f"{e['newName']}:{e['newTag']}" for e in spec["images"]}
    assert all(v.startswith("mirror.internal:5000/posttrain/") for v in wanted.values()), wanted
    found = images(render(tmp_path / "my-cluster"))
    assert found["Deployment/posttrain-operator/operator"] == wanted["operator"]
    assert found["Deployment/posttrain-operator/POSTTRAIN_TRAINER_IMAGE"] == wanted["trainer"]
    assert found["Deployment/posttrain-operator/POSTTRAIN_ROLLOUT_IMAGE"] == wanted["rollout"]


@needs_kubectl
def test_make_e2e_takes_every_image_from_its_loopback_registry_and_always_asks_it(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("e2e_node", ROOT / "hack" / "e2e_node.py")
    e2e_node = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(e2e_node)
    # The overlay sits where make e2e puts it (under the repository: kustomize takes no absolute base).
    overlay = e2e_node.registry_overlay(
        ROOT / ".pytest_cache" / tmp_path.name / "overlay", "127.0.0.1:5077/posttrain"
    )
    try:
        docs = render(overlay)
    finally:
        shutil.rmtree(overlay.parent)
    found = images(docs)
    assert found and all(
        v.startswith("127.0.0.1:5077/posttrain/") and v.endswith(":dev") for v in found.values()
    ), found
    assert found["TaskApp/math"] == "127.0.0.1:5077/posttrain/taskapp-math:dev"
    assert found["StatefulSet/minio/minio"] == "127.0.0.1:5077/posttrain/minio:dev"
    for doc in docs:
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            assert c.get("imagePullPolicy") == "Always", (doc["metadata"]["name"], c["name"])
            env = [e for e in c.get("env", []) if e["name"] == "POSTTRAIN_IMAGE_PULL_POLICY"]
            assert env in ([], [{"name": "POSTTRAIN_IMAGE_PULL_POLICY", "value": "Always"}]), env
