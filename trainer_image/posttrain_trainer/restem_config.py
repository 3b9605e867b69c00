"""The ReST-EM trainer's settings: posttrain.api.settings.RestemSettings, resolved once when the job file was
built (an RL job file whose [algorithm] variety is "restem") and read from it here."""

from __future__ import annotations

from typing import Any

from posttrain.api.jobfile import JobFile
from posttrain.api.settings import RestemSettings as RestemTrainerConfig


class RestemConfigError(ValueError):
    pass


def restem_settings(job: JobFile) -> RestemTrainerConfig:
    if not isinstance(job.settings, RestemTrainerConfig):
        raise RestemConfigError(f"the job file's settings are {type(job.settings).__name__}, not ReST-EM's")
    return job.settings


def parse_restem_config(config: dict[str, Any]) -> RestemTrainerConfig:
    """A normalised config's ReST-EM settings (tests and tools; a job file carries them resolved)."""
    return RestemTrainerConfig.resolve(config)
