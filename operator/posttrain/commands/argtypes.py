"""argparse types: numbers finite and in range, Kubernetes names and URLs checked like the fields they fill;
refused as a usage error (exit 2) otherwise."""

from __future__ import annotations

import argparse
import math
import re


def positive_float(text: str) -> float:
    """A finite number > 0 (seconds, rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1 (counts)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1 or value > 1_000_000:
        raise argparse.ArgumentTypeError(f"expected a whole number between 1 and 1000000, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (temperatures)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """Any finite number (thresholds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


# Kubernetes names, checked like the TOML fields and CR fields they fill: a flag is refused (exit 2) with what
# a good value looks like, instead of YAML the API server would refuse later.
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def namespace(text: str) -> str:
    """A namespace: a DNS-1123 label (lower-case letters, digits, '-'; at most 63)."""
    if not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid namespace (use lower-case letters, digits and '-', at most 63, e.g. team-a)"
        )
    return text


def job_name(text: str) -> str:
    """A job's metadata.name: a DNS-1123 label (its pods and Services are named after it)."""
    if not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid job name (use lower-case letters, digits and '-', at most 63, e.g. math-rl)"
        )
    return text


def object_name(text: str) -> str:
    """An object's name (a Secret, a TaskApp): a DNS-1123 subdomain (at most 253)."""
    if not _DNS_SUBDOMAIN.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid object name (use lower-case letters, digits, '-' and '.', e.g. math-task-app-key)"
        )
    return text


def http_url(text: str) -> str:
    """A task app URL, checked by the very rule of [services].task_url (the field the flag replaces)."""
    from pydantic import ValidationError

    from posttrain.api.sections import ServicesConfig

    try:
        ServicesConfig.model_validate({"task_url": text})
    except ValidationError as err:
        message = str(err.errors()[0]["msg"]).removeprefix("Value error, ")
        message, _, fix = message.partition(" -- fix: ")
        raise argparse.ArgumentTypeError(f"{message} ({fix})" if fix else message) from None
    return text.strip()
