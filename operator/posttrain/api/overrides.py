"""`--set KEY=VALUE`: one key of a TOML config replaced from the command line (e.g. a synth config scaled
down for a test: `--set training.iterations_per_epoch=1`), validated exactly as the TOML field it replaces.

KEY is the dotted path of the field (`section.key`, `section.table.key`); VALUE is a TOML value (`1`, `0.5`,
`true`, `"text"`, `["a", "b"]`, `{ k = 1 }`), or, when it is not one, the text as a string. A problem with a
set field is reported as `--set KEY`, not at the file line the value no longer comes from."""

from __future__ import annotations

import argparse
import copy
import re
import tomllib
from typing import Any

from posttrain.errors import Problem, UserError

_KEY = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")


def parse_set(text: str) -> tuple[str, Any]:
    """argparse type: KEY=VALUE -> (KEY, value)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not _KEY.match(key):
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE with a dotted KEY (training.batch_size=4), got {text!r}"
        )
    try:
        return key, tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        return key, value.strip()


def apply_overrides(raw: dict[str, Any], overrides: list[tuple[str, Any]] | None) -> dict[str, Any]:
    """A copy of the parsed TOML with each override set (tables made where missing)."""
    if not overrides:
        return raw
    raw = copy.deepcopy(raw)
    for key, value in overrides:
        *tables, last = key.split(".")
        node = raw
        for depth, name in enumerate(tables):
            child = node.setdefault(name, {})
            if not isinstance(child, dict):
                where = ".".join(tables[: depth + 1])
                raise UserError(Problem(f"{where} is not a table, so {key} cannot be set", field=f"--set {key}",
                                        fix=f"set {where} itself"))  # fmt: skip
            node = child
        node[last] = value
    return raw


def attribute(problems: list[Problem], overrides: list[tuple[str, Any]] | None) -> list[Problem]:
    """Problems about a set field name the flag (`--set KEY`) instead of a file line."""
    keys = [key for key, _ in overrides or []]
    out = []
    for problem in problems:
        field = problem.field or ""
        key = next(
            (k for k in keys if field == k or field.startswith(k + ".") or field.startswith(k + "[")), None
        )
        if key is None:
            out.append(problem)
        else:
            out.append(Problem(problem.message, field=f"--set {field}", fix=problem.fix))
    return out
