"""Every string the operator writes into a status or an Event is bounded here, in one place, before it is
written. The limits are the CRD's own (generated from posttrain.api's models), so a status the operator
derives can never be refused by the API server for its length: a long task-app URL, three long pod
problems or a long model id end in "..." instead of a 422 on every status PATCH."""

from __future__ import annotations

from functools import cache
from typing import Any

ELLIPSIS = "..."
EVENT_MESSAGE_MAX = 1024  # the events.k8s.io note limit; core/v1 Events are kept to the same


def truncate(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, marked with "..." when cut."""
    if len(text) <= limit:
        return text
    if limit <= len(ELLIPSIS):
        return text[:limit]
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS


@cache
def status_schema(kind: str) -> dict[str, Any]:
    """The OpenAPI schema of `status` in the generated CRD of `kind` (RLJob, SFTJob, TaskApp)."""
    from posttrain.api.crdgen import crd

    version = crd(kind)["spec"]["versions"][0]
    return version["schema"]["openAPIV3Schema"]["properties"]["status"]


def bound(value: Any, schema: dict[str, Any]) -> Any:
    """`value` with every string cut to its schema's maxLength and every list to its maxItems."""
    if isinstance(value, str):
        limit = schema.get("maxLength")
        return truncate(value, int(limit)) if limit else value
    if isinstance(value, list):
        items = schema.get("items") or {}
        limit = schema.get("maxItems")
        kept = value[-int(limit) :] if limit and len(value) > int(limit) else value
        return [bound(item, items) for item in kept]
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        out = {}
        for key, item in value.items():
            sub = properties.get(key) or (extra if isinstance(extra, dict) else {})
            out[key] = bound(item, sub)
        return out
    return value


def bound_status(kind: str, status: dict[str, Any]) -> dict[str, Any]:
    """A status (or a merge patch of one) of a `kind` object with every string within the CRD's limits."""
    return bound(status, status_schema(kind))


def event_message(text: Any) -> str:
    return truncate(str(text or ""), EVENT_MESSAGE_MAX)
