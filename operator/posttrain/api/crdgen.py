"""CustomResourceDefinitions generated from the pydantic models (one source of truth).

Structural OpenAPI v3 schemas: every field typed; `x-kubernetes-preserve-unknown-fields` only on the
`extras` objects where a section's unknown TOML keys live. Strings, lists and maps carry maxLength /
maxItems / maxProperties so that the API server's CEL cost estimate accepts the rules. CEL rules
(x-kubernetes-validations) for the cross-field checks and for spec immutability (except `suspend`)."""

from __future__ import annotations

import inspect
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from posttrain.api.base import EXTRAS_KEY, CRModel, Section
from posttrain.api.fields import metadata_of, strip_annotated
from posttrain.api.resources import (
    GROUP,
    KINDS,
    QUANTITY_PATTERN,
    VERSION,
    ComputeConfig,
    DatasetRef,
    ModelSection,
    RLJobSpec,
    SFTJobSpec,
    TaskAppRef,
    TaskAppSpec,
)
from posttrain.api.sections import TopologyConfig
from posttrain.api.settings import RL_ALGORITHMS
from posttrain.api.urls import URL_MESSAGE, URL_PATTERN

DEFAULT_MAX_LENGTH = 1024
DEFAULT_MAX_ITEMS = 256
DEFAULT_MAX_PROPERTIES = 64
CATEGORY = "posttrain"

# A task app's URL: posttrain.api.urls' rule (scheme, host, no user info, query or fragment).
_URL_RULE = f"!has(self.url) || self.url.matches({json.dumps(URL_PATTERN)})"
IMMUTABLE_MESSAGE = "is immutable: a new TOML is a new job (only spec.suspend may change)"

# CEL rules per model class (all of the class's uses get them).
RULES: dict[type[BaseModel], list[dict[str, str]]] = {
    ModelSection: [
        {
            "rule": "has(self.base) != has(self.source)",
            "message": "Config must set exactly one of [model].source or [model].base (model.source, model.base)",
        }
    ],
    TopologyConfig: [
        {
            "rule": "!has(self.tensorParallel) || !has(self.gpusForVllm) || self.gpusForVllm % self.tensorParallel == 0",
            "message": "topology.tensorParallel must divide topology.gpusForVllm",
        }
    ],
    ComputeConfig: [
        {
            "rule": "!has(self.topology) || !has(self.topology.gpusForVllm) || !has(self.topology.gpusForTraining)"
            " || !has(self.topology.gpusForRef) || self.topology.gpusForVllm + self.topology.gpusForTraining"
            " + self.topology.gpusForRef == self.gpuCount",
            "message": "gpusForVllm + gpusForTraining + gpusForRef must equal compute.gpuCount",
        },
        {
            "rule": "!has(self.nodes) || !has(self.topology) || !has(self.topology.gpusForTraining)"
            " || self.topology.gpusForTraining % self.nodes == 0",
            "message": "compute.nodes must divide topology.gpusForTraining",
        },
    ],
    TaskAppRef: [
        {"rule": "has(self.name) != has(self.url)", "message": "taskApp: set exactly one of name or url"},
        {"rule": _URL_RULE, "message": f"taskApp.url {URL_MESSAGE}", "fieldPath": ".url"},
    ],
    DatasetRef: [
        {
            "rule": "has(self.uri) != has(self.configMapRef)",
            "message": "set exactly one of uri or configMapRef",
        }
    ],
    TaskAppSpec: [
        {"rule": "has(self.url) != has(self.image)", "message": "set exactly one of url or image"},
        {"rule": _URL_RULE, "message": f"spec.url {URL_MESSAGE}", "fieldPath": ".url"},
    ],
}
SPEC_RULES: dict[type[BaseModel], list[dict[str, str]]] = {
    RLJobSpec: [
        # the RL varieties of posttrain.api.settings.RL_ALGORITHMS, each with its method
        {
            "rule": "self.algorithm.type == 'online' && ("
            + " || ".join(f"(self.algorithm.method == '{m.method}' && self.algorithm.variety == '{v}')"
                          for v, m in RL_ALGORITHMS.items())  # fmt: skip
            + ")",
            "message": "RL algorithm must be "
            + " or ".join(f"(online, {m.method}, {v})" for v, m in RL_ALGORITHMS.items()),
        },
        {
            "rule": " || ".join(f"self.algorithm.variety == '{v}'" for v, m in RL_ALGORITHMS.items() if not m.needs_groups)
            + " || !has(self.training) || self.training.groupSize >= 2",
            "message": "GSPO needs training.groupSize >= 2",
        },
    ],
    SFTJobSpec: [
        {
            "rule": "self.algorithm.type == 'offline' && (self.algorithm.method == 'sft'"
            " || self.algorithm.method == 'supervised_finetune') && (self.algorithm.variety == 'fft'"
            " || (self.algorithm.variety == 'lora' && self.algorithm.method == 'sft'))",
            "message": "SFT algorithm must be (offline, sft, fft|lora) or (offline, supervised_finetune, fft)",
        }
    ],
}
# Specs whose fields (except suspend) may not change after creation.
IMMUTABLE_SPECS = (RLJobSpec, SFTJobSpec)


def _description(field: FieldInfo | None, cls: type | None = None) -> str | None:
    if field is not None and field.description:
        return field.description
    if cls is not None and cls.__doc__ and cls not in (Section, CRModel):
        return inspect.cleandoc(cls.__doc__).split("\n\n")[0].replace("\n", " ")
    return None


def _constraints(field: FieldInfo | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for meta in metadata_of(field) if field is not None else []:
        if isinstance(meta, annotated_types.Ge):
            out["minimum"] = meta.ge
        elif isinstance(meta, annotated_types.Gt):
            out["minimum"] = meta.gt
            out["exclusiveMinimum"] = True
        elif isinstance(meta, annotated_types.Le):
            out["maximum"] = meta.le
        elif isinstance(meta, annotated_types.Lt):
            out["maximum"] = meta.lt
            out["exclusiveMaximum"] = True
        elif isinstance(meta, annotated_types.MaxLen):
            out["maxLength"] = meta.max_length
        elif isinstance(meta, annotated_types.MinLen):
            out["minLength"] = meta.min_length
    extra = field.json_schema_extra if field is not None else None
    if isinstance(extra, dict) and extra.get("pattern"):
        out["pattern"] = extra["pattern"]
    return out


def _unwrap_optional(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        return Union[tuple(args)]  # noqa: UP007
    return annotation


def type_schema(annotation: Any, field: FieldInfo | None = None) -> dict[str, Any]:
    """The structural schema of one annotation (with the field's constraints)."""
    annotation = strip_annotated(_unwrap_optional(annotation))  # a shared type's bounds: _constraints
    cons = _constraints(field)
    max_len = cons.pop("maxLength", None)
    min_len = cons.pop("minLength", None)
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    schema: dict[str, Any]
    if origin in (Union, types.UnionType):
        if set(args) == {int, str}:  # the models' only int-or-string is a resource quantity
            return {"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}
        if set(args) == {int, float}:
            return {"type": "number", **cons}
        raise TypeError(f"unsupported union {annotation!r}")
    if origin is Literal:
        values = list(args)
        kind = "string" if all(isinstance(v, str) for v in values) else "integer"
        return {"type": kind, "enum": values}
    if origin is list:
        schema = {"type": "array", "items": type_schema(args[0]), "maxItems": max_len or DEFAULT_MAX_ITEMS}
        if min_len:
            schema["minItems"] = min_len
        return schema
    if origin is dict:
        return {"type": "object", "additionalProperties": type_schema(args[1]),
                "maxProperties": max_len or DEFAULT_MAX_PROPERTIES}  # fmt: skip
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer", **cons}
    if annotation is float:
        return {"type": "number", **cons}
    if annotation is str:
        schema = {"type": "string", "maxLength": max_len or DEFAULT_MAX_LENGTH}
        if min_len:
            schema["minLength"] = min_len
        if cons.get("pattern"):
            schema["pattern"] = cons["pattern"]
        return schema
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return object_schema(annotation)
    if annotation is Any:
        raise TypeError("Any has no structural schema; type the field or leave it to extras")
    raise TypeError(f"unsupported annotation {annotation!r}")


def _alias(cls: type[BaseModel], name: str, field: FieldInfo) -> str:
    if field.alias:
        return field.alias
    generator = cls.model_config.get("alias_generator")
    return generator(name) if callable(generator) else name


def _is_simple_default(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) and value is not None


def object_schema(cls: type[BaseModel], *, immutable: bool = False) -> dict[str, Any]:
    properties: dict[str, Any] = {}
    required: list[str] = []
    hints = typing.get_type_hints(cls)
    for name, field in cls.model_fields.items():
        alias = _alias(cls, name, field)
        prop = type_schema(hints[name], field)
        description = _description(field)
        inner = _unwrap_optional(hints[name])
        if description is None and inspect.isclass(inner) and issubclass(inner, BaseModel):
            description = _description(None, inner)
        if description:
            prop = {"description": description, **prop}
        if field.is_required():
            required.append(alias)
        elif issubclass(cls, CRModel) and _is_simple_default(field.default):
            prop["default"] = field.default
        if immutable and name != "suspend":
            prop.setdefault("x-kubernetes-validations", []).append(
                {"rule": "self == oldSelf", "message": f"spec.{alias} {IMMUTABLE_MESSAGE}"}
            )
        properties[alias] = prop
    if issubclass(cls, Section):
        properties[EXTRAS_KEY] = {
            "description": "Keys of this TOML section that posttrain does not type; handed to the trainer as they are.",
            "type": "object",
            "x-kubernetes-preserve-unknown-fields": True,
        }
        if immutable:
            properties[EXTRAS_KEY]["x-kubernetes-validations"] = [
                {"rule": "self == oldSelf", "message": f"spec.extras {IMMUTABLE_MESSAGE}"}
            ]
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = sorted(required)
    rules = list(RULES.get(cls, [])) + list(SPEC_RULES.get(cls, []))
    if immutable:
        names = [n for n in properties if n != "suspend"]
        now = ", ".join(f"has(self.{n})" for n in names)
        old = ", ".join(f"has(oldSelf.{n})" for n in names)
        rules.append(
            {
                "rule": f"[{now}] == [{old}]",
                "message": f"spec fields may not be added or removed; {IMMUTABLE_MESSAGE}",
            }
        )
    if rules:
        schema["x-kubernetes-validations"] = rules
    return schema


def printer_columns(kind: str) -> list[dict[str, Any]]:
    """What someone polling `kubectl get` wants first: phase, progress as step/total, the score that says
    whether it learns (reward for RL, loss for SFT), the held-out eval, why (reason), age. Model ids are
    long (a fine-tuned id is ~70 characters): they are `-o wide` columns (priority 1)."""
    age = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
    if kind == "TaskApp":
        return [
            {"name": "Verified", "type": "boolean", "jsonPath": ".status.verified"},
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
            age,
            {"name": "URL", "type": "string", "jsonPath": ".status.url", "priority": 1},
            {"name": "Task", "type": "string", "jsonPath": ".status.taskInfo.name", "priority": 1},
        ]
    score = (
        {"name": "Reward", "type": "number", "jsonPath": ".status.progress.meanReturn"}
        if kind == "RLJob"
        else {"name": "Loss", "type": "number", "jsonPath": ".status.progress.loss"}
    )
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Progress", "type": "string", "jsonPath": ".status.progress.display"},
        score,
        {"name": "Eval", "type": "number", "jsonPath": ".status.progress.evalScore"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        age,
        {"name": "Model", "type": "string", "jsonPath": ".status.model", "priority": 1},
        {"name": "Fine-Tuned-Model", "type": "string", "jsonPath": ".status.fineTunedModel", "priority": 1},
    ]


def crd(kind: str) -> dict[str, Any]:
    info = KINDS[kind]
    spec_cls = info["spec"]
    spec_schema = object_schema(spec_cls, immutable=spec_cls in IMMUTABLE_SPECS)
    spec_schema = {"description": _description(None, spec_cls), **spec_schema}
    status_schema = {"description": f"Observed state of the {kind}, written by the operator and the trainer.",
                     **object_schema(info["status"])}  # fmt: skip
    schema = {
        "type": "object",
        "description": _description(None, spec_cls),
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "required": ["spec"],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{info['plural']}.{GROUP}",
            "labels": {"app.kubernetes.io/part-of": "posttrain"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": info["plural"],
                "singular": info["singular"],
                "shortNames": info["short"],
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(kind),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


HEADER = "# Generated by `posttrain crds` from posttrain.api (operator/posttrain/api/); do not edit.\n"


def crd_files() -> dict[str, str]:
    """File name -> YAML text of every CRD (what crds/ must hold)."""
    import yaml

    out = {}
    for kind in KINDS:
        doc = crd(kind)
        text = yaml.safe_dump(doc, sort_keys=False, width=120)
        out[f"{GROUP}_{KINDS[kind]['plural']}.yaml"] = HEADER + text
    return out


def write_crds(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in crd_files().items():
        path = directory / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written.append(path)
    return written
