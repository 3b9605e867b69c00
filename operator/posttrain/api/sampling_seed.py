"""The job's seed as the policy rollout server's `--seed` (pure): [training] seed (GSPOSettings.seed, read
where the settings read it, with its default) seeds the trainer's RNGs and mini-batch shuffle, and through
the rollout server every sampling request of the job's rollouts and evaluations
(posttrain_rollout.seeding). Same seed, same CPU, same config: the same run, up to floating-point noise
between batches of different shape.

The default is fixed (the settings' 0), not drawn at random: a run is reproducible without the user doing
anything, and the seed it used is printed at the start (posttrain train --local, make demo)."""

from __future__ import annotations

from typing import Any

from posttrain.api.settings import GSPOSettings, keys_of, lookup


def job_seed(config: dict[str, Any]) -> int:
    """[training] seed (or [algorithm] seed) of a normalised config, else the settings' default."""
    field = GSPOSettings.model_fields["seed"]
    for path in keys_of(field):
        value = lookup(config, path)
        if value is not None:
            return int(value)
    return int(field.default)


def seed_args(config: dict[str, Any]) -> list[str]:
    return ["--seed", str(job_seed(config))]
