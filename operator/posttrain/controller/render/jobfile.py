"""Pure: the trainer's job file (posttrain.api.jobfile.JobFile) and the job's Secret <job>-config that carries
it (job.json) beside the TOML the job was converted from (config.toml). Neither holds a secret value: the
trainer finds its keys in the environment (S3_*, ENVIRONMENT_API_KEY, <PROVIDER>_API_KEY), filled from
Secrets. They travel in a Secret rather than a ConfigMap because an RLJob's Secret holds its rollout token
too (render/token.py, added by the controller): one object per job instead of two. The Secret is owned by
the job, so a failed job keeps its configuration until the job is deleted."""

from __future__ import annotations

import base64
import json
from typing import Any

from posttrain.api.convert import spec_to_config
from posttrain.api.jobfile import JobFile, build_jobfile
from posttrain.api.model_ids import job_artifact_prefix
from posttrain.api.resources import GROUP, VERSION, DatasetRef
from posttrain.controller.objects import Job
from posttrain.controller.render.model import bucket, model_location
from posttrain.controller.render.names import ROLE_CONFIG, config_name
from posttrain.controller.render.pods import child_meta
from posttrain.controller.render.servers import JUDGE_KEY_ENV
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.render.trainer import DATA_MOUNT, JOBFILE_KEY, TASK_APP_KEY_ENV, TOML_KEY, WORKDIR
from posttrain.controller.settings import OperatorSettings


def dataset_path(ref: DatasetRef | None) -> tuple[str | None, dict[str, Any] | None]:
    """(path or URI the trainer reads, ConfigMap volume source) of spec.dataset / spec.validationDataset."""
    if ref is None:
        return None, None
    if ref.uri:
        return ref.uri, None
    if ref.config_map_ref is not None and ref.config_map_ref.name:
        return f"{DATA_MOUNT}/{ref.config_map_ref.key}", {"name": ref.config_map_ref.name}
    return None, None


def render_jobfile(
    job: Job,
    settings: OperatorSettings,
    *,
    task_app: TaskAppTarget | None = None,
    endpoints: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
) -> JobFile:
    owner = job.owner
    config = spec_to_config(job.spec)
    options = (config.get("judge") or {}).get("options")
    if isinstance(options, dict):
        # the judge client reads its key from this variable only (filled from the Secret the job names):
        # never from one the spec picks (api_key_env = "S3_SECRET_ACCESS_KEY" would send the S3 key away)
        options["api_key_env"] = JUDGE_KEY_ENV
    model = model_location(job.spec, settings)
    endpoint = settings.s3_endpoint
    return build_jobfile(
        job.trainer_kind,
        config,
        job={"name": owner.name, "namespace": owner.namespace, "uid": owner.uid, "group": GROUP,
             "version": VERSION, "plural": owner.plural},  # fmt: skip
        base_model=model.base,
        model_path=model.path,
        task_app={"url": task_app.url, "api_key_env": TASK_APP_KEY_ENV} if task_app else None,
        endpoints=endpoints,
        dataset=dataset,
        storage={
            "endpoint": endpoint,
            "secure": endpoint.startswith("https://"),
            "bucket": bucket(job.spec, settings),
            "prefix": job_artifact_prefix(owner.namespace, owner.name, owner.uid),
            "region": settings.s3_region,
        },
        # a replacement pod resumes from the last checkpoint: RL iterations / SFT optimizer steps
        checkpoint_default=settings.checkpoint_every_rl if job.trainer_kind == "rl" else settings.checkpoint_every_sft,
        report={"mode": "kubernetes", "path": None},
        workdir=WORKDIR,
        weight_sync={"via": "s3", "shared_dir": None},
    )


def render_config_secret(job: Job, jobfile: JobFile) -> dict[str, Any]:
    """The job's Secret without the rollout token (the controller adds it to an RLJob's)."""
    text = json.dumps(jobfile.model_dump(mode="json"), indent=2, sort_keys=True)
    files = {JOBFILE_KEY: text, TOML_KEY: job.spec.original_toml or ""}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": child_meta(job.owner, config_name(job.owner.name), ROLE_CONFIG),
        "data": {key: base64.b64encode(value.encode()).decode() for key, value in files.items()},
    }
