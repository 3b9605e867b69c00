"""The job's seed as the policy rollout server's `--seed` (pure): [training] seed (GSPOSettings.seed, read
where the settings read it, with its default) seeds the trainer's RNGs and mini-batch shuffle, and through
the rollout server every sampling request of the job's rollouts and evaluations
(posttrain_rollout.seeding). Same seed, same CPU, same config: the same run, up to floating-point noise
between batches of different shape.

A job's default is fixed (the settings' 0, the trainer's default all along): a job is reproducible without
the user doing anything, and `posttrain train --local` prints its seed at the start. `make demo` draws one
instead when neither --seed nor the config sets it (posttrain.local.demo)."""

from __future__ import annotations

from typing import Any

from posttrain.api.settings import GSPOSettings, keys_of, lookup


def configured_seed(config: dict[str, Any]) -> int | None:
    """[training] seed (or [algorithm] seed) of a normalised config; None when it sets none."""
    for path in keys_of(GSPOSettings.model_fields["seed"]):
        value = lookup(config, path)
        if value is not None:
            return int(value)
    return None


def job_seed(config: dict[str, Any]) -> int:
    """The config's seed, else the settings' default."""
    seed = configured_seed(config)
    return int(GSPOSettings.model_fields["seed"].default) if seed is None else seed


def seed_args(config: dict[str, Any]) -> list[str]:
    return ["--seed", str(job_seed(config))]
