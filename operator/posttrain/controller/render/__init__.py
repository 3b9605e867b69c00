"""Pure functions: a job, parsed into posttrain.api's models (controller.objects), -> the manifests of its
children. No I/O, no clock, no secrets: Secrets are only ever referenced by name (secretKeyRef).

Children of an RLJob (all in the job's namespace, owned by the job, labelled posttrain.dev/job and
posttrain.dev/role), one module each:
  Secret     <job>-config     job.json (the trainer job file) + config.toml + rollout token jobfile.py, token.py
  Deployment+Service <job>-rollout, -reference (dedicated), -judge (self-hosted)           servers.py
  ServiceAccount, Role, RoleBinding <job>-trainer (trainer_identity=job only)              identity.py
  Indexed Job <job>-trainer: torchrun, one pod per node (+ headless Service: > 1 node)     trainer.py
  PodDisruptionBudget <job>-trainer, <job>-rollout                                         disruption.py
An SFTJob has the same without servers and without a token. The Secret is made by the controller (once,
POST), since an RLJob's holds a random token. The namespace's NetworkPolicy (network.py) and trainer
identity (identity.py) belong to no job. Every pod is locked down (security.py); names (names.py),
metadata, scheduling, resources and images (pods.py), the GPU split (posttrain.api.topology) and the
starting weights (model.py) are shared. A TaskApp deployed from an image has its own (taskapp.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.api.jobfile import JobFile
from posttrain.api.topology import Topology, rl_topology, sft_topology
from posttrain.controller.objects import Job
from posttrain.controller.render.disruption import PDB_KIND, render_disruption_budgets
from posttrain.controller.render.identity import IDENTITY_KINDS, render_trainer_identity
from posttrain.controller.render.jobfile import dataset_path, render_config_secret, render_jobfile
from posttrain.controller.render.model import check_model_access, model_location
from posttrain.controller.render.servers import render_servers
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.render.trainer import render_trainer
from posttrain.controller.settings import LABEL_ROLE, OperatorSettings

# Children that do not gate the job's phase (they are kept in place, but a job runs without waiting on
# their watch events).
SUPPORTING_KINDS = IDENTITY_KINDS | {PDB_KIND}


@dataclass
class Rendered:
    """All children of one job, in creation order, plus the facts the controller needs about them."""

    children: list[dict[str, Any]]
    topology: Topology
    jobfile: JobFile
    job: Job  # what the job's Secret is rendered from
    rollout_token: bool = False  # the controller adds a random rollout token to the Secret (RLJob)

    @property
    def secret(self) -> dict[str, Any]:
        """The job's Secret, made by the controller before the children. Rendered when asked for, not kept:
        it holds the job's originalToml (up to 256 KiB, base64) and a plan is kept per running job."""
        return render_config_secret(self.job, self.jobfile)

    def secret_with(self, original_toml: str | None) -> dict[str, Any]:
        """The Secret with the job's originalToml, which the operator does not keep in memory (the loops
        cache a job's body without it, controller/loop.py) and reads from the API server when it makes it."""
        spec = self.job.spec.model_copy(update={"original_toml": original_toml})
        return render_config_secret(Job(owner=self.job.owner, spec=spec, status=self.job.status), self.jobfile)

    def by_role(self, role: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            c
            for c in self.children
            if c["metadata"]["labels"].get(LABEL_ROLE) == role and (kind is None or c["kind"] == kind)
        ]

    def deployments(self) -> list[dict[str, Any]]:
        return [c for c in self.children if c["kind"] == "Deployment"]


def render_rljob(job: Job, settings: OperatorSettings, task_app: TaskAppTarget) -> Rendered:
    """Every child of an RLJob; `task_app` is the verified target."""
    spec = job.rl
    topo = rl_topology(spec.compute, spec.vllm, spec.reference, spec.algorithm)
    servers = render_servers(job, settings, topo, model_location(spec, settings))
    jobfile = render_jobfile(job, settings, task_app=task_app, endpoints=servers.endpoints)
    trainer = render_trainer(job, settings, topo, task_app=task_app, wait_for=servers.urls,
                             judge_env=servers.judge_env)  # fmt: skip
    children = [*servers.children, *render_trainer_identity(job.owner, settings), *trainer,
                *render_disruption_budgets(job.owner, settings, rollout=bool(servers.children))]  # fmt: skip
    return Rendered(children, topo, jobfile, job, rollout_token=True)


def render_sftjob(job: Job, settings: OperatorSettings) -> Rendered:
    """Every child of an SFTJob: the trainer (and its Secret)."""
    spec = job.sft
    topo = sft_topology(spec.compute)
    train, train_volume = dataset_path(spec.dataset)
    validation, validation_volume = dataset_path(spec.validation_dataset)
    if train_volume and validation_volume and validation_volume["name"] != train_volume["name"]:
        validation = None  # one ConfigMap volume only; put both files in the same ConfigMap
    jobfile = render_jobfile(job, settings, dataset={"train": train, "validation": validation})
    children = [
        *render_trainer_identity(job.owner, settings),
        *render_trainer(job, settings, topo, dataset_volume=train_volume or validation_volume),
        *render_disruption_budgets(job.owner, settings, rollout=False),
    ]
    return Rendered(children, topo, jobfile, job)


def render_job(job: Job, settings: OperatorSettings, task_app: TaskAppTarget | None) -> Rendered:
    check_model_access(job.spec, job.owner.namespace, settings)
    if job.is_rl:
        assert task_app is not None, "an RLJob is rendered once its task app is verified"
        return render_rljob(job, settings, task_app)
    return render_sftjob(job, settings)


def desired_state(child: dict[str, Any]) -> dict[str, Any]:
    """The mutable parts of a child the controller keeps in line (suspend -> replicas 0 / Job suspended)."""
    if child["kind"] == "Deployment":
        return {"replicas": child["spec"]["replicas"]}
    if child["kind"] == "Job":
        return {"suspend": bool(child["spec"]["suspend"])} if "suspend" in child["spec"] else {}
    return {}
