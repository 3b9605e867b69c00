"""`make release-manifests REGISTRY=host[:port]/path TAG=x.y.z`: pins manifests/overlays/prod to a release.

Rewrites the newName/newTag of the prod overlay's `images:` entries (posttrain/operator, trainer, rollout,
taskapp-math) to REGISTRY/<name> and TAG, keeping the file's comments, and checks the result renders with
`kubectl kustomize`. The release commits this change with its tag; a cluster then installs it with
`kubectl apply --server-side -k manifests/overlays/prod` from that tag. Push the images first
(`make push REGISTRY=... TAG=...`): the overlay names exactly what that pushed.
Exit 2 on a malformed REGISTRY or TAG, or an overlay without the four entries."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "manifests" / "overlays" / "prod"
IMAGES = ("operator", "trainer", "rollout", "taskapp-math")
# host[:port]/path: a registry host (a dot, a port or localhost, as the OCI reference grammar needs to tell
# it from a Docker Hub user) and at least one path component, lowercase as repository names are.
REGISTRY = re.compile(
    r"(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)+(?::\d{1,5})?"
    r"|localhost(?::\d{1,5})?|\d{1,3}(?:\.\d{1,3}){3}(?::\d{1,5})?)"
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+"
)
TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def entry(name: str) -> re.Pattern[str]:
    """One `images:` entry of posttrain/<name>: its name line, then newName and newTag lines (any order)."""
    return re.compile(
        rf"(?P<head>^(?P<indent>\s*)- name: posttrain/{re.escape(name)}\s*\n)"
        r"(?P<body>(?:(?P=indent)  (?:newName|newTag|digest):[^\n]*\n)+)",
        re.M,
    )


def pin(text: str, registry: str, tag: str) -> str:
    """The kustomization with every posttrain image entry set to registry/<name>:tag."""
    for name in IMAGES:
        pattern = entry(name)
        if len(pattern.findall(text)) != 1:
            raise ValueError(f"no single `- name: posttrain/{name}` entry with newName/newTag under images:")

        def replace(m: re.Match[str], name: str = name) -> str:
            pad = m.group("indent") + "  "
            return f'{m.group("head")}{pad}newName: {registry}/{name}\n{pad}newTag: "{tag}"\n'

        text = pattern.sub(replace, text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--registry", required=True, help="host[:port]/path that holds the images")
    parser.add_argument("--tag", required=True, help="the release's image tag, e.g. 0.2.0")
    parser.add_argument("--overlay", type=Path, default=PROD, help="the overlay to pin (default: prod)")
    args = parser.parse_args(argv)
    registry = args.registry.rstrip("/")
    if not REGISTRY.fullmatch(registry):
        print(
            f"--registry: {registry!r} is not host[:port]/path (e.g. registry.example.com/posttrain)",
            file=sys.stderr,
        )
        return 2
    if not TAG.fullmatch(args.tag) or args.tag in ("latest", "dev"):
        print(f"--tag: {args.tag!r} is not a release tag (e.g. 0.2.0; not latest or dev)", file=sys.stderr)
        return 2
    path = args.overlay / "kustomization.yaml"
    try:
        path.write_text(pin(path.read_text(), registry, args.tag))
    except (OSError, ValueError) as err:
        print(f"{path}: {err}", file=sys.stderr)
        return 2
    kubectl = shutil.which("kubectl") or str(ROOT / "bin" / "kubectl")
    if not Path(kubectl).exists() and kubectl == str(ROOT / "bin" / "kubectl"):
        print(f"{path}: pinned; not rendered (no kubectl here: make k8s-bins)", file=sys.stderr)
        return 0
    proc = subprocess.run([kubectl, "kustomize", str(args.overlay)], capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"kubectl kustomize {args.overlay} failed:\n{proc.stderr}", file=sys.stderr)
        return 1
    print(f"{path}: images {registry}/{{{','.join(IMAGES)}}}:{args.tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
