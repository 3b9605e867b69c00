"""`--allow-experimental` (synth's flag) on convert, validate, train and eval: experimental models (the
235B/480B ones and every *-Thinking-2507, posttrain.api.model_ids) are accepted, as SDK_EXPERIMENTAL=1 does.
The flag sets that variable for this process and what it starts (a local run's trainer, a model server)."""

from __future__ import annotations

import argparse
import os

VARIABLE = "SDK_EXPERIMENTAL"


def add_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-experimental", action="store_true",
        help=f"accept experimental models (235B/480B, *-Thinking-2507), as {VARIABLE}=1 does",
    )  # fmt: skip


def apply(args: argparse.Namespace) -> None:
    """Before the config is read: the flag turns the experimental models on (the variable itself still
    works without it)."""
    if getattr(args, "allow_experimental", False):
        os.environ[VARIABLE] = "1"
