"""argparse types for numeric flags: finite and in range, refused as a usage error (exit 2) otherwise."""

from __future__ import annotations

import argparse
import math


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
