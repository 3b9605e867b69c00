"""docs/synth-compat.md stays true: every example TOML the synth-ai 0.2.19 wheel ships
(RL, SFT, eval, filter, and what is none of them) is classified as `posttrain validate` classifies it and
validated; the doc's table must name each file with that kind and that outcome (`ok`, or `refused: FIELD`
for the field of the first problem). A file the table does not place, or places differently, fails the test.
Skipped, saying so, only when the wheel is absent."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from posttrain.cli import main
from posttrain.commands.validate import config_kind

from tests.fixtures.synth_wheel import require_wheel

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "synth-compat.md"
ROW = re.compile(r"^\| `(examples/[^`]+\.toml)` \| (\w+) \| (ok|refused: [^|]+?) \|", re.M)
FIRST_ERROR = re.compile(r"^error: .+?\.toml(?::\d+)?: ([^:\s]+): ", re.M)


def placed() -> dict[str, tuple[str, str]]:
    return {path: (kind, outcome.strip()) for path, kind, outcome in ROW.findall(DOC.read_text())}


def classify(root: Path, relative: str, capsys) -> tuple[str, str]:
    path = root / relative
    try:
        kind = config_kind(tomllib.loads(path.read_text())) or "none"
    except tomllib.TOMLDecodeError:
        kind = "none"
    code = main(["validate", "-c", str(path)])
    err = capsys.readouterr().err
    if code == 0:
        return kind, "ok"
    found = FIRST_ERROR.search(err)
    assert found, f"validate refused {relative} without a field: {err[-500:]}"
    return kind, f"refused: {found.group(1)}"


def test_every_example_toml_of_the_wheel_is_placed(capsys, monkeypatch, tmp_path):
    root = require_wheel()
    monkeypatch.chdir(tmp_path)  # relative dataset paths resolve against an empty folder, as on a new machine
    for name in ("SDK_EXPERIMENTAL", "POSTTRAIN_EXPERIMENTAL", "TASK_APP_URL"):
        monkeypatch.delenv(name, raising=False)
    table = placed()
    files = sorted(p.relative_to(root).as_posix() for p in (root / "examples").rglob("*.toml"))
    assert len(files) > 50, files
    wrong = []
    for relative in files:
        got = classify(root, relative, capsys)
        if table.get(relative) != got:
            wrong.append(f"| `{relative}` | {got[0]} | {got[1]} |  (doc: {table.get(relative)})")
    assert not wrong, "docs/synth-compat.md does not place these as validate does:\n" + "\n".join(wrong)
    stale = sorted(set(table) - set(files))
    assert not stale, f"the doc names files the wheel does not have: {stale}"


def test_the_doc_names_every_kind():
    kinds = {kind for kind, _ in placed().values()}
    if not kinds:
        pytest.fail("docs/synth-compat.md has no table of the wheel's example TOMLs")
    assert {"rl", "sft", "eval", "filter", "prompt_learning", "none"} <= kinds, kinds
