"""The user's guide: README is a short guide whose links resolve, docs/reference/ is what hack/gen_docs.py
makes from the code today, and the mkdocs site builds with --strict (every nav entry and link resolves)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GEN = REPO / "hack" / "gen_docs.py"


def test_readme_is_short_and_its_links_resolve():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    # the set-up a new user needs comes before the two commands
    assert text.index("## Set-up on a fresh machine") < text.index("## The two commands")
    commands = text[text.index("## The two commands") :]
    assert "make demo" in commands and "make test" in commands
    for placeholder in ("COLD_BUILD", "WARM_BUILD", "ARGOCD_CACHE", "E2E_LINES"):
        assert placeholder not in text
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        if "://" not in target:
            assert (REPO / target).exists(), target


def test_no_page_says_the_operator_adds_a_finalizer():
    # The operator adds none (controller/main.py); an older README said both.
    for page in (REPO / "docs").rglob("*.md"):
        assert "adds only status, the finalizer" not in page.read_text(), page


def test_reference_pages_are_current():
    result = subprocess.run([sys.executable, str(GEN), "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_stale_reference_page_is_caught(tmp_path: Path):
    out = tmp_path / "reference"
    assert subprocess.run([sys.executable, str(GEN), "--out", str(out)], capture_output=True).returncode == 0
    page = out / "toml.md"
    page.write_text(page.read_text().replace("learning_rate", "learnin_rate"))
    result = subprocess.run(
        [sys.executable, str(GEN), "--check", "--out", str(out)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "toml.md" in result.stderr


def test_reference_covers_every_cli_command_and_toml_section():
    from posttrain.cli import SUBCOMMANDS

    cli = (REPO / "docs" / "reference" / "cli.md").read_text()
    for name in SUBCOMMANDS:
        assert f"## posttrain {name.replace('_', '-')}" in cli
    toml = (REPO / "docs" / "reference" / "toml.md").read_text()
    # a key with its type, default and bounds
    assert re.search(r"\| `compute.gpu_count` \| integer \| \*\*required\*\* \| >= 1, <= 100000 \|", toml)
    crds = (REPO / "docs" / "reference" / "crds.md").read_text()
    assert "## RLJob" in crds and "## SFTJob" in crds and "## TaskApp" in crds
    status = (REPO / "docs" / "reference" / "status.md").read_text()
    assert "`TaskAppVerificationFailed`" in status and "`TrainerFailed`" in status


def test_mkdocs_builds_strict(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(REPO / "mkdocs.yml"),
            "-d",
            str(tmp_path / "site"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "toml" / "index.html").is_file()


def test_the_install_guides_registry_overlay_renders(tmp_path: Path):
    """The kustomization in docs/how-to/cluster-install.md, pointed at this checkout, renders with the
    operator from the user's registry and the job images in the operator's settings."""
    kubectl = shutil.which("kubectl") or (str(REPO / "bin" / "kubectl") if (REPO / "bin" / "kubectl").exists() else None)
    if kubectl is None:
        pytest.skip("kubectl (with kustomize) not installed")
    text = (REPO / "docs" / "how-to" / "cluster-install.md").read_text()
    snippet = re.search(r"```yaml\n(# my-cluster/kustomization.yaml\n.*?)```", text, re.S).group(1)
    (tmp_path / "posttrain").symlink_to(REPO)
    (tmp_path / "my-cluster").mkdir()
    (tmp_path / "my-cluster" / "kustomization.yaml").write_text(snippet)
    proc = subprocess.run([kubectl, "kustomize", str(tmp_path / "my-cluster")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    deploy = next(d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "posttrain-operator")  # fmt: skip
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "mirror.internal:5000/posttrain/operator:0.2.0"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["POSTTRAIN_TRAINER_IMAGE"] == "mirror.internal:5000/posttrain/trainer:0.2.0"
    assert env["POSTTRAIN_ROLLOUT_IMAGE"] == "mirror.internal:5000/posttrain/rollout:0.2.0"
