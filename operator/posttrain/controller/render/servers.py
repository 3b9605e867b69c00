"""Pure: an RLJob's servers. Each is the rollout image's proxy in front of vLLM (`python -m posttrain_rollout
serve --role policy|reference|judge`), a Deployment with a headless Service whose name resolves to every
ready replica:

  <job>-rollout    the policy: gpus_for_vllm / tensor_parallel replicas of tensor_parallel GPUs each
  <job>-reference  only when the reference model is dedicated (gpus_for_ref GPUs)
  <job>-judge      only when the trainer calls a self-hosted judge at no base_url of its own
                   ([judge.options].gpus GPUs; none for a judge blended with weight 0)

An external judge (or one at a base_url) gets no server: the trainer calls it with the key from the Secret
the job names (spec.judge.apiKeySecretRef) as POSTTRAIN_JUDGE_API_KEY, the only variable its judge client
reads in a cluster (render/jobfile.py): no other variable of the trainer's (S3 keys, the task app's key)
can be sent to a URL the job chose.
The servers' pods mount no ServiceAccount token (they never call the API server); the job's rollout
token guards their weight-sync and capture endpoints."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from posttrain import hardware
from posttrain.api.convert import spec_to_config
from posttrain.api.judge_settings import JudgeSettings
from posttrain.api.resources import RLJobSpec
from posttrain.api.settings import trainer_mode
from posttrain.api.topology import Topology
from posttrain.api.vision import rollout_server_args
from posttrain.controller.objects import Job
from posttrain.controller.render import pods, security, token
from posttrain.controller.render.model import ModelLocation, base_model_path
from posttrain.controller.render.names import (
    ROLE_JUDGE,
    ROLE_REFERENCE,
    ROLE_ROLLOUT,
    judge_name,
    reference_name,
    rollout_name,
    service_url,
)
from posttrain.controller.settings import OperatorSettings

SERVER_CLI_ROLE = {ROLE_ROLLOUT: "policy", ROLE_REFERENCE: "reference", ROLE_JUDGE: "judge"}
JUDGE_ENDPOINT = "judge"  # the job file's endpoints.judges key of a self-hosted judge
JUDGE_KEY_ENV = "POSTTRAIN_JUDGE_API_KEY"  # the judge's key in the trainer, from the Secret the job names


@dataclass
class Servers:
    """An RLJob's server children and what the trainer needs to know about them."""

    children: list[dict[str, Any]] = field(default_factory=list)
    endpoints: dict[str, Any] = field(default_factory=lambda: {"policy": [], "reference": None, "judges": {}})
    urls: list[str] = field(default_factory=list)  # what the trainer waits for before it starts
    judge_env: list[dict[str, Any]] = field(default_factory=list)  # an external judge's key


@dataclass(frozen=True)
class Server:
    role: str
    name: str
    replicas: int
    gpus_per_pod: int
    args: list[str]


def server_children(job: Job, settings: OperatorSettings, server: Server) -> list[dict[str, Any]]:
    """The Deployment and headless Service of one server."""
    spec = job.spec
    owner = job.owner
    port = settings.server_port
    container = {
        "name": server.role,
        "image": pods.image(spec, server.role, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "posttrain_rollout", "serve", "--role", SERVER_CLI_ROLE[server.role],
                    *server.args],  # fmt: skip
        "args": ["--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port}],
        "env": [*pods.s3_env(spec, settings), *token.token_env(owner), *pods.plain_env(settings)],
        "resources": pods.resources(spec, server.role, server.gpus_per_pod, settings),
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
    }
    shm_volume, shm_mount = pods.shm(settings)
    container["volumeMounts"] = [shm_mount]
    pod_spec = security.lock_down(
        {"containers": [container], "volumes": [shm_volume], **pods.pod_scheduling(spec.scheduling),
         **pods.gpu_placement(spec, server.gpus_per_pod, settings)},  # fmt: skip
        run_as_user=settings.run_as_user,
        read_only_root=True,
        token=False,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pods.child_meta(owner, server.name, server.role),
        "spec": {
            "replicas": 0 if spec.suspend else server.replicas,
            "selector": {"matchLabels": pods.selector(owner, server.role)},
            "template": {"metadata": {"labels": pods.labels(owner, server.role)}, "spec": pod_spec},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.child_meta(owner, server.name, server.role),
        "spec": {
            "clusterIP": "None",
            "selector": pods.selector(owner, server.role),
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }
    return [deployment, service]


def _model_args(path: str, served_name: str, tensor_parallel: int) -> list[str]:
    return ["--model", path, "--served-model-name", served_name, "--tensor-parallel-size", str(tensor_parallel)]


def rollout_server(spec: RLJobSpec, name: str, topo: Topology, model: ModelLocation) -> Server:
    args = _model_args(model.path, model.base, topo.tensor_parallel)
    if spec.vllm and spec.vllm.max_model_len:
        args += ["--max-model-len", str(spec.vllm.max_model_len)]
    if hardware.is_lora_mode(trainer_mode(spec_to_config(spec))):  # posttrain.api.settings' one derivation
        args.append("--lora-policy")  # float32 vLLM on a CPU node (posttrain.hardware); no effect on a GPU
    args += rollout_server_args(spec_to_config(spec))
    gpus = topo.gpus(topo.tensor_parallel if topo.gpus_for_vllm > 0 else 0)
    return Server(ROLE_ROLLOUT, rollout_name(name), topo.rollout_replicas, gpus, args)


def reference_server(name: str, topo: Topology, model: ModelLocation) -> Server:
    args = _model_args(model.path, model.base, topo.gpus_for_ref)
    return Server(ROLE_REFERENCE, reference_name(name), 1, topo.gpus(topo.gpus_for_ref), args)


def judge_server(name: str, judge_model: str, gpus: int, topo: Topology, settings: OperatorSettings) -> Server:
    args = _model_args(base_model_path(judge_model, settings), judge_model, gpus)
    return Server(ROLE_JUDGE, judge_name(name), 1, topo.gpus(gpus), args)


def judge_key_env(spec: RLJobSpec) -> list[dict[str, Any]]:
    """JUDGE_KEY_ENV from the Secret spec.judge.apiKeySecretRef names (key: its `key`, else
    <PROVIDER>_API_KEY); nothing when the job names none (parse_job refuses a judge that needs one)."""
    assert spec.judge is not None and spec.judge.options is not None
    ref = spec.judge.api_key_secret_ref
    if ref is None or not ref.name:
        return []
    default_key = f"{re.sub(r'[^A-Z0-9]', '_', str(spec.judge.options.provider).upper())}_API_KEY"
    secret = {"name": ref.name, "key": ref.key or default_key}
    return [{"name": JUDGE_KEY_ENV, "valueFrom": {"secretKeyRef": secret}}]


def render_servers(job: Job, settings: OperatorSettings, topo: Topology, model: ModelLocation) -> Servers:
    """The rollout servers, then a dedicated reference and a self-hosted judge where the job has them."""
    spec, owner = job.rl, job.owner
    out = Servers()

    def add(server: Server) -> str:
        out.children += server_children(job, settings, server)
        url = service_url(server.name, owner.namespace, settings.server_port)
        out.urls.append(url)
        return url

    out.endpoints["policy"] = [add(rollout_server(spec, owner.name, topo, model))]
    if topo.reference_dedicated:
        out.endpoints["reference"] = add(reference_server(owner.name, topo, model))
    # a judge the trainer never calls (its scores blended with weight 0, or ReST-EM) gets no server and no key
    judge = JudgeSettings.from_sections(spec.judge, spec.rubric, calls_judges=spec.algorithm.variety != "restem")
    if judge.enabled:
        if judge.needs_server:
            assert judge.model
            server = judge_server(owner.name, judge.model, judge.gpus, topo, settings)
            out.endpoints["judges"] = {JUDGE_ENDPOINT: add(server)}
        out.judge_env = judge_key_env(spec)
    return out
