"""One definition of each setting's type and bounds, shared by the TOML schema (posttrain.api.sections, which
is also the custom resource's spec and the generated reference) and the trainer's settings
(posttrain.api.settings): a section field and the settings field that reads it use the same type below, so
they cannot disagree (tests/unit/test_one_definition.py checks every pair: type, bounds and default).

Upper bounds: far above any real job, low enough that a typo (1e17 epochs, a 1e10-token context) is caught
before GPUs are asked for, and every integer fits the int64 of the custom resource's JSON."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BeforeValidator, Field
from pydantic.fields import FieldInfo

from posttrain.api import trackers

MAX_GPUS = 100_000
MAX_COUNT = 1_000_000
MAX_STEPS = 100_000_000
MAX_EPOCHS = 100_000
MAX_GROUP = 4096
MAX_TOKENS = 16_777_216  # 16M tokens: beyond the longest context windows of today's models
MAX_TEMPERATURE = 100.0
MAX_WEIGHT = 1_000_000.0
MAX_SECONDS = 30 * 24 * 3600.0
MAX_ASYNC_DEPTH = 8  # weight versions a rollout may lag behind the update; far past any useful staleness

# ------------------------------------------------------------------------------------------ choices
Overlong = Literal["keep", "mask", "penalty", "shaped"]
OVERLONG_TREATMENTS: tuple[str, ...] = get_args(Overlong)
OldLogprobs = Literal["trainer", "sampler"]
GspoVariant = Literal["sequence", "token"]
TrainerMode = Literal["full", "lora", "qlora"]
SyncFormat = Literal["full", "lora"]
StepRewardsMode = Literal["off", "decision_stepwise", "env_sparse"]
EventRewardsKind = Literal["unique", "absolute"]

# ------------------------------------------------------------------------------------------ numbers
TIS_CAP_BOUNDS: dict[str, Any] = {"ge": 1, "le": 1000}
OVERLONG_PENALTY_BOUNDS: dict[str, Any] = {"le": 0}
TisCap = Annotated[float, Field(**TIS_CAP_BOUNDS, allow_inf_nan=False)]
OverlongPenalty = Annotated[float, Field(**OVERLONG_PENALTY_BOUNDS, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=1, le=MAX_COUNT)]
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]
Steps = Annotated[int, Field(ge=0, le=MAX_STEPS)]
Text = Annotated[str, Field(max_length=256)]
Reward = Annotated[float, Field(allow_inf_nan=False)]
Epochs = Annotated[int, Field(ge=1, le=MAX_EPOCHS)]
SFTEpochs = Annotated[int, Field(ge=0, le=MAX_EPOCHS)]  # 0 with total_steps: the steps decide
Iterations = Annotated[int, Field(ge=1, le=MAX_STEPS)]  # training iterations, evaluation intervals
GroupSize = Annotated[int, Field(ge=1, le=MAX_GROUP)]
LearningRate = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
Tokens = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
Temperature = Annotated[float, Field(ge=0, le=MAX_TEMPERATURE, allow_inf_nan=False)]
Seconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Keep = Annotated[int, Field(ge=0, le=MAX_COUNT)]  # how many to keep; 0 keeps all
AsyncDepth = Annotated[int, Field(ge=0, le=MAX_ASYNC_DEPTH)]  # 0: sample, then update (serial)
# [training] report_to of RL and SFT configs: a string or a list, normalised by api/trackers.py
ReportTo = Annotated[
    list[Literal["tensorboard", "mlflow", "wandb"]] | None,
    BeforeValidator(trackers.normalize),
    Field(
        description='Experiment trackers for each step\'s metrics: "tensorboard" (event files in the job\'s S3 '
        'folder), "mlflow", "wandb"; a string or a list ("none": only metrics.jsonl and /metrics).',
    ),
]


def metadata_of(info: FieldInfo) -> list[Any]:
    """A field's constraints, with those of a shared type inside its Optional (`Keep | None` keeps Keep's
    bounds in the annotation, not in the field's metadata): what the CRD and the reference generators read."""
    out = list(info.metadata)
    for arg in get_args(info.annotation):
        if get_origin(arg) is Annotated:
            for meta in get_args(arg)[1:]:
                out += list(meta.metadata) if isinstance(meta, FieldInfo) else [meta]
    return out


def strip_annotated(annotation: Any) -> Any:
    """X for Annotated[X, ...] (else the annotation)."""
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation
