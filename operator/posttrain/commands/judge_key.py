"""`convert --judge-key-secret NAME[:KEY]`: the Secret (and its key) holding the judge provider's API key, set
as [judge].api_key_secret_ref without editing the TOML (synth's hosted-judge examples name no Secret: a
cluster job takes a judge's key only from a Secret it names). Without KEY the operator reads
<PROVIDER>_API_KEY (OPENAI_API_KEY for provider "openai")."""

from __future__ import annotations

import argparse
import re
from typing import Any

from posttrain.commands.argtypes import object_name

FLAG = "--judge-key-secret"
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]{1,253}")


def parse(text: str) -> tuple[str, str | None]:
    """argparse type: NAME[:KEY] -> (Secret name, key or None)."""
    name, sep, key = text.partition(":")
    object_name(name)  # raises ArgumentTypeError naming a good value
    if sep and not _SECRET_KEY.fullmatch(key):
        raise argparse.ArgumentTypeError(
            f"{key!r} is not a valid Secret key (letters, digits, '-', '_', '.'; e.g. OPENAI_API_KEY)"
        )
    return name, key or None


def overrides(raw: dict[str, Any], value: tuple[str, str | None] | None) -> list[tuple[str, Any]]:
    """`--set`-style overrides for the judge's table ([judge], or [verifier] when the file spells it so);
    none when the config has no judge (the caller warns)."""
    if value is None:
        return []
    section = "verifier" if isinstance(raw.get("verifier"), dict) and "judge" not in raw else "judge"
    if not isinstance(raw.get(section), dict):
        return []
    name, key = value
    out: list[tuple[str, Any]] = [(f"{section}.api_key_secret_ref.name", name)]
    if key:
        out.append((f"{section}.api_key_secret_ref.key", key))
    return out
