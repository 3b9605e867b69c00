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
    needed = re.search(r'for b in \(([^)]*)\) if shutil.which', fixture)
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
