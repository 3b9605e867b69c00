"""One TOML table ([eval], [filter]) checked by its pydantic model: every problem as file:line: field: message
(fix), unknown keys as warnings with a did-you-mean, and keys accepted for synth's sake that do nothing here
named as such (the same shape of messages as the RL/SFT path, posttrain.api.convert)."""

from __future__ import annotations

import difflib
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from posttrain.errors import Problem, UserError
from posttrain.toml_locate import locate

M = TypeVar("M", bound=BaseModel)


def problems_from(err: ValidationError, section: str, text: str | None, file: str | None) -> list[Problem]:
    out = []
    for item in err.errors():
        loc = ".".join(str(p) for p in item["loc"] if not isinstance(p, int))
        field = f"{section}.{loc}" if loc else section
        message = str(item["msg"]).removeprefix("Value error, ")
        message, _, fix = message.partition(" -- fix: ")
        if item["type"] == "missing":
            message, fix = "required field is missing", f"add {loc.rsplit('.', 1)[-1]} = ... to [{section}]"
        elif item["type"] != "value_error" and not isinstance(item.get("input"), dict | list):
            message += f" (got {item.get('input')!r})"[:120]
        line = locate(text, field) if text else None
        out.append(Problem(message, file=file, line=line, field=field, fix=fix or None))
    return sorted(out, key=lambda p: (p.line is None, p.line or 0))


def check_table(
    model: type[M], raw: dict[str, Any], section: str, *, text: str | None, file: str | None,
    inert: dict[str, str] | None = None,
) -> tuple[M, list[str]]:  # fmt: skip
    """(validated model, warnings); UserError naming each bad field at its line. `inert`: key -> why it
    has no effect here (warned when the key is set)."""
    table = raw.get(section)
    if not isinstance(table, dict):
        raise UserError(Problem(f"no [{section}] table", file=file, fix=f"put the keys under [{section}]"))
    try:
        value = model.model_validate(table)
    except ValidationError as err:
        raise UserError(problems_from(err, section, text, file)) from None
    warnings = []
    known = list(model.model_fields)
    for key in table:
        line = locate(text, f"{section}.{key}") if text else None
        where = f"{file}:{line}: " if file and line else (f"{file}: " if file else "")
        if key not in model.model_fields:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            warnings.append(f"{where}{section}.{key}: unknown key{hint}; ignored")
        elif inert and key in inert:
            warnings.append(f"{where}{section}.{key}: accepted for synth compatibility but has no effect here "
                            f"({inert[key]})")  # fmt: skip
    return value, warnings
