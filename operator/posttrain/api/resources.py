"""The custom resources RLJob, SFTJob and TaskApp (group posttrain.dev, version v1alpha1): spec and status.

Spec sections that come from the synth TOML reuse the TOML section classes (camelCase here, unknown keys
under each section's `extras`; unknown top-level keys under `spec.extras`). CR-only objects are CRModel
(unknown keys rejected). crds/ is generated from these classes by posttrain.api.crdgen."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from posttrain.api.base import CR_CONTEXT, CRModel, Section
from posttrain.api.fields import TrainerMode
from posttrain.api.sections import (
    AlgorithmConfig,
    ComputeConfig,
    EvaluationConfig,
    HyperparametersConfig,
    JudgeConfig,
    ModelSection,
    PolicySection,
    ReferenceConfig,
    RLTrainingConfig,
    RolloutConfig,
    RubricConfig,
    SFTDataSection,
    SFTJobSection,
    SFTTrainingConfig,
    VllmConfig,
)
from posttrain.api.urls import check_url

GROUP = "posttrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_API_KEY_SECRET_KEY = "ENVIRONMENT_API_KEY"
# A Secret the operator may read a task app's key from (and send to that task app) carries this label: its
# owner's say-so. Any other Secret named by a TaskApp or an RLJob is refused (reason SecretNotLabelled).
LABEL_USE = "posttrain.dev/use"
USE_TASK_APP_KEY = "task-app-key"
PHASES = ("Pending", "Verifying", "Queued", "Provisioning", "Running", "Succeeded", "Failed", "Suspended")

# ------------------------------------------------------------------------------------ spec pieces


class SecretKeySelector(CRModel):
    """A key of a Secret in the object's namespace."""

    name: str = Field(max_length=253, description="Secret name.")
    key: str = Field(DEFAULT_API_KEY_SECRET_KEY, max_length=253, description="Key in the Secret.")


class SecretRef(CRModel):
    name: str = Field(max_length=253, description="Secret name.")


class TaskAppRef(CRModel):
    """The task app rollouts go to: a TaskApp in the same namespace (`name`) or a URL."""

    name: str | None = Field(None, max_length=253, description="A TaskApp in the job's namespace.")
    url: str | None = Field(None, max_length=2048, description="The task app's base URL.")
    api_key_secret_ref: SecretKeySelector | None = Field(
        None,
        description="Secret holding the task app's ENVIRONMENT_API_KEY (sent as X-API-Key); the operator "
        "reads it only when the Secret is labelled posttrain.dev/use=task-app-key.",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)


class Images(CRModel):
    """Container images per role (the operator's defaults otherwise)."""

    trainer: str | None = Field(None, max_length=512, description="Trainer image.")
    rollout: str | None = Field(None, max_length=512, description="Rollout (vLLM) image.")
    reference: str | None = Field(None, max_length=512, description="Reference model image.")
    judge: str | None = Field(None, max_length=512, description="Self-hosted judge image.")


class Toleration(CRModel):
    key: str | None = Field(None, max_length=317)
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = Field(None, max_length=317)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


Quantity = int | str  # rendered as x-kubernetes-int-or-string with QUANTITY_PATTERN for its strings
# Kubernetes' resource.Quantity syntax: the CRD refuses "lots" at apply time instead of the API server
# failing to decode the Deployment the operator renders from it.
QUANTITY_PATTERN = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"


class ResourceRequirements(CRModel):
    requests: dict[str, Quantity] | None = Field(None, max_length=16, description="Resource requests.")
    limits: dict[str, Quantity] | None = Field(None, max_length=16, description="Resource limits.")


class RoleResources(CRModel):
    """Pod resources: `requests`/`limits` for every role, or per role name (trainer, rollout, ...)."""

    requests: dict[str, Quantity] | None = Field(None, max_length=16, description="For every role.")
    limits: dict[str, Quantity] | None = Field(None, max_length=16, description="For every role.")
    trainer: ResourceRequirements | None = Field(None, description="Trainer pods.")
    rollout: ResourceRequirements | None = Field(None, description="Rollout (vLLM) pods.")
    reference: ResourceRequirements | None = Field(None, description="Reference pods.")
    judge: ResourceRequirements | None = Field(None, description="Judge pods.")


class Scheduling(CRModel):
    """Where the job's pods run."""

    node_selector: dict[str, str] | None = Field(None, max_length=32, description="Node selector.")
    tolerations: list[Toleration] | None = Field(None, max_length=32, description="Tolerations.")
    priority_class_name: str | None = Field(None, max_length=253, description="PriorityClass.")
    queue_name: str | None = Field(None, max_length=253, description="Kueue LocalQueue.")
    resources: RoleResources | None = Field(None, description="CPU/memory (GPUs come from compute).")


class JobScheduling(Scheduling):
    """Where the job's pods run, and its place in a Kueue queue."""

    workload_priority_class_name: str | None = Field(
        None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="Kueue WorkloadPriorityClass of the job's Workload (with queueName): a higher one may "
        "preempt a lower one; a preempted job checkpoints and resumes when admitted again.",
    )


class Storage(CRModel):
    """Object storage for datasets, checkpoints and the final model (operator defaults otherwise)."""

    bucket: str | None = Field(None, max_length=63, description="S3 bucket.")
    secret_ref: SecretRef | None = Field(
        None, description="Secret with S3_ACCESS_KEY_ID / S3_SECRET_ACCESS_KEY (and optional S3_ENDPOINT)."
    )


class ConfigMapKeyRef(CRModel):
    name: str = Field(max_length=253, description="ConfigMap name.")
    key: str = Field("train.jsonl", max_length=253, description="Key holding the JSONL.")


class DatasetRef(CRModel):
    """A JSONL dataset: an S3 URI (what `posttrain train` uploads) or a ConfigMap key (small datasets)."""

    uri: str | None = Field(
        None, max_length=2048, description="s3://bucket/key.jsonl (or a path in the image)."
    )
    config_map_ref: ConfigMapKeyRef | None = Field(None, description="A ConfigMap key holding the JSONL.")


# ------------------------------------------------------------------------------------ job specs


class JobSpecCommon(Section):
    suspend: bool = Field(False, description="Pause the job (scales its pods away); the only mutable field.")
    model: ModelSection = Field(description="Starting weights: exactly one of base / source.")
    algorithm: AlgorithmConfig = Field(description="Training algorithm.")
    policy: PolicySection | None = Field(None, description="Policy sampling defaults ([policy]).")
    tags: dict[str, str] | None = Field(None, max_length=64, description="Metadata ([tags]).")
    original_toml: str | None = Field(
        None, max_length=262144, description="The TOML this object was converted from (reproducibility)."
    )
    images: Images | None = Field(None, description="Container images per role.")
    scheduling: JobScheduling | None = Field(None, description="Node selection, tolerations, priority, queue.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Fail the job after this long.")
    storage: Storage | None = Field(None, description="Object storage (operator defaults otherwise).")


class RLJobSpec(JobSpecCommon):
    """An RL (GSPO) job: the synth RL TOML in camelCase plus where and how to run it."""

    task_app: TaskAppRef = Field(description="The task app rollouts go to.")
    compute: ComputeConfig = Field(description="GPUs and their split between roles.")
    rollout: RolloutConfig = Field(description="Episode collection.")
    training: RLTrainingConfig | None = Field(None, description="GSPO training.")
    evaluation: EvaluationConfig | None = Field(None, description="Periodic evaluation.")
    judge: JudgeConfig | None = Field(None, description="LLM judges blended into the reward.")
    rubric: RubricConfig | None = Field(None, description="Deprecated reward blending ([rubric]).")
    vllm: VllmConfig | None = Field(None, description="Rollout inference server.")
    reference: ReferenceConfig | None = Field(None, description="KL reference model.")


class SFTJobSpec(JobSpecCommon):
    """An SFT job: the synth SFT TOML in camelCase plus its dataset."""

    job: SFTJobSection | None = Field(None, description="[job] without model (see spec.model).")
    compute: ComputeConfig | None = Field(None, description="GPUs.")
    data: SFTDataSection | None = Field(None, description="[data].")
    training: SFTTrainingConfig | None = Field(None, description="Training mode, QLoRA, validation, LoRA.")
    hyperparameters: HyperparametersConfig | None = Field(None, description="[hyperparameters].")
    dataset: DatasetRef | None = Field(None, description="Training JSONL.")
    validation_dataset: DatasetRef | None = Field(None, description="Validation JSONL.")


class Verification(CRModel):
    """How the operator checks a task app. Bounded: a check is cheap, but a few dozen task apps each asking
    for one every second would still keep a core busy, and a task app may not hold a check open for long."""

    timeout_seconds: int = Field(300, ge=1, le=3600, description="Give up verifying after this long.")
    period_seconds: int = Field(60, ge=5, le=86400, description="Re-verify this often.")
    request_timeout_seconds: int = Field(
        10, ge=1, le=60, description="Deadline of one check (GET /health and /task_info together)."
    )


class SecretKeyOptional(CRModel):
    name: str = Field(max_length=253)
    key: str = Field(max_length=253)
    optional: bool | None = None


class EnvVarSource(CRModel):
    secret_key_ref: SecretKeyOptional | None = None
    config_map_key_ref: SecretKeyOptional | None = None


class EnvVar(CRModel):
    name: str = Field(max_length=253)
    value: str | None = Field(None, max_length=32768)
    value_from: EnvVarSource | None = None


class TaskAppSpec(CRModel):
    """A task app: deployed from an image, or an external URL; verified with its API key."""

    url: str | None = Field(None, max_length=2048, description="External task app base URL.")
    image: str | None = Field(None, max_length=512, description="Image to deploy (Deployment + Service).")
    env: list[EnvVar] | None = Field(None, max_length=64, description="Environment of the deployed app.")
    port: int = Field(8000, ge=1, le=65535, description="Container port.")
    replicas: int = Field(1, ge=0, le=64, description="Replicas of the deployed app (the operator's "
                          "POSTTRAIN_TASK_APP_MAX_REPLICAS bounds it further).")
    api_key_secret_ref: SecretKeySelector | None = Field(
        None,
        description="Secret with ENVIRONMENT_API_KEY, labelled posttrain.dev/use=task-app-key (the operator "
        "reads no other).",
    )
    verification: Verification | None = Field(None, description="Verification timing.")
    scheduling: Scheduling | None = Field(None, description="Where the deployed app runs.")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value)


# ------------------------------------------------------------------------------------ status


class Condition(CRModel):
    type: str = Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str | None = Field(None, max_length=1024)
    message: str | None = Field(None, max_length=32768)
    last_transition_time: str | None = Field(None, description="RFC 3339 time.")
    observed_generation: int | None = None


class Artifacts(CRModel):
    model: str | None = Field(None, description="S3 URI of the final model (or adapter).")
    manifest: str | None = Field(None, description="S3 URI of manifest.json.")
    checkpoints: str | None = Field(None, description="S3 URI of the checkpoints folder.")
    logs: str | None = Field(None, description="S3 URI of metrics/logs.")
    config: str | None = Field(None, description="S3 URI of the job config.")
    reward_curve: str | None = Field(None, description="S3 URI of reward_curve.png.")
    metrics: str | None = Field(None, description="S3 URI of metrics.jsonl.")
    traces: str | None = Field(
        None,
        description="S3 URI of traces.sqlite (RL): every rollout's trajectory, rewards and policy version; "
        "`posttrain filter` builds SFT data from it.",
    )


def progress_display(step: int | None, total: int | None) -> str | None:
    """`12/50` (or `12` without a total): the Progress column of `kubectl get`, which a JSONPath cannot build
    from two fields. The trainer writes it with every step (posttrain_trainer.report)."""
    if step is None:
        return None
    return f"{step}/{total}" if total else str(step)


class Progress(CRModel):
    step: int | None = Field(None, description="Training step.")
    total: int | None = Field(None, description="Total steps.")
    display: str | None = Field(
        None, max_length=48, description='step/total as `kubectl get` shows it ("12/50"); written with the step.'
    )
    epoch: float | None = Field(None, description="Epoch.")
    loss: float | None = Field(None, description="Training loss.")
    eval_loss: float | None = Field(None, description="Held-out loss.")
    mean_return: float | None = Field(None, description="Mean episode return (RL).")
    judge_scores: dict[str, float] | None = Field(None, description="Mean judge scores by name.")
    judge_failed: int | None = Field(
        None, description="Rollouts of the last iteration the judge could not score (left out of training)."
    )
    truncated: int | None = Field(
        None, description="Rollouts of the last iteration whose response stopped at max_tokens."
    )
    tokens_per_second: float | None = Field(None, description="Training throughput.")
    sampler_mismatch: float | None = Field(
        None,
        description="RL: mean |trainer - sampler| logprob of the last iteration's policy tokens (the "
        "trainer/inference mismatch).",
    )
    sampler_kl: float | None = Field(
        None, description="RL: k3 estimate of KL(sampler || trainer) per policy token, last iteration."
    )
    sampler_max_abs_delta: float | None = Field(
        None, description="RL: largest |trainer - sampler| logprob of a policy token, last iteration."
    )
    eval_score: float | None = Field(None, description="Last evaluation score.")
    last_checkpoint: str | None = Field(None, description="S3 URI of the last checkpoint.")
    metrics: str | None = Field(
        None, max_length=2048, description="S3 URI of metrics.jsonl, uploaded every few steps while the job runs."
    )
    updated_at: str | None = Field(None, description="RFC 3339 time of the last report.")


class Result(CRModel):
    fine_tuned_model: str | None = Field(None, description="The model id this job produced.")
    artifacts: Artifacts | None = None


class JobStatus(CRModel):
    phase: Literal[PHASES] | None = Field(None, description="Lifecycle phase.")  # type: ignore[valid-type]
    conditions: list[Condition] | None = Field(None, description="Conditions.")
    observed_generation: int | None = Field(None, description="The generation this status reflects.")
    model: str | None = Field(None, description="The model being trained (base or source id).")
    trainer_mode: TrainerMode | None = Field(
        None, description="full, lora or qlora: what the trainer trains (posttrain.api.settings.trainer_mode)."
    )
    linked_job_id: str | None = Field(None, description="The trainer Job.")
    fine_tuned_model: str | None = Field(
        None, description="Output model id (rl:/ft:<base>:<ns>.<name>.<uid8>)."
    )
    artifacts: Artifacts | None = Field(None, description="S3 URIs.")
    progress: Progress | None = Field(None, description="Written by the trainer.")
    result: Result | None = Field(None, description="Written by the trainer at the end.")
    start_time: str | None = Field(None, description="RFC 3339.")
    completion_time: str | None = Field(None, description="RFC 3339.")
    message: str | None = Field(None, description="What is happening, for people.")
    reason: str | None = Field(None, description="Machine-readable reason of the phase.")


class TaskInfo(CRModel):
    id: str | None = None
    name: str | None = None
    rubric: bool | None = Field(None, description="Whether the task app publishes a rubric.")


class TaskAppStatus(CRModel):
    verified: bool | None = Field(None, description="Health and task_info answered with the key.")
    url: str | None = Field(None, max_length=2048, description="The URL jobs use.")
    task_info: TaskInfo | None = None
    conditions: list[Condition] | None = None
    observed_generation: int | None = Field(None, description="The generation this status reflects.")
    message: str | None = Field(None, description="The last check's outcome, for people.")
    reason: str | None = Field(None, description="Machine-readable reason of the last check.")


# ------------------------------------------------------------------------------------ objects


class ObjectMeta(CRModel):
    model_config = CRModel.model_config | {"extra": "allow"}

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class RLJob(CRModel):
    api_version: Literal["posttrain.dev/v1alpha1"] = API_VERSION
    kind: Literal["RLJob"] = "RLJob"
    metadata: ObjectMeta
    spec: RLJobSpec
    status: JobStatus | None = None


class SFTJob(CRModel):
    api_version: Literal["posttrain.dev/v1alpha1"] = API_VERSION
    kind: Literal["SFTJob"] = "SFTJob"
    metadata: ObjectMeta
    spec: SFTJobSpec
    status: JobStatus | None = None


class TaskApp(CRModel):
    api_version: Literal["posttrain.dev/v1alpha1"] = API_VERSION
    kind: Literal["TaskApp"] = "TaskApp"
    metadata: ObjectMeta
    spec: TaskAppSpec
    status: TaskAppStatus | None = None


KINDS: dict[str, dict[str, Any]] = {
    "RLJob": {
        "plural": "rljobs",
        "singular": "rljob",
        "short": ["rlj"],
        "spec": RLJobSpec,
        "status": JobStatus,
    },
    "SFTJob": {
        "plural": "sftjobs",
        "singular": "sftjob",
        "short": ["sftj"],
        "spec": SFTJobSpec,
        "status": JobStatus,
    },
    "TaskApp": {
        "plural": "taskapps",
        "singular": "taskapp",
        "short": ["ta"],
        "spec": TaskAppSpec,
        "status": TaskAppStatus,
    },  # fmt: skip
}

# The job file's kind (what the trainer runs) -> the custom resource's kind.
JOB_KINDS = {"rl": "RLJob", "sft": "SFTJob"}


def plural(kind: str) -> str:
    """rljobs, sftjobs or taskapps for RLJob, SFTJob or TaskApp."""
    return str(KINDS[kind]["plural"])


def parse_spec(kind: str, data: dict[str, Any]) -> RLJobSpec | SFTJobSpec | TaskAppSpec:
    """The spec of a `kind` object as the API server stores it (camelCase, each section's unknown keys under
    `extras`) -> its model. pydantic.ValidationError names the fields it refuses."""
    return KINDS[kind]["spec"].model_validate(data, context=CR_CONTEXT)
