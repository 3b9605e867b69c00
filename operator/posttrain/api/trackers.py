"""`report_to`: experiment trackers a trainer writes each step's metrics to, besides metrics.jsonl and
/metrics (docs/monitoring.md). `[training] report_to = "tensorboard"` (or a list; "none" = only the built-in
ones). TensorBoard event files go to the job's S3 folder (tensorboard/), which TensorBoard reads. "mlflow" and
"wandb" need their package where the trainer runs and their settings in its environment; `posttrain
validate` / `train` say which is missing before a job starts, and the trainer refuses to start without them.

Pure: the checks take the environment and the set of installed modules as arguments."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

TRACKERS = ("tensorboard", "mlflow", "wandb")
FIELD = "training.report_to"
# tracker -> (module, environment variables of which one must be set, what to set)
NEEDS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "tensorboard": ("tensorboard", (), ""),
    "mlflow": ("mlflow", ("MLFLOW_TRACKING_URI",), "MLFLOW_TRACKING_URI (e.g. http://mlflow:5000)"),
    "wandb": ("wandb", ("WANDB_API_KEY", "WANDB_MODE"),
              "WANDB_API_KEY (in a Secret), or WANDB_MODE=offline; WANDB_PROJECT names the project"),
}  # fmt: skip


# What a cluster trainer reads from the Secret OperatorSettings.tracker_secret_name in its job's namespace
# (optional keys; docs/monitoring.md): only for the trackers the job names.
ENV_KEYS: dict[str, tuple[str, ...]] = {
    "mlflow": ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME",
               "MLFLOW_TRACKING_PASSWORD", "MLFLOW_EXPERIMENT_NAME"),
    "wandb": ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_BASE_URL"),
}  # fmt: skip
CLUSTER_HINT = "in a cluster, a key of the Secret posttrain-trackers in the job's namespace"


def normalize(value: Any) -> list[str] | None:
    """A string ("tensorboard", "tensorboard,mlflow", "all", "none") or a list -> the trackers, in order."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ValueError('report_to is a string or a list of strings, e.g. "tensorboard" or ["tensorboard", "mlflow"]')
    out: list[str] = []
    for item in (i.strip().lower() for i in items):
        if item in ("", "none"):
            continue
        names = TRACKERS if item == "all" else (item,)
        for name in names:
            if name not in TRACKERS:
                raise ValueError(f"report_to {item!r} is not one of {', '.join(TRACKERS)}, all, none")
            if name not in out:
                out.append(name)
    return out


def report_to(config: Mapping[str, Any]) -> list[str]:
    """The trackers a normalised config asks for ([training].report_to)."""
    return normalize((config.get("training") or {}).get("report_to")) or []


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def problems(
    trackers: list[str], env: Mapping[str, str], is_installed: Callable[[str], bool] = installed
) -> list[tuple[str, str]]:
    """(message, fix) for each tracker that cannot work here: its package is missing, or its settings."""
    out = []
    for name in trackers:
        module, variables, what = NEEDS[name]
        if not is_installed(module):
            out.append((f"report_to {name!r}: the {module} package is not installed where the trainer runs",
                        f"pip install {module} (the trainer image too), or leave {name!r} out"))  # fmt: skip
        elif variables and not any(env.get(v) for v in variables):
            out.append((f"report_to {name!r}: {' or '.join(variables)} is not set",
                        f"set {what} ({CLUSTER_HINT}), or leave {name!r} out"))  # fmt: skip
    return out
