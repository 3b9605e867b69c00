"""The SFT trainer's settings: posttrain.api.settings.SFTSettings (and its ValidationSettings), resolved once
when the job file was built and read from it here. Defaults, aliases, bounds and rules live there."""

from __future__ import annotations

from typing import Any

from posttrain.api.jobfile import JobFile
from posttrain.api.settings import SFT_LOSS_METRICS as LOSS_METRICS
from posttrain.api.settings import SFTSettings as SFTTrainerConfig
from posttrain.api.settings import ValidationSettings  # noqa: F401 - re-exported


def sft_settings(job: JobFile) -> SFTTrainerConfig:
    if not isinstance(job.settings, SFTTrainerConfig):
        raise ValueError(f"the job file's settings are {type(job.settings).__name__}, not SFT's")
    return job.settings


def parse_sft_config(config: dict[str, Any]) -> SFTTrainerConfig:
    """A normalised config's SFT settings (tests and tools; a job file carries them resolved)."""
    return SFTTrainerConfig.resolve(config)


def metric_value(metrics: dict[str, float], name: str) -> float:
    name = name.lower()
    if name in LOSS_METRICS:
        return metrics["loss"]
    if "perplexity" in name:
        return metrics["perplexity"]
    return metrics["token_accuracy"]
