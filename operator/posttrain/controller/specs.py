"""Reading custom-resource dicts: camelCase fields with a snake_case fallback and a section's `extras`;
the spec -> synth config conversion and the model-id rules (from posttrain.api when it is importable)."""

from __future__ import annotations

import re
from typing import Any

EXTRAS = "extras"
# Spec fields that are the operator's business, not the trainer's config.
OPERATOR_ONLY = {
    "suspend",
    "taskApp",
    "originalToml",
    "images",
    "scheduling",
    "activeDeadlineSeconds",
    "storage",
    "dataset",
    "validationDataset",
}


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower()


def get(section: Any, camel: str, default: Any = None) -> Any:
    """A field by its camelCase name, its snake_case name, or from the section's extras."""
    if not isinstance(section, dict):
        return default
    for key in (camel, snake(camel)):
        if section.get(key) is not None:
            return section[key]
    extras = section.get(EXTRAS)
    if isinstance(extras, dict):
        for key in (camel, snake(camel)):
            if extras.get(key) is not None:
                return extras[key]
    return default


def section(spec: Any, camel: str) -> dict[str, Any]:
    value = get(spec, camel)
    return value if isinstance(value, dict) else {}


def _to_config(value: Any) -> Any:
    if isinstance(value, list):
        return [_to_config(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == EXTRAS and isinstance(item, dict):
            continue
        out[snake(key)] = _to_config(item)
    extras = value.get(EXTRAS)
    if isinstance(extras, dict):
        for key, item in extras.items():
            out.setdefault(key, item)  # unknown keys keep their spelling
    return out


def _fallback_spec_to_config(spec: dict[str, Any]) -> dict[str, Any]:
    trimmed = {k: v for k, v in spec.items() if k not in OPERATOR_ONLY}
    return _to_config(trimmed)


def spec_to_config(spec: dict[str, Any], kind: str = "rl") -> dict[str, Any]:
    """The normalised synth config (snake_case, extras inline) for the trainer's job file."""
    try:  # issue 2's conversion is the source of truth once it exists
        from posttrain.api import convert  # type: ignore[attr-defined]

        fn = getattr(convert, "spec_to_config", None)
        if fn is not None:
            try:
                return dict(fn(spec, kind=kind))
            except TypeError:
                return dict(fn(spec))
    except ImportError:
        pass
    return _fallback_spec_to_config(spec)


# ---------------------------------------------------------------------------------------- model ids
def uid8(uid: str) -> str:
    return uid.replace("-", "")[:8]


def job_artifact_prefix(namespace: str, name: str, uid: str) -> str:
    try:
        from posttrain.api.model_ids import job_artifact_prefix as fn  # type: ignore[import-not-found]

        return fn(namespace, name, uid)
    except ImportError:
        return f"jobs/{namespace}/{name}-{uid8(uid)}/"


def fine_tuned_model_id(kind_prefix: str, base: str, namespace: str, name: str, uid: str) -> str:
    try:
        from posttrain.api.model_ids import fine_tuned_model_id as fn  # type: ignore[import-not-found]

        return fn(kind_prefix, base, namespace, name, uid)
    except ImportError:
        return f"{kind_prefix}:{base}:{namespace}.{name}.{uid8(uid)}"


def resolve_model_source(model_id: str, bucket: str) -> str:
    try:
        from posttrain.api.model_ids import resolve_model_source as fn  # type: ignore[import-not-found]

        return fn(model_id, bucket)
    except ImportError:
        _, _, rest = model_id.partition(":")
        _, _, tail = rest.rpartition(":")
        ns, name, short = tail.split(".", 2)
        return f"s3://{bucket}/jobs/{ns}/{name}-{short}/final/"


def base_of_model_id(model_id: str) -> str:
    """`rl:<base>:<ns>.<name>.<uid8>` -> `<base>` (the base may itself contain ':' in theory)."""
    _, _, rest = model_id.partition(":")
    base, _, _ = rest.rpartition(":")
    return base or rest
