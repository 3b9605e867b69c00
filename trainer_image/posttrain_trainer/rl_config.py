"""The GSPO trainer's settings: posttrain.api.settings.GSPOSettings, resolved once when the job file was built
(operator or local runner) and read from it here. Defaults, aliases, bounds and rules live there."""

from __future__ import annotations

from typing import Any

from posttrain.api.jobfile import JobFile
from posttrain.api.settings import DEFAULT_OVERLONG_PENALTY, OVERLONG_TREATMENTS  # noqa: F401 - re-exported
from posttrain.api.settings import GSPOSettings as RLTrainerConfig


class RLConfigError(ValueError):
    pass


def rl_settings(job: JobFile) -> RLTrainerConfig:
    """The job file's GSPO settings (an RL job file of another algorithm is a configuration error)."""
    if not isinstance(job.settings, RLTrainerConfig):
        raise RLConfigError(f"the job file's settings are {type(job.settings).__name__}, not GSPO's")
    return job.settings


def parse_rl_config(config: dict[str, Any]) -> RLTrainerConfig:
    """A normalised config's GSPO settings (tests and tools; a job file carries them resolved)."""
    return RLTrainerConfig.resolve(config)
