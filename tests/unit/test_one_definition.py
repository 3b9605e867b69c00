"""One definition per setting: every trainer settings field (posttrain.api.settings) that reads a key the TOML
schema types (posttrain.api.sections, also the CRD and the generated reference) agrees with that section field
on type, bounds and default. Both use the shared types of posttrain.api.fields; this test fails when one side
drifts (a bound added to one only, a default in the section that the trainer does not apply, ...).

Defaults: a section field is either required (the settings default then only serves job files written by hand,
tests and tools), or None (unset: the settings default applies, the one definition), or the same value."""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Literal, Union

import annotated_types
import pytest
from posttrain.api.config import RLConfig, SFTConfig
from posttrain.api.settings import (
    DAPOSettings,
    GSPOSettings,
    RestemSettings,
    SFTSettings,
    ValidationSettings,
    keys_of,
)
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

BOUNDS = ("ge", "gt", "le", "lt", "max_length")
PAIRS = [(GSPOSettings, RLConfig), (DAPOSettings, RLConfig), (RestemSettings, RLConfig),
         (SFTSettings, SFTConfig), (ValidationSettings, SFTConfig)]  # fmt: skip


def section_field(root: type[BaseModel], path: str) -> FieldInfo | None:
    """The field of the TOML model at a dotted path, or None where the schema does not type it."""
    node: Any = root
    info = None
    for part in path.split("."):
        if not (isinstance(node, type) and issubclass(node, BaseModel)) or part not in node.model_fields:
            return None
        info = node.model_fields[part]
        node = next((a for a in (info.annotation, *typing.get_args(info.annotation))
                     if isinstance(a, type) and issubclass(a, BaseModel)), None)  # fmt: skip
    return info


def shape(info: FieldInfo) -> tuple[Any, dict[str, Any]]:
    """(the value type without None and without Annotated, its bounds) of a field."""
    bounds: dict[str, Any] = {}

    def collect(meta: Any) -> None:
        if isinstance(meta, FieldInfo):
            for m in meta.metadata:
                collect(m)
        for name in BOUNDS:
            value = getattr(meta, name, None)
            if value is not None and isinstance(meta, annotated_types.BaseMetadata | FieldInfo):
                bounds[name] = value

    for meta in info.metadata:
        collect(meta)
    annotation = info.annotation
    while True:
        if typing.get_origin(annotation) in (Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else tuple(args)
        elif typing.get_origin(annotation) is Annotated:
            annotation, *metadata = typing.get_args(annotation)
            for meta in metadata:
                collect(meta)
        else:
            return annotation, bounds


def pairs() -> list[tuple[str, str, str, FieldInfo, FieldInfo]]:
    out = []
    for settings, root in PAIRS:
        for name, info in settings.model_fields.items():
            for path in keys_of(info):
                section = section_field(root, path)
                if section is not None:
                    out.append((settings.__name__, name, path, info, section))
    return out


def test_the_walk_finds_the_pairs():
    found = {(s, n, p) for s, n, p, _, _ in pairs()}
    assert len(found) > 40
    assert ("GSPOSettings", "group_size", "training.group_size") in found
    assert ("SFTSettings", "learning_rate", "hyperparameters.learning_rate") in found


@pytest.mark.parametrize(("settings", "name", "path", "info", "section"), pairs(),
                         ids=[f"{s}.{n}<-{p}" for s, n, p, _, _ in pairs()])  # fmt: skip
def test_a_setting_and_the_section_field_it_reads_agree(settings, name, path, info, section):
    mine, theirs = shape(info), shape(section)
    assert mine[0] == theirs[0], f"{settings}.{name} is {mine[0]}, the TOML's {path} is {theirs[0]}"
    assert mine[1] == theirs[1], f"{settings}.{name} bounds {mine[1]}, the TOML's {path} bounds {theirs[1]}"
    if section.default not in (PydanticUndefined, None):
        assert section.default == info.get_default(call_default_factory=True), (
            f"{path}: the TOML's default {section.default!r} is not what {settings}.{name} applies"
        )


def test_the_check_catches_a_drifted_bound():
    """The comparison itself can fail: a settings field with a looser bound than its section field."""
    loose = FieldInfo.from_annotation(Annotated[int, annotated_types.Ge(1)])
    strict = RLConfig.model_fields["training"]
    group = section_field(RLConfig, "training.group_size")
    assert strict is not None and group is not None
    assert shape(loose)[1] != shape(group)[1]
    assert shape(FieldInfo.from_annotation(Literal["a", "b"] | None))[0] == Literal["a", "b"]
