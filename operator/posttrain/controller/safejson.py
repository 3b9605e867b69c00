"""Decoding what the API server sends, whatever a tenant stored. The API server keeps objects nested far
deeper than Python can take (its JSON decoder allows 10,000 levels; a CRD stored before the schema bounded
`extras`, or an older CRD, lets them through): `json.loads` of such an object raises RecursionError, and
in kopf's watch that ends the operator, and a restarted one dies on the same object.

`loads` decodes every response body and watch line of the operator (its own client, controller/kube.py,
and kopf's, hooked by `install_kopf_hook`): a text nested no deeper than MAX_DEPTH is decoded as it is
(the depth is measured by C-speed byte operations, not a Python walk); a deeper one has every value below
MAX_DEPTH replaced by a placeholder, and each object of the response (a watch event's `object`, a list's
`items`, or the body itself) that had one carries UNDECODABLE: the path of the first value cut away.
controller/objects.py refuses such an object's spec (the job ends Failed, naming the field), so the
operator skips it, says why in its status, and goes on with every other job."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64  # far beyond any object the operator makes or reads (a Deployment nests about 15 deep)
UNDECODABLE = "__posttrainUndecodable"  # set on an object whose values below MAX_DEPTH were cut away
PLACEHOLDER = "\x00posttrain: nested too deep\x00"  # what a cut value becomes (no JSON text holds a NUL)
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def depth_exceeds(raw: bytes, limit: int = MAX_DEPTH) -> bool:
    """Whether the JSON text nests deeper than `limit`: the strings are dropped, then the brackets kept,
    then innermost pairs removed `limit` times (whatever is left was deeper)."""
    if raw.count(b"{") + raw.count(b"[") <= limit:
        return False
    skeleton = _STRING.sub(b"", raw).translate(None, _BRACKETS)
    for _ in range(limit):
        shorter = skeleton.replace(b"{}", b"").replace(b"[]", b"")
        if shorter == skeleton:
            break
        skeleton = shorter
    return bool(skeleton)


def truncate(raw: bytes, limit: int = MAX_DEPTH) -> bytes:
    """The JSON text with every object or array that opens below `limit` replaced by PLACEHOLDER."""
    out: list[bytes] = []
    depth = 0
    pos = 0
    cut_from: int | None = None
    for match in _TOKEN.finditer(raw):
        token = match.group()
        if token[0] == 0x22:  # a string: its brackets do not count
            continue
        if token in (b"{", b"["):
            depth += 1
            if depth == limit + 1 and cut_from is None:
                out.append(raw[pos : match.start()])
                cut_from = match.start()
        else:
            if depth == limit + 1 and cut_from is not None:
                out.append(json.dumps(PLACEHOLDER).encode())
                pos = match.end()
                cut_from = None
            depth -= 1
    out.append(raw[pos:])
    return b"".join(out)


def _cut_path(value: Any, path: str = "") -> str | None:
    """The path of the first placeholder in a decoded (bounded) value."""
    if isinstance(value, dict):
        for key, item in value.items():
            found = _cut_path(item, f"{path}.{key}" if path else str(key))
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _cut_path(item, f"{path}[{index}]")
            if found is not None:
                return found
    elif value == PLACEHOLDER:
        return path
    return None


def _mark(obj: Any) -> None:
    if isinstance(obj, dict):
        # the spec first: metadata.managedFields mirrors every field a client set, as deep
        ordered = sorted(obj, key=lambda key: (key != "spec", key == "metadata"))
        path = next((p for key in ordered if (p := _cut_path(obj[key], str(key))) is not None), None)
        if path is not None:
            obj[UNDECODABLE] = path if len(path) <= 120 else path[:120] + "..."


def loads(raw: bytes | str) -> Any:
    """json.loads that never raises RecursionError (see the module's docstring)."""
    data = raw.encode() if isinstance(raw, str) else bytes(raw)
    if not depth_exceeds(data):
        return json.loads(data)
    decoded = json.loads(truncate(data))
    if isinstance(decoded, dict) and isinstance(decoded.get("object"), dict):  # a watch event
        _mark(decoded["object"])
    elif isinstance(decoded, dict) and isinstance(decoded.get("items"), list):  # a list
        for item in decoded["items"]:
            _mark(item)
    else:
        _mark(decoded)
    return decoded


def undecodable(obj: dict[str, Any]) -> str | None:
    """Where an object was cut (a path such as spec.training.extras.a.a), or None when it was read whole."""
    path = obj.get(UNDECODABLE)
    return str(path) if path is not None else None


def install_kopf_hook() -> None:
    """Make kopf decode every response body and watch line with `loads`. kopf 1.45 decodes them in
    kopf._cogs.clients.api: `get()`, `post()`, `patch()`, `delete()` (`response.json()`: lists, and the
    objects a patch echoes) and `stream()` (the watch lines: `json.loads`, the module's `json`). Those
    module attributes are replaced, once; kopf's callers look them up at each call."""
    from kopf._cogs.clients import api

    if getattr(api, "_posttrain_safe_json", False):
        return

    class _Json:  # what `stream()` calls as `json.loads`
        loads = staticmethod(loads)
        dumps = staticmethod(json.dumps)

    def decoding(method: str) -> Any:
        async def call(url: str, *, settings: Any, logger: Any, **kwargs: Any) -> Any:
            response = await api.request(method=method, url=url, settings=settings, logger=logger, **kwargs)
            async with response:
                content = await response.read()
            return loads(content) if content.strip() else None  # as aiohttp's json(): None when empty

        call.__name__ = method
        return call

    api.json = _Json  # type: ignore[assignment]
    for method in ("get", "post", "patch", "delete"):
        setattr(api, method, decoding(method))
    api._posttrain_safe_json = True  # type: ignore[attr-defined]
