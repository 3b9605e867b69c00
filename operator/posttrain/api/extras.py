"""Keys a config carries beyond the typed schema: the ones posttrain reads (with their bounds), and the
unknown ones, which get a warning (with a did-you-mean when a known key is close) and are still handed to
the trainer, as synth forwards them.

`PASSTHROUGH` lists, per section path of the normalised config, the keys that the trainer, the local runner
or the operator read although synth's schema does not type them (GSPO clip and mini-batch knobs, ReST-EM's
E-step and M-step knobs, SFT scheduler and early stopping, ...). Their values are checked against the bounds
given here. `FREE` sections are forwarded to the task app or kept as metadata: any key goes there."""

from __future__ import annotations

import difflib
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from posttrain.api.base import Section
from posttrain.api.settings import (
    RL_ALGORITHMS,
    Count,
    Fraction,
    Keys,
    Seconds,
    Seed,
    SFTSettings,
    Steps,
    Text,
    ValidationSettings,
    keys_of,
)

# The sections whose keys beyond the typed schema are pass-through keys; the trainer's fallbacks elsewhere
# ([algorithm], [policy], hyperparameters.parallelism) are read but stay unknown-key warnings there.
PASSTHROUGH_SECTIONS = ("training", "training.weight_sync", "training.validation", "rollout", "evaluation",
                        "data", "hyperparameters")  # fmt: skip


def _setting_type(info: Any) -> Any:
    """A settings field's type with its bounds, without None (a TOML value is never null)."""
    annotation = info.annotation
    args = [a for a in get_args(annotation) if a is not type(None)] if get_origin(annotation) in (Union, UnionType) else []
    if args:
        annotation = args[0]
    bounds = [m for m in info.metadata if not isinstance(m, Keys)]
    return Annotated[annotation, *bounds] if bounds else annotation


def _typed(path: str) -> set[str]:
    """The keys posttrain.api.config types at a section path of an RL or SFT config."""
    from posttrain.api.config import RLConfig, SFTConfig

    out: set[str] = set()
    for root in (RLConfig, SFTConfig):
        model: Any = root
        for part in path.split("."):
            info = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
            if info is None:
                model = None
                break
            model = next((a for a in (info.annotation, *get_args(info.annotation))
                          if isinstance(a, type) and issubclass(a, BaseModel)), None)  # fmt: skip
        if model is not None:
            out |= set(model.model_fields)
    return out


def settings_passthrough() -> dict[str, dict[str, Any]]:
    """{section path: {key: type with bounds}} of every key a trainer settings model reads
    (posttrain.api.settings) that the typed sections lack."""
    out: dict[str, dict[str, Any]] = {}
    for model in (*RL_ALGORITHMS.values(), SFTSettings, ValidationSettings):
        for info in model.model_fields.values():
            for path in keys_of(info):
                section, _, key = path.rpartition(".")
                if section in PASSTHROUGH_SECTIONS and key not in _typed(section):
                    out.setdefault(section, {}).setdefault(key, _setting_type(info))
    return out


# Keys read by other parts of the trainer, the local runner or the operator (not trainer settings yet).
_OTHER_READERS: dict[str, dict[str, Any]] = {
    "": {"data": dict, "job_type": Text},
    "training": {
        "checkpoint_every": Steps,  # posttrain.api.jobfile.build_jobfile
        "mode": Text,  # settings.trainer_mode (one derivation: artifacts, status, rendering)
        "parallelism": dict,
        "rollout_error_budget": Fraction,  # rollout_settings.RolloutSettings.error_budget
        # step rewards (synth's crafter_rl_stepwise_shaped.toml; step_rewards.py): per-achievement weights, caps
        "step_rewards_weights": dict[Text, Annotated[float, Field(allow_inf_nan=False)]],
        "step_rewards_k_limits": dict[Text, Annotated[int, Field(ge=-1, le=1_000_000)]],
    },
    # rollout_settings.RolloutSettings (error_budget, timeout_s, concurrency): the same types as its fields
    "rollout": {"error_budget": Fraction, "timeout_s": Seconds, "async_semaphore_max": Count},
    "data": {"seeds": list[Seed], "split": Text, "episodes_per_iteration": Count, "evaluation_split": Text,
             "evaluation_episodes": Count},  # fmt: skip  (seeds: accepted, no effect: posttrain.api.inert)
    "policy": {"served_model_name": Text, "system_prompt": str},
    "judge": {"provider": Text, "model": Text},
    "judge.options": {"base_url": Text, "api_key_env": Text},
    "hyperparameters": {"lora_rank": Count, "lora_r": Count},  # read as [training.lora] r (api/config.py)
    "hyperparameters.parallelism": {"deepspeed_config": dict},  # settings.ParallelSettings
    "training.parallelism": {"deepspeed_config": dict},
    "training.rewards": {},  # rollout_settings.StepRewardSettings
    "training.validation": {},
}


def _passthrough() -> dict[str, dict[str, Any]]:
    out = {path: dict(keys) for path, keys in _OTHER_READERS.items()}
    for path, keys in settings_passthrough().items():
        out.setdefault(path, {}).update(keys)
    out["training.rewards"].update({k: out["training"][k] for k in ("step_rewards_weights", "step_rewards_k_limits")})
    return out


PASSTHROUGH: dict[str, dict[str, Any]] = _passthrough()
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
