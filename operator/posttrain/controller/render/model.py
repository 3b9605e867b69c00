"""Pure: the weights a job starts from, as its pods load them, and the bucket its artifacts go to.

spec.model.base is a model id the operator's base_model_uri template turns into a path (plain
replacement: a model id is data, never a format string); spec.model.source is an earlier job's
fine-tuned id (its final/ folder in the job's bucket), an s3:// URI or a path in the image
(posttrain.api.model_ids.source_weights).

A job reads weights only from its own namespace's folder (jobs/<namespace>/), the shared models/ folder, a
path in the image, or a namespace that shares its models with it (settings.shared_models):
check_model_access refuses the rest before anything is made (docs/storage.md)."""

from __future__ import annotations

from typing import NamedTuple

from posttrain.api import model_ids
from posttrain.api.resources import JobSpecCommon
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.spec_errors import SpecError


class ModelLocation(NamedTuple):
    base: str  # the base model id: the served name, and the base of the fine-tuned id this job makes
    path: str  # what the trainer and vLLM load


def bucket(spec: JobSpecCommon, settings: OperatorSettings) -> str:
    return (spec.storage.bucket if spec.storage else None) or settings.s3_bucket


def base_model_path(base: str, settings: OperatorSettings) -> str:
    return settings.base_model_uri.replace("{base}", base)


def check_model_access(spec: JobSpecCommon, namespace: str, settings: OperatorSettings) -> None:
    """SpecError when model.source (or an s3:// model.base) names weights outside what a job of
    `namespace` may read."""
    for field, value in (("model.source", spec.model.source), ("model.base", spec.model.base)):
        if not value:
            continue
        try:
            model_ids.check_weights_access(
                str(value), field, namespace, bucket(spec, settings), settings.shared_models
            )
        except model_ids.ModelIdError as err:
            raise SpecError(field, str(err), err.fix) from err


def model_location(spec: JobSpecCommon, settings: OperatorSettings) -> ModelLocation:
    if spec.model.base:
        return ModelLocation(spec.model.base, base_model_path(spec.model.base, settings))
    if not spec.model.source:
        raise SpecError("model", "neither model.base nor model.source is set", "set exactly one of them")
    try:
        return ModelLocation(*model_ids.source_weights(spec.model.source, bucket(spec, settings)))
    except model_ids.ModelIdError as err:
        raise SpecError("model.source", str(err), err.fix) from err
