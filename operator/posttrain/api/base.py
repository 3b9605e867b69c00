"""Base classes shared by the TOML config models and the custom-resource models.

One model hierarchy serves both shapes of a job:
- the synth TOML / normalized config: snake_case keys, unknown keys inline (validate by field name);
- the custom resource: camelCase keys, a section's unknown keys gathered under `extras`
  (validate and dump with `context=CR_CONTEXT`, `by_alias=True`).
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

# Pass as `context=` to model_validate / model_dump to read or write the custom-resource shape.
CR_CONTEXT: dict[str, bool] = {"cr": True}
EXTRAS_KEY = "extras"


def _is_cr(info: ValidationInfo | SerializationInfo) -> bool:
    context = info.context
    return bool(isinstance(context, dict) and context.get("cr"))


def numeric_kind(annotation: Any) -> str | None:
    """ "integer" or "number" when every non-None member of a field's type is int or float, else None."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return numeric_kind(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        kinds = {numeric_kind(a) for a in typing.get_args(annotation) if a is not type(None)}
        if kinds == {"integer"}:
            return "integer"
        return "number" if kinds and kinds <= {"integer", "number"} else None
    return {int: "integer", float: "number"}.get(annotation)


def refuse_non_number(value: Any, annotation: Any) -> Any:
    """pydantic's lax mode reads `true` as 1 and "2e-4" as 0.0002; in a job config either is a mistake
    (a quoted number, a flag in the wrong key), so a numeric key takes numbers only."""
    kind = numeric_kind(annotation)
    if kind and isinstance(value, bool | str):
        what = "a boolean" if isinstance(value, bool) else "a string"
        try:
            unquoted = float(value) if isinstance(value, str) else None
        except ValueError:
            unquoted = None
        fix = (
            f"write it without quotes: {value.strip()}"
            if unquoted is not None and isinstance(value, str)
            else f"write {'a number, e.g. 0.5' if kind == 'number' else 'an integer, e.g. 8'}"
        )
        shown = str(value).lower() if isinstance(value, bool) else f'"{value}"'  # as the TOML spells it
        raise ValueError(
            f"{shown} is {what}, not {'a number' if kind == 'number' else 'an integer'} -- fix: {fix}"
        )
    return value


class CRModel(BaseModel):
    """A custom-resource-only object (no TOML counterpart): camelCase, unknown keys rejected."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        protected_namespaces=(),
    )


class Section(BaseModel):
    """A synth TOML section: typed fields, and every unknown key kept verbatim and handed to the trainer.

    In the custom resource the typed fields are camelCase and the unknown keys live in `extras`, so that
    the CRD can type the known fields strictly and preserve unknown ones only inside `extras`."""

    model_config = ConfigDict(
        extra="allow",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        protected_namespaces=(),
        loc_by_alias=False,
        allow_inf_nan=False,  # a float is finite: the trainer and the CR's JSON have no use for inf / nan
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return refuse_non_number(value, field.annotation) if field is not None else value

    @model_validator(mode="before")
    @classmethod
    def _unpack_extras(cls, data: Any, info: ValidationInfo) -> Any:
        if _is_cr(info) and isinstance(data, dict) and EXTRAS_KEY in data:
            data = dict(data)
            extras = data.pop(EXTRAS_KEY) or {}
            if isinstance(extras, dict):
                return {**extras, **data}
        return data

    @model_serializer(mode="wrap")
    def _pack_extras(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if _is_cr(info) and self.model_extra and isinstance(data, dict):
            extras = {key: data.pop(key) for key in list(self.model_extra) if key in data}
            if extras:
                data[EXTRAS_KEY] = extras
        return data
