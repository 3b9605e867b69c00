"""Keys a config carries beyond the typed schema: the ones posttrain reads (with their bounds), and the
unknown ones, which get a warning (with a did-you-mean when a known key is close) and are still handed to
the trainer, as synth forwards them.

`PASSTHROUGH` lists, per section path of the normalised config, the keys that the trainer, the local runner
or the operator read although synth's schema does not type them (GSPO clip and mini-batch knobs, ReST-EM's
E-step and M-step knobs, SFT scheduler and early stopping, ...). Their values are checked against the bounds
given here. `FREE` sections are forwarded to the task app or kept as metadata: any key goes there."""

from __future__ import annotations

import difflib
from typing import Annotated, Any

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from posttrain.api.base import Section

Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1, le=1_000_000)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
Steps = Annotated[int, Field(ge=0, le=100_000_000)]
Text = Annotated[str, Field(max_length=256)]

_RL_TRAINING: dict[str, Any] = {
    # GSPO (rl.py)
    "num_minibatches": Count, "minibatches": Count, "eps_low": Fraction, "eps_high": Fraction,
    "clip_eps_low": Fraction, "clip_eps_high": Fraction, "beta": NonNegative, "kl_beta": NonNegative,
    "kl_coef": NonNegative, "micro_batch": Count, "per_device_batch": Count, "max_grad_norm": Positive,
    "warmup_ratio": Fraction, "lr_scheduler": Text, "skip_zero_advantage": bool, "seed": Seed,
    "seed_start": Seed, "checkpoint_every": Steps, "mode": Text, "parallelism": dict,
    "rollout_error_budget": Fraction,
    # step rewards (synth's crafter_rl_stepwise_shaped.toml; step_rewards.py): per-achievement weights, caps
    "step_rewards_weights": dict[Text, Annotated[float, Field(allow_inf_nan=False)]],
    "step_rewards_k_limits": dict[Text, Annotated[int, Field(ge=-1, le=1_000_000)]],
    # ReST-EM (restem_job.py)
    "reward_threshold": Annotated[float, Field(allow_inf_nan=False)], "sft_epochs": Count,
    "sft_batch_size": Count, "max_per_prompt": Count,
}  # fmt: skip
_SFT_HYPERPARAMETERS: dict[str, Any] = {
    "lr_scheduler_type": Text, "lr_scheduler": Text, "seed": Seed, "max_grad_norm": Positive,
    "early_stopping_patience": Count, "early_stopping_threshold": NonNegative,
    "max_images_per_message": Count, "lora_rank": Count, "lora_r": Count,
}  # fmt: skip
PASSTHROUGH: dict[str, dict[str, Any]] = {
    "": {"data": dict, "job_type": Text},
    "training": _RL_TRAINING,
    "rollout": {"error_budget": Fraction, "timeout_s": Positive, "async_semaphore_max": Count},
    "evaluation": {"temperature": Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]},
    "data": {
        "seeds": list[Seed],  # accepted, no effect (posttrain.api.inert)
        "seed_start": Seed,
        "split": Text,
        "episodes_per_iteration": Count,
        "evaluation_split": Text,
        "evaluation_episodes": Count,
    },  # fmt: skip
    "policy": {"served_model_name": Text, "system_prompt": str},
    "judge": {"provider": Text, "model": Text},
    "judge.options": {"base_url": Text, "api_key_env": Text},
    "hyperparameters": _SFT_HYPERPARAMETERS,
    "hyperparameters.parallelism": {},
    "training.weight_sync": {"weight_sync_interval": Count, "format": Text},
    "training.rewards": {
        "step_rewards_weights": _RL_TRAINING["step_rewards_weights"],
        "step_rewards_k_limits": _RL_TRAINING["step_rewards_k_limits"],
    },
    "training.validation": {"early_stopping_patience": Count, "early_stopping_threshold": NonNegative},
}
# Forwarded to the task app (env.config / policy.config) or free-form: no key is unknown there.
FREE = ("rollout.env_config", "rollout.policy_config", "tags", "data.topology")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _known(model: BaseModel, path: str) -> set[str]:
    return set(type(model).model_fields) | set(PASSTHROUGH.get(path, {}))


def _suggest(key: str, known: set[str]) -> str | None:
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return close[0] if close else None


def _children(model: BaseModel, path: str) -> list[tuple[str, BaseModel]]:
    out: list[tuple[str, BaseModel]] = []
    for name in type(model).model_fields:
        value = getattr(model, name, None)
        if isinstance(value, Section):
            out.append((_join(path, name), value))
    return out


def unknown_keys(config: BaseModel, path: str = "") -> list[tuple[str, str | None, bool]]:
    """(dotted path, did-you-mean or None, is a table) for every key no part of posttrain reads, walking the
    validated config (pydantic keeps unknown keys in each section's model_extra)."""
    if path in FREE:
        return []
    found: list[tuple[str, str | None, bool]] = []
    known = _known(config, path)
    for key, value in ((config.model_extra or {}) if isinstance(config, Section) else {}).items():
        if key not in known:
            found.append((_join(path, key), _suggest(key, known), isinstance(value, dict)))
    for child_path, child in _children(config, path):
        found += unknown_keys(child, child_path)
    return found


def passthrough_problems(config: BaseModel, path: str = "") -> list[tuple[str, str, str | None]]:
    """(dotted path, message, fix) for every known pass-through key whose value is out of its bounds."""
    if path in FREE:
        return []
    found: list[tuple[str, str, str | None]] = []
    rules = PASSTHROUGH.get(path, {})
    for key, value in ((config.model_extra or {}) if isinstance(config, Section) else {}).items():
        if key not in rules:
            continue
        try:
            TypeAdapter(rules[key]).validate_python(value, strict=True)  # `true` / "0.2" are not numbers
        except ValidationError as err:
            from posttrain.api.config import fix_for

            item = err.errors()[0]
            found.append((_join(path, key), item["msg"], fix_for(item)))
    for child_path, child in _children(config, path):
        found += passthrough_problems(child, child_path)
    return found


# Top-level tables the lenient aliases accept (posttrain.api.config) beside each config's own sections.
SECTION_ALIASES = ("verifier", "topology", "lora", "policy")


def misspelled_sections(raw: dict[str, Any], known: set[str]) -> dict[str, str]:
    """{unknown top-level table: the known section it is close to}: `[trainig]` -> `training`. A config whose
    required section is misspelled fails with that section's missing keys; this names the cause beside them.
    Section names are short, so the cut-off is lower than for keys (`[jbo]` -> `job`)."""
    known = set(known) | set(SECTION_ALIASES) | set(PASSTHROUGH[""])
    out = {}
    for key, value in raw.items():
        if isinstance(value, dict) and key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            if close:
                out[key] = close[0]
    return out


def unknown_key_warning(path: str, suggestion: str | None, is_table: bool = False) -> str:
    """`path: unknown key 'x' in [section] (did you mean 'y'?); kept ...` (the caller adds file:line)."""
    section, _, key = path.rpartition(".")
    what = (
        f"section [{path}]"
        if is_table
        else f"key {key!r} in " + (f"[{section}]" if section else "the top level")
    )
    hint = f" (did you mean {suggestion!r}?)" if suggestion else ""
    return f"{path}: unknown {what}{hint}; kept and passed to the trainer as it is"


INT64 = (-(2**63), 2**63 - 1)


def number_problems(raw: Any, path: str = "") -> list[tuple[str, str, str]]:
    """(dotted path, message, fix) for every float that is not finite and every integer outside int64,
    anywhere in a parsed TOML (unknown keys included: they travel in the custom resource's JSON)."""
    import math

    found: list[tuple[str, str, str]] = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            found += number_problems(value, _join(path, str(key)))
    elif isinstance(raw, list):
        for index, value in enumerate(raw):
            found += number_problems(value, f"{path}[{index}]")
    elif isinstance(raw, float) and not math.isfinite(raw):
        found.append((path, f"{raw} is not a finite number", "use a finite number"))
    elif isinstance(raw, int) and not isinstance(raw, bool) and not INT64[0] <= raw <= INT64[1]:
        found.append(
            (path, f"{raw} does not fit a 64-bit integer", f"use a value between {INT64[0]} and {INT64[1]}")
        )
    return found
