"""Every make target installs what it needs on a fresh machine: `make e2e-gitops` gets redis-server and git
(what tests/fixtures/argocd.py runs beside Argo CD) from Debian through hack/debian-deps.sh."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEPS = REPO / "hack" / "debian-deps.sh"


def _recipe(target: str) -> tuple[list[str], str]:
    text = (REPO / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)*)", text, re.M)
    assert match, target
    return match.group(1).split(), match.group(2)


def test_e2e_gitops_installs_what_the_argocd_fixture_runs():
    prerequisites, _ = _recipe("e2e-gitops")
    assert "gitops-deps" in prerequisites
    _, recipe = _recipe("gitops-deps")
    fixture = (REPO / "tests" / "fixtures" / "argocd.py").read_text()
    needed = re.search(r"for b in \(([^)]*)\) if shutil.which", fixture)
    assert needed, "tests/fixtures/argocd.py no longer lists the binaries it needs"
    for binary in re.findall(r'"([^"]+)"', needed.group(1)):
        assert f"{binary}:" in recipe, f"make gitops-deps does not install {binary}"


def test_debian_deps_lists_only_what_is_missing():
    present = subprocess.run(["bash", str(DEPS), "--check", "sh:dash"], capture_output=True, text=True)
    assert present.returncode == 0 and present.stdout == ""
    missing = subprocess.run(
        ["bash", str(DEPS), "--check", "sh:dash", "posttrain-no-such-command:posttrain-no-such-package"],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and missing.stdout.split() == ["posttrain-no-such-package"]


def test_debian_deps_checks_paths_and_python_modules_too():
    """build-node.sh asks for /usr/lib/cni/bridge (no command), make setup for python3-venv (ensurepip)."""
    present = subprocess.run(
        ["bash", str(DEPS), "--check", "/bin/sh:dash", "import.json:python3"], capture_output=True, text=True
    )
    assert present.returncode == 0 and present.stdout == ""
    missing = subprocess.run(
        [
            "bash",
            str(DEPS),
            "--check",
            "/posttrain/no/such/file:pkg-a",
            "import.posttrain_no_such_module:pkg-b",
        ],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 1 and missing.stdout.split() == ["pkg-a", "pkg-b"]


def test_every_debian_install_goes_through_debian_deps():
    """A fresh machine's package lists are empty: a bare `apt-get install` fails there. Every script installs
    through hack/debian-deps.sh, which updates the lists first (setup.sh retries after an update itself)."""
    for script in sorted((REPO / "hack").rglob("*.sh")):
        if script.name in ("debian-deps.sh", "setup.sh"):
            continue
        runs = [
            line
            for line in script.read_text().splitlines()
            if "apt-get install" in line.split("#", 1)[0] and "echo" not in line
        ]
        assert not runs, f"{script.relative_to(REPO)}: {runs} (use hack/debian-deps.sh)"


def test_targets_that_need_debian_packages_install_them():
    """What each target runs needs these from Debian; the target (or the script it runs) installs them."""
    prerequisites, recipe = _recipe("setup")
    assert "import.ensurepip:python3-venv" in recipe  # python3 -m venv fails without it on Debian
    prerequisites, _ = _recipe("e2e")
    assert {"registry-deps", "node-bins", "images", "k8s-bins", "setup"} <= set(prerequisites)
    _, recipe = _recipe("registry-deps")
    assert "docker-registry:docker-registry" in recipe and "buildah:buildah" in recipe
    prerequisites, _ = _recipe("test")  # tests/integration/test_registry_push.py
    assert "registry-deps" in prerequisites
    prerequisites, _ = _recipe("push")
    assert prerequisites == ["$(if", "$(REGISTRY),images)"]  # builds first, once REGISTRY is given
    images = (REPO / "hack" / "build-images.sh").read_text()
    for need in ("buildah:buildah", "mmdebstrap:mmdebstrap", "import.pip:python3-pip"):
        assert need in images
    node = (REPO / "hack" / "build-node.sh").read_text()
    for need in ("runc:runc", "/usr/lib/cni/bridge:containernetworking-plugins", "iptables:", "conntrack:"):
        assert need in node


def test_go_builds_ask_hack_go_sh_for_a_new_enough_go(tmp_path):
    """Debian's golang is too old for the pinned modules: every Go build takes hack/go.sh's answer (a Go
    here that is new enough, else one fetched from the Go module proxy), never a bare `go`."""
    for name in ("build-k8s.sh", "build-kueue.sh", "build-node.sh", "build-argocd.sh", "build-images.sh"):
        text = (REPO / "hack" / name).read_text()
        assert "hack/go.sh" in text, name
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        assert not re.search(r"(?<![\w$\"/-])go (build|install|mod) ", code), f"{name} runs a bare go"
    # With a new enough Go already here, it is what go.sh answers (nothing fetched).
    fake = tmp_path / "go"
    fake.write_text('#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo go99.0.0\n')
    fake.chmod(0o755)
    out = subprocess.run(
        ["bash", str(REPO / "hack" / "go.sh")],
        capture_output=True,
        text=True,
        env={"GO": str(fake), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert out.returncode == 0 and out.stdout.strip() == str(fake), out.stderr
