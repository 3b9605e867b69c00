"""The trainer's job file: one JSON document per job, built by `build_jobfile` for the operator
(posttrain.controller.render.jobfile, into the job's Secret) and the local runner (posttrain.local.runner),
read by the trainer (posttrain_trainer). Both images ship this package, so both sides validate the same
model. `settings` holds the trainer's settings, typed and resolved once (posttrain.api.settings): the
trainer reads every value from there, including what it forwards to the task app as it is
(settings.rollout.env_config / policy_config). `record` keeps the normalised synth config for the record only
(the job's config.json and manifest.json artifacts); nothing reads a value from it
(tests/unit/test_no_raw_config.py).

Pure pydantic, no torch import, so the operator and the CLI can build and validate job files cheaply.
Secrets never appear here: S3 keys come from S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY, the task app key from
the env var named by task_app.api_key_env."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator

from posttrain.api.resources import GROUP, JOB_KINDS, VERSION, plural
from posttrain.api.settings import AnySettings, settings_for


class _Lenient(BaseModel):
    """Unknown keys are kept (a newer operator may write fields an older trainer does not know)."""

    model_config = ConfigDict(extra="allow")


class JobRef(_Lenient):
    """Which custom resource this trainer works for (status patches go to its status subresource)."""

    name: str = "local"
    namespace: str = "default"
    uid: str = "00000000-0000-0000-0000-000000000000"
    group: str = GROUP
    version: str = VERSION
    plural: str | None = None  # defaults from kind: rljobs / sftjobs


class TaskAppRef(_Lenient):
    url: str
    api_key_env: str = "ENVIRONMENT_API_KEY"


class Endpoints(_Lenient):
    policy: list[str] = Field(default_factory=list)
    reference: str | None = None
    judges: dict[str, str] = Field(default_factory=dict)


class DatasetRef(_Lenient):
    """Local path or s3:// URI of the training JSONL and the optional validation JSONL."""

    train: str | None = None
    validation: str | None = None


class StorageRef(_Lenient):
    """Where artifacts go. Credentials only from env (S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY)."""

    endpoint: str  # host:port, or a URL (http:// / https:// decides `secure` when given)
    secure: bool = False
    bucket: str
    prefix: str = ""  # posttrain.api.model_ids.job_artifact_prefix: "jobs/<ns>/<name>-<uid8>/"
    region: str | None = None

    @field_validator("prefix")
    @classmethod
    def _slash(cls, value: str) -> str:
        value = value.lstrip("/")
        return value if not value or value.endswith("/") else value + "/"


class ReportRef(_Lenient):
    mode: Literal["kubernetes", "file", "stdout"] = "stdout"
    path: str | None = None  # file mode: JSONL file to append to


class WeightSyncRef(_Lenient):
    via: Literal["path", "s3"] = "path"
    shared_dir: str | None = None


class JobFile(_Lenient):
    model_config = ConfigDict(extra="allow", serialize_by_alias=True)  # `record` is written as "config"

    kind: Literal["rl", "sft"]
    job: JobRef = Field(default_factory=JobRef)
    # the normalised synth config (snake_case, extras kept), for the record only: the artifacts' config.json.
    # Its key in the file stays "config" (job files of every version read alike); in Python it is `record`.
    record: dict[str, Any] = Field(
        default_factory=dict, validation_alias=AliasChoices("config", "record"), serialization_alias="config"
    )
    base_model: str
    model_path: str  # local folder or s3:// URI
    task_app: TaskAppRef | None = None
    endpoints: Endpoints = Field(default_factory=Endpoints)
    dataset: DatasetRef = Field(default_factory=DatasetRef)
    storage: StorageRef | None = None
    checkpoint_every: int = 0  # steps; 0 = no periodic checkpoints
    report: ReportRef = Field(default_factory=ReportRef)
    workdir: str = "/tmp/posttrain"
    weight_sync: WeightSyncRef = Field(default_factory=WeightSyncRef)
    # the trainer's settings; a job file without them (an older operator's) gets them from `record`
    settings: AnySettings | None = None

    @model_validator(mode="after")
    def _settings(self) -> JobFile:
        if self.settings is None:
            self.settings = settings_for(self.kind, self.record)
        return self

    @property
    def plural(self) -> str:
        return self.job.plural or plural(JOB_KINDS[self.kind])


def checkpoint_every(config: dict[str, Any], default: int) -> int:
    """The job's own training.checkpoint_every when it sets one (> 0), else the caller's default."""
    training = config.get("training") if isinstance(config.get("training"), dict) else {}
    try:
        value = int(training.get("checkpoint_every") or 0)
    except (TypeError, ValueError):
        value = 0
    return value if value > 0 else default


def build_jobfile(
    kind: Literal["rl", "sft"],
    config: dict[str, Any],
    *,
    job: dict[str, Any],
    base_model: str,
    model_path: str,
    storage: dict[str, Any],
    checkpoint_default: int,
    report: dict[str, Any],
    workdir: str,
    weight_sync: dict[str, Any],
    task_app: dict[str, Any] | None = None,
    endpoints: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
) -> JobFile:
    """Pure: the job file of a normalised config. The trainer's settings are resolved here (a value out of
    its bounds or against a rule raises pydantic.ValidationError naming it); `checkpoint_default` is the
    caller's periodic checkpoint when the job sets none (the operator's setting; 0 on one machine, where no
    replacement pod resumes)."""
    return JobFile(
        kind=kind,
        job=job,
        record=config,
        base_model=base_model,
        model_path=model_path,
        task_app=task_app,
        endpoints=endpoints or {"policy": [], "reference": None, "judges": {}},
        dataset=dataset or {"train": None, "validation": None},
        storage=storage,
        checkpoint_every=checkpoint_every(config, checkpoint_default),
        report=report,
        workdir=workdir,
        weight_sync=weight_sync,
        settings=settings_for(kind, config),
    )


def load_jobfile(path: str | Path) -> JobFile:
    """Read and validate a job file. Raises pydantic.ValidationError on a malformed file."""
    return JobFile.model_validate(json.loads(Path(path).read_text()))


def dump_jobfile(job: JobFile, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(job.model_dump_json(indent=2, exclude_none=False))
    return path
