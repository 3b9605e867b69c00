"""Find the line of a dotted key path in TOML text, for error messages (`file.toml:12: model.base: ...`).

A small line scanner, not a parser: it tracks `[table]` / `[[array]]` headers and `key = value` lines
(dotted and quoted keys included). Multi-line strings and arrays are skipped over well enough for locating.
When the exact path is absent it falls back to the longest prefix that exists (e.g. the `[model]` header for
a missing model.base), and it knows the lenient aliases (policy.model for model.base, [topology] for
[compute.topology], ...)."""

from __future__ import annotations

import re

# normalised path prefix -> prefixes it may have been written as
ALIASES: dict[str, tuple[str, ...]] = {
    "compute.topology": ("topology",),
    "judge": ("verifier",),
    "training.lora": ("lora",),
    "model.base": ("policy.model_name", "policy.model"),
    "model.source": ("policy.source",),
    "model.trainer_mode": ("policy.trainer_mode",),
    "model.label": ("policy.label",),
    "model": ("policy",),
    "services.judge_url": ("services.verifier_url",),
    "job.data": ("job.data_path",),
}

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*)\s*="""
)


def _split_key(key: str) -> list[str]:
    parts = re.findall(r""""([^"]*)"|'([^']*)'|([A-Za-z0-9_\-]+)""", key)
    return [a or b or c for a, b, c in parts]


def key_lines(text: str) -> dict[str, int]:
    """Every table and key path in `text` -> its first line number (1-based)."""
    out: dict[str, int] = {}
    table: list[str] = []
    in_multiline: str | None = None
    depth = 0
    for number, line in enumerate(text.splitlines(), start=1):
        if in_multiline:
            if in_multiline in line:
                in_multiline = None
            continue
        if depth > 0:
            depth += line.count("[") - line.count("]")
            continue
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        header = _HEADER.match(line)
        if header and "=" not in header.group(2):
            table = _split_key(header.group(2))
            out.setdefault(".".join(table), number)
            continue
        key = _KEY.match(line)
        if key:
            path = ".".join(table + _split_key(key.group(1)))
            out.setdefault(path, number)
            rest = line[key.end() :]
            for quote in ('"""', "'''"):
                if rest.count(quote) == 1:
                    in_multiline = quote
            if not in_multiline:
                value = rest.split("#", 1)[0]
                depth = value.count("[") - value.count("]")
                # inline tables: record their keys too (one level)
                inline = re.match(r"\s*\{(.*)\}\s*$", value)
                if inline:
                    for sub in re.finditer(r"([A-Za-z0-9_\-]+)\s*=", inline.group(1)):
                        out.setdefault(f"{path}.{sub.group(1)}", number)
    return out


def _candidates(path: str) -> list[str]:
    out = [path]
    for norm, originals in ALIASES.items():
        if path == norm or path.startswith(norm + "."):
            out += [orig + path[len(norm) :] for orig in originals]
    return out


def locate(text: str, path: str | None) -> int | None:
    """Line of `path` (dotted, e.g. "compute.topology.gpus_for_vllm"), of its nearest existing prefix, or
    None when nothing of it is in the text."""
    if not path:
        return None
    lines = key_lines(text)
    path = path.split(",")[0].strip()
    parts = path.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        for candidate in _candidates(prefix):
            if candidate in lines:
                return lines[candidate]
    return None
