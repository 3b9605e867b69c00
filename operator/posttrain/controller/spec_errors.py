"""Pure: a spec the operator cannot act on, said with the field it comes from. Three sources: posttrain's
models refuse the spec (the API server's CRD may be older than this operator, and a section's `extras`
are free-form), rendering refuses it (e.g. a model id nobody can resolve), or the API server refuses what
the spec rendered into, or the status derived from it, with 422 Unprocessable Entity (its causes name the
offending field). Either way the job ends Failed with reason InvalidSpec instead of being retried for
ever."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from posttrain.controller.bounds import truncate

MESSAGE_MAX = 600


class SpecError(ValueError):
    """The spec asks for something that cannot be rendered. `field` is the spec path (model.source)."""

    def __init__(self, field: str, message: str, fix: str | None = None):
        super().__init__(message)
        self.field = field
        self.fix = fix

    def __str__(self) -> str:
        text = f"spec.{self.field}: {self.args[0]}"
        return f"{text} (fix: {self.fix})" if self.fix else text


WHOLE_NUMBER_ERRORS = {"int_parsing", "int_type", "int_from_float"}


def spec_error(err: ValidationError) -> SpecError:
    """The first field posttrain's models refuse in a spec, spelled as in the custom resource."""
    errors = err.errors()
    first = errors[0]
    field = ".".join(to_camel(p) if isinstance(p, str) and "_" in p else str(p) for p in first["loc"])
    if first["type"] in WHOLE_NUMBER_ERRORS:
        message, fix = f"{first['input']!r} is not a whole number", "give an integer"
    elif first["type"] == "missing":
        message, fix = "required field is missing", None
    else:
        # a validator's own words: "Value error, <why> -- fix: <what to do>" (api/sections.py)
        message, _, fix_text = str(first["msg"]).removeprefix("Value error, ").partition(" -- fix: ")
        fix = fix_text or None
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more)"
    return SpecError(field, message, fix)


def render_failure_message(exc: BaseException) -> str:
    if isinstance(exc, SpecError):
        return truncate(str(exc), MESSAGE_MAX)
    return truncate(f"the spec cannot be rendered ({type(exc).__name__}: {exc})", MESSAGE_MAX)


def unprocessable_causes(details: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(field, message) of each cause in a 422 Status' `details`."""
    out = []
    for cause in (details or {}).get("causes") or []:
        if isinstance(cause, dict):
            out.append(
                (str(cause.get("field") or ""), str(cause.get("message") or cause.get("reason") or ""))
            )
    return out


def unprocessable_message(what: str, details: dict[str, Any] | None, fallback: str = "") -> str:
    """`what` (e.g. "Deployment j-rollout", "status") was refused with 422: the fields and why."""
    causes = unprocessable_causes(details)
    if causes:
        parts = [f"{field}: {message}" if field else message for field, message in causes[:3]]
        text = f"the API server refused {what}: " + "; ".join(parts)
    else:
        text = f"the API server refused {what}" + (f": {fallback}" if fallback else "")
    return truncate(text, MESSAGE_MAX)
