"""Pure functions: a job's custom resource (a dict, as the API server returns it) -> the manifests of its
children. No I/O, no clock, no secrets: Secrets are only ever referenced by name (secretKeyRef).

Children of an RLJob (all in the job's namespace, owned by the job, labelled posttrain.dev/job and
posttrain.dev/role):
  ConfigMap  <job>-config     job.json (the trainer job file, no secrets) + config.toml (original TOML)
  Deployment <job>-rollout    vLLM policy servers: replicas = gpus_for_vllm / tensor_parallel
  Service    <job>-rollout    headless: its name resolves to every ready rollout replica
  Deployment <job>-reference  only when the reference is dedicated (gpus_for_ref GPUs)
  Service    <job>-reference
  Deployment <job>-judge      only when the judge model is self-hosted (provider "self-hosted"/"vllm")
  Service    <job>-judge
  Job        <job>-trainer    Indexed: completions = parallelism = nodes, torchrun env per pod
  Service    <job>-trainer    headless, for torchrun's rendezvous (pod 0's stable DNS name)
  NetworkPolicy <job>-network only the job's own pods (and its TaskApp's, on the server port) get in
  ServiceAccount, Role, RoleBinding <job>-trainer   the trainer may PATCH this job's status, nothing else
An SFTJob has only the ConfigMap, the trainer Job and its headless Service, the NetworkPolicy and the
identity. The RLJob's token Secret <job>-rollout-token (controller/rollout_token.py) is made by the
controller, since its content is random. Every pod is locked down (controller/security.py)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any

from posttrain.api.resources import QUANTITY_PATTERN
from posttrain.controller import rollout_token, security, specs
from posttrain.controller.bounds import truncate
from posttrain.controller.network import render_network_policy
from posttrain.controller.settings import (
    API_VERSION,
    COMPLETION_INDEX_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    LABEL_JOB,
    LABEL_KIND,
    LABEL_MANAGED_BY,
    LABEL_ROLE,
    MANAGER,
    OperatorSettings,
)
from posttrain.controller.spec_errors import SpecError
from posttrain.controller.trainer_policy import checkpoint_every, failure_handling

CONFIG_MOUNT = "/etc/posttrain"
JOBFILE_PATH = f"{CONFIG_MOUNT}/job.json"
DATA_MOUNT = "/data"
WORKDIR = "/workspace"
SELF_HOSTED_PROVIDERS = {"self-hosted", "selfhosted", "self", "vllm", "posttrain", "local"}
ROLE_TRAINER = "trainer"
ROLE_ROLLOUT = "rollout"
ROLE_REFERENCE = "reference"
ROLE_JUDGE = "judge"
ROLE_CONFIG = "config"
ROLE_TASK_APP = "task-app"
ROLE_NETWORK = "network"
ROLE_TOKEN = "rollout-token"
IDENTITY_KINDS = {"ServiceAccount", "Role", "RoleBinding"}
# Children that do not gate the job's phase (they are kept in place, but a job runs without waiting on
# their watch events).
SUPPORTING_KINDS = IDENTITY_KINDS | {"NetworkPolicy"}
SERVER_CLI_ROLE = {"rollout": "policy", "reference": "reference", "judge": "judge"}
DISPLAY_URL_MAX = 200


# ----------------------------------------------------------------------------------------------------- names
def child_name(job_name: str, suffix: str, max_len: int = 63) -> str:
    """`<job>-<suffix>`, a valid DNS-1035 label of at most max_len characters (long names get a hash)."""
    base = job_name if re.match(r"^[a-z]", job_name) else f"j-{job_name}"
    name = f"{base}-{suffix}"
    if len(name) <= max_len:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:6]
    keep = max_len - len(suffix) - len(digest) - 2
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def trainer_name(job_name: str) -> str:
    # Indexed Job pods are named/hostnamed <job>-<index>: keep room for the index.
    return child_name(job_name, ROLE_TRAINER, max_len=57)


def rollout_name(job_name: str) -> str:
    return child_name(job_name, ROLE_ROLLOUT)


def reference_name(job_name: str) -> str:
    return child_name(job_name, ROLE_REFERENCE)


def judge_name(job_name: str) -> str:
    return child_name(job_name, ROLE_JUDGE)


def config_name(job_name: str) -> str:
    return child_name(job_name, ROLE_CONFIG)


def network_policy_name(job_name: str) -> str:
    return child_name(job_name, ROLE_NETWORK)


def token_secret_name(job_name: str) -> str:
    return child_name(job_name, ROLE_TOKEN)


def service_url(name: str, namespace: str, port: int) -> str:
    return f"http://{name}.{namespace}.svc:{port}"


# ------------------------------------------------------------------------------------------------- topology
@dataclass(frozen=True)
class Topology:
    """GPU roles of a job, derived from spec.compute (+ spec.vllm / spec.reference)."""

    gpu_count: int
    nodes: int
    gpus_for_vllm: int
    gpus_for_training: int
    gpus_for_ref: int
    tensor_parallel: int
    reference_dedicated: bool
    # compute.gpuType "CPU": the counts above are processes and servers, not GPUs; no pod asks for one.
    cpu_only: bool = False

    def gpus(self, count: int) -> int:
        """What a pod of this job requests of the GPU resource for `count` GPUs of its role."""
        return 0 if self.cpu_only else count

    @property
    def rollout_replicas(self) -> int:
        if self.gpus_for_vllm <= 0:
            return 0
        return max(1, self.gpus_for_vllm // self.tensor_parallel)

    @property
    def trainer_gpus_per_pod(self) -> int:
        return self.gpus_for_training // self.nodes if self.gpus_for_training > 0 else 0

    @property
    def nproc_per_node(self) -> int:
        return max(1, self.trainer_gpus_per_pod)


def _count(section: dict[str, Any], name: str, where: str, default: int = 0) -> int:
    """A whole number from a spec section (typed by the CRD, but a section's `extras` are not): the field
    is named when it is not one."""
    value = specs.get(section, name, default)
    try:
        return int(value or default)
    except (TypeError, ValueError):
        raise SpecError(f"{where}.{name}", f"{value!r} is not a whole number", "give an integer") from None


def topology(spec: dict[str, Any], kind: str = "rl") -> Topology:
    compute = specs.section(spec, "compute")
    topo = specs.section(compute, "topology")
    gpu_count = _count(compute, "gpuCount", "compute")
    nodes = max(1, _count(compute, "nodes", "compute", 1))
    vllm = specs.section(spec, "vllm")
    reference = specs.section(spec, "reference")
    tp = _count(topo, "tensorParallel", "compute.topology") or _count(vllm, "tensorParallelSize", "vllm") or 1
    ref = specs.get(topo, "gpusForRef")
    placement = specs.get(reference, "placement") or specs.get(topo, "referencePlacement")
    # synth's CLI injects reference_placement="none" even when [reference].placement="dedicated": an
    # explicit [reference].placement wins, then gpus_for_ref > 0, then topology.reference_placement.
    restem = specs.get(specs.section(spec, "algorithm"), "variety") == "restem"
    if kind != "rl" or restem:  # SFT and ReST-EM train without a KL reference
        dedicated = False
    elif specs.get(reference, "placement"):
        dedicated = specs.get(reference, "placement") == "dedicated"
    elif ref:
        dedicated = int(ref) > 0
    else:
        dedicated = placement == "dedicated"
    gpus_ref = int(ref or 0) if dedicated else 0
    if dedicated and gpus_ref <= 0:
        gpus_ref = 1
    vllm_gpus = specs.get(topo, "gpusForVllm")
    train_gpus = specs.get(topo, "gpusForTraining")
    if kind != "rl":
        vllm_gpus = 0
        train_gpus = train_gpus if train_gpus is not None else gpu_count
    elif vllm_gpus is None and train_gpus is None:
        rest = max(0, gpu_count - gpus_ref)
        vllm_gpus = max(1, rest // 2) if rest else 1
        train_gpus = max(0, rest - vllm_gpus)
    elif vllm_gpus is None:
        vllm_gpus = max(1, gpu_count - int(train_gpus) - gpus_ref)
    elif train_gpus is None:
        train_gpus = max(0, gpu_count - int(vllm_gpus) - gpus_ref)
    return Topology(
        gpu_count=gpu_count,
        nodes=nodes,
        gpus_for_vllm=int(vllm_gpus or 0),
        gpus_for_training=int(train_gpus or 0),
        gpus_for_ref=gpus_ref,
        tensor_parallel=max(1, tp),
        reference_dedicated=dedicated,
        cpu_only=str(specs.get(compute, "gpuType", "") or "").strip().lower() == "cpu",
    )


# ----------------------------------------------------------------------------------------------- task app
@dataclass(frozen=True)
class TaskAppTarget:
    """Where the task app is and which Secret holds its key (resolved from spec.taskApp, or a TaskApp)."""

    url: str
    secret_name: str | None
    secret_key: str = "ENVIRONMENT_API_KEY"
    name: str | None = None  # the TaskApp's name when referenced by name

    @property
    def display(self) -> str:
        """For status messages: the URL is cut to keep room for why the task app failed."""
        url = truncate(self.url, DISPLAY_URL_MAX)
        return f"TaskApp {self.name} ({url})" if self.name else f"task app {url}"


def task_app_target(
    spec: dict[str, Any], task_app: dict[str, Any] | None = None, namespace: str = "default"
) -> TaskAppTarget | None:
    """The task app a job talks to. `task_app` is the TaskApp resource when spec.taskApp.name is used."""
    ref = specs.section(spec, "taskApp")
    secret = specs.section(ref, "apiKeySecretRef")
    name = ref.get("name")
    url = ref.get("url")
    if name and task_app is not None:
        ta_spec = task_app.get("spec") or {}
        url = (task_app.get("status") or {}).get("url") or ta_spec.get("url") or url
        if not url and ta_spec.get("image"):
            url = service_url(child_name(name, ROLE_TASK_APP), namespace, int(ta_spec.get("port") or 8000))
        if not secret:
            secret = ta_spec.get("apiKeySecretRef") or {}
    if not url:
        return None
    return TaskAppTarget(
        url=str(url).rstrip("/"),
        secret_name=secret.get("name"),
        secret_key=secret.get("key") or "ENVIRONMENT_API_KEY",
        name=name,
    )


# ---------------------------------------------------------------------------------------------- manifests
@dataclass
class Rendered:
    """All children of one job, in creation order, plus the facts the controller needs about them."""

    children: list[dict[str, Any]] = field(default_factory=list)
    topology: Topology | None = None
    jobfile: dict[str, Any] = field(default_factory=dict)
    token_secret: str | None = None  # the Secret the controller makes before the servers (RLJob)

    def by_role(self, role: str, kind: str | None = None) -> list[dict[str, Any]]:
        return [
            c
            for c in self.children
            if c["metadata"]["labels"].get(LABEL_ROLE) == role and (kind is None or c["kind"] == kind)
        ]

    def deployments(self) -> list[dict[str, Any]]:
        return [c for c in self.children if c["kind"] == "Deployment"]


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": job.get("apiVersion", API_VERSION),
        "kind": job["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        # No blockOwnerDeletion: setting it needs `update` on the owner's finalizers subresource
        # (OwnerReferencesPermissionEnforcement), which the operator does not hold; without it a
        # foreground deletion of the job does not wait for the garbage collector to remove the children.
        "controller": True,
    }


def labels(job: dict[str, Any], role: str) -> dict[str, str]:
    return {
        LABEL_JOB: job["metadata"]["name"],
        LABEL_ROLE: role,
        LABEL_KIND: job["kind"].lower(),
        LABEL_MANAGED_BY: MANAGER,
    }


def _meta(job: dict[str, Any], name: str, role: str, extra_labels: dict[str, str] | None = None) -> dict:
    return {
        "name": name,
        "namespace": job["metadata"]["namespace"],
        "labels": {**labels(job, role), **(extra_labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


def _queue_labels(spec: dict[str, Any]) -> dict[str, str]:
    queue = specs.get(specs.section(spec, "scheduling"), "queueName")
    return {KUEUE_QUEUE_LABEL: str(queue)} if queue else {}


def _resources(spec: dict[str, Any], role: str, gpus: int, settings: OperatorSettings) -> dict[str, Any]:
    """spec.scheduling.resources: a ResourceRequirements for every role, or one per role name."""
    given = specs.get(specs.section(spec, "scheduling"), "resources") or {}
    given = given if isinstance(given, dict) else {}
    per_role = given.get(role) if isinstance(given.get(role), dict) else {}
    for where, section in (("", given), (f"{role}.", per_role)):
        for kind in ("requests", "limits"):
            for name, value in (section.get(kind) or {}).items():
                if not isinstance(value, int) and not re.fullmatch(QUANTITY_PATTERN, str(value)):
                    raise SpecError(
                        f"scheduling.resources.{where}{kind}.{name}",
                        f"{value!r} is not a Kubernetes quantity",
                        "e.g. 500m, 4, 16Gi",
                    )
    requests = {**(given.get("requests") or {}), **(per_role.get("requests") or {})}
    limits = {**(given.get("limits") or {}), **(per_role.get("limits") or {})}
    if gpus > 0:
        requests[settings.gpu_resource] = str(gpus)
        limits[settings.gpu_resource] = str(gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _pod_scheduling(spec: dict[str, Any]) -> dict[str, Any]:
    sched = specs.section(spec, "scheduling")
    out: dict[str, Any] = {}
    if specs.get(sched, "nodeSelector"):
        out["nodeSelector"] = dict(specs.get(sched, "nodeSelector"))
    if specs.get(sched, "tolerations"):
        out["tolerations"] = list(specs.get(sched, "tolerations"))
    if specs.get(sched, "priorityClassName"):
        out["priorityClassName"] = specs.get(sched, "priorityClassName")
    return out


def _image(spec: dict[str, Any], role: str, settings: OperatorSettings) -> str:
    override = specs.get(specs.section(spec, "images"), role)
    if override:
        return str(override)
    if role == ROLE_TRAINER:
        return settings.trainer_image
    if role == ROLE_REFERENCE:
        return settings.reference_image or settings.rollout_image
    if role == ROLE_JUDGE:
        return settings.judge_image or settings.rollout_image
    return settings.rollout_image


def _s3_env(spec: dict[str, Any], settings: OperatorSettings) -> list[dict[str, Any]]:
    storage = specs.section(spec, "storage")
    secret = (specs.get(storage, "secretRef") or {}).get("name") or settings.s3_secret_name
    env = [{"name": "S3_ENDPOINT", "value": settings.s3_endpoint}]
    for key in ("S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY"):
        env.append(
            {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key, "optional": True}}}
        )
    return env


SHM_VOLUME = "dshm"


def _shm(settings: OperatorSettings) -> tuple[dict[str, Any], dict[str, Any]]:
    """A memory-backed /dev/shm (volume, mount). A container's own /dev/shm is 64 MiB: vLLM's engine needs
    more for its shared-memory ring buffer (160 MiB on the smallest model), and NCCL and torch's
    multi-process data paths use it too."""
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if settings.shm_size_limit:
        empty_dir["sizeLimit"] = settings.shm_size_limit
    return {"name": SHM_VOLUME, "emptyDir": empty_dir}, {"name": SHM_VOLUME, "mountPath": "/dev/shm"}


def _plain_env(settings: OperatorSettings) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in sorted(settings.extra_env.items())]


def model_ids(spec: dict[str, Any], settings: OperatorSettings) -> tuple[str, str]:
    """(base model id, model path for the trainer and vLLM) from spec.model.base | spec.model.source."""
    model = specs.section(spec, "model")
    bucket = specs.get(specs.section(spec, "storage"), "bucket") or settings.s3_bucket
    base = specs.get(model, "base")
    source = specs.get(model, "source")
    if base:
        return str(base), base_model_path(str(base), settings)
    source = str(source or "")
    if not source:
        raise SpecError("model", "neither model.base nor model.source is set", "set exactly one of them")
    if re.match(r"^(rl|ft|fft|qft):", source):
        try:
            return specs.base_of_model_id(source), specs.resolve_model_source(source, bucket)
        except ValueError as err:
            raise SpecError("model.source", str(err), getattr(err, "fix", None)) from err
    if source.startswith(("s3://", "/")):
        return source, source
    raise SpecError(
        "model.source",
        f"{source!r} names no weights posttrain can find",
        "use a posttrain fine-tuned id (rl:<base>:<namespace>.<name>.<uid8>) or an s3:// URI",
    )


def base_model_path(base: str, settings: OperatorSettings) -> str:
    """settings.base_model_uri with `{base}` replaced (plain replacement: a model id is data, never a
    format string)."""
    return settings.base_model_uri.replace("{base}", base)


def _server_deployment(
    job: dict[str, Any],
    settings: OperatorSettings,
    *,
    role: str,
    name: str,
    replicas: int,
    gpus_per_pod: int,
    args: list[str],
    suspended: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A server: the rollout proxy in front of vLLM. Its token env guards weight sync and captures; its
    pod mounts no ServiceAccount token (it never calls the API server)."""
    spec = job["spec"]
    lbls = labels(job, role)
    selector = {LABEL_JOB: lbls[LABEL_JOB], LABEL_ROLE: role}
    port = settings.server_port
    container = {
        "name": role,
        "image": _image(spec, role, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": ["python", "-m", "posttrain_rollout", "serve", "--role", SERVER_CLI_ROLE[role], *args],
        "args": ["--host", "0.0.0.0", "--port", str(port)],
        "ports": [{"name": "http", "containerPort": port}],
        "env": [
            *_s3_env(spec, settings),
            *rollout_token.token_env(token_secret_name(job["metadata"]["name"])),
            *_plain_env(settings),
        ],
        "resources": _resources(spec, role, gpus_per_pod, settings),
        "readinessProbe": {"httpGet": {"path": "/health", "port": port}, "periodSeconds": 5},
    }
    shm_volume, shm_mount = _shm(settings)
    container["volumeMounts"] = [shm_mount]
    pod_spec = security.lock_down(
        {"containers": [container], "volumes": [shm_volume], **_pod_scheduling(spec)},
        run_as_user=settings.run_as_user,
        read_only_root=True,
        token=False,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(job, name, role, _queue_labels(spec)),
        "spec": {
            "replicas": 0 if suspended else replicas,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": {**lbls, **_queue_labels(spec)}},
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, name, role),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": "http", "port": port, "targetPort": port}],
        },
    }
    return deployment, service


def render_config_map(job: dict[str, Any], jobfile: dict[str, Any]) -> dict[str, Any]:
    spec = job["spec"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(job, config_name(job["metadata"]["name"]), ROLE_CONFIG),
        "data": {
            "job.json": json.dumps(jobfile, indent=2, sort_keys=True),
            "config.toml": str(spec.get("originalToml") or ""),
        },
    }


def _dataset_path(ref: Any, mount: str) -> tuple[str | None, dict[str, Any] | None]:
    """(path or URI, ConfigMap volume source) for spec.dataset / spec.validationDataset."""
    if isinstance(ref, str):
        return ref, None
    if not isinstance(ref, dict):
        return None, None
    if ref.get("uri"):
        return str(ref["uri"]), None
    cm = ref.get("configMapRef")
    if isinstance(cm, dict) and cm.get("name"):
        key = cm.get("key") or "train.jsonl"
        return f"{mount}/{key}", {"name": cm["name"]}
    return None, None


def render_jobfile(
    job: dict[str, Any],
    settings: OperatorSettings,
    *,
    kind: str,
    config: dict[str, Any],
    task_app: TaskAppTarget | None = None,
    endpoints: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The trainer's job file (trainer_image/posttrain_trainer/jobfile.py), no secrets."""
    meta = job["metadata"]
    spec = job["spec"]
    base, model_path = model_ids(spec, settings)
    storage = specs.section(spec, "storage")
    endpoint = settings.s3_endpoint
    return {
        "kind": kind,
        "job": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
            "group": API_VERSION.split("/")[0],
            "version": API_VERSION.split("/")[1],
            "plural": "rljobs" if kind == "rl" else "sftjobs",
        },
        "config": config,
        "base_model": base,
        "model_path": model_path,
        "task_app": {"url": task_app.url, "api_key_env": "ENVIRONMENT_API_KEY"} if task_app else None,
        "endpoints": endpoints or {"policy": [], "reference": None, "judges": {}},
        "dataset": dataset or {"train": None, "validation": None},
        "storage": {
            "endpoint": endpoint,
            "secure": endpoint.startswith("https://"),
            "bucket": specs.get(storage, "bucket") or settings.s3_bucket,
            "prefix": specs.job_artifact_prefix(meta["namespace"], meta["name"], meta["uid"]),
            "region": settings.s3_region,
        },
        "checkpoint_every": checkpoint_every(
            specs.get(specs.section(config, "training"), "checkpoint_every", 0),
            kind,
            rl_default=settings.checkpoint_every_rl,
            sft_default=settings.checkpoint_every_sft,
        ),
        "report": {"mode": "kubernetes", "path": None},
        "workdir": WORKDIR,
        "weight_sync": {"via": "s3", "shared_dir": None},
    }


def render_trainer_identity(job: dict[str, Any], settings: OperatorSettings) -> list[dict[str, Any]]:
    """Per-job trainer identity (when settings.per_job_trainer_identity): ServiceAccount <job>-trainer, a
    Role allowing PATCH on exactly this job's status, and its RoleBinding; all owned by the job."""
    if not settings.per_job_trainer_identity:
        return []
    meta = job["metadata"]
    name = trainer_name(meta["name"])
    plural = "rljobs" if job["kind"] == "RLJob" else "sftjobs"
    sa = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": _meta(job, name, ROLE_TRAINER)}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(job, name, ROLE_TRAINER),
        "rules": [
            {
                "apiGroups": [API_VERSION.split("/")[0]],
                "resources": [f"{plural}/status"],
                "resourceNames": [meta["name"]],
                "verbs": ["patch"],
            }
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(job, name, ROLE_TRAINER),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": meta["namespace"]}],
    }
    return [sa, role, binding]


def trainer_service_account(job: dict[str, Any], settings: OperatorSettings) -> str:
    if settings.per_job_trainer_identity:
        return trainer_name(job["metadata"]["name"])
    return settings.trainer_service_account


def _wait_script(urls: list[str], timeout: int) -> str:
    """A tiny Python program for the trainer's initContainer: wait until every server's /health is 200."""
    return (
        "import sys,time,urllib.request\n"
        f"urls={urls!r}\n"
        f"deadline=time.time()+{timeout}\n"
        "for u in urls:\n"
        "    while True:\n"
        "        try:\n"
        "            if urllib.request.urlopen(u+'/health',timeout=5).status==200: break\n"
        "        except Exception as e: err=e\n"
        "        if time.time()>deadline: sys.exit(f'{u} not ready')\n"
        "        time.sleep(2)\n"
        "    print(u,'ready',flush=True)\n"
    )


def render_trainer(
    job: dict[str, Any],
    settings: OperatorSettings,
    *,
    kind: str,
    topo: Topology,
    task_app: TaskAppTarget | None,
    wait_for: list[str],
    judge_env: list[dict[str, Any]],
    dataset_volume: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The trainer Indexed Job and its headless Service (torchrun rendezvous on pod 0)."""
    meta = job["metadata"]
    spec = job["spec"]
    ns = meta["namespace"]
    name = trainer_name(meta["name"])
    lbls = labels(job, ROLE_TRAINER)
    port = settings.master_port
    master = f"{name}-0.{name}.{ns}.svc"
    env: list[dict[str, Any]] = [
        {"name": "PET_NNODES", "value": str(topo.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(topo.nproc_per_node)},
        {
            "name": "PET_NODE_RANK",
            "valueFrom": {
                "fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}
            },
        },
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": str(port)},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": str(port)},
        {"name": "POSTTRAIN_JOBFILE", "value": JOBFILE_PATH},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]
    if kind == "rl":
        env += rollout_token.token_env(token_secret_name(meta["name"]))
    key_env: list[dict[str, Any]] = []
    if task_app and task_app.secret_name:
        key_env = [
            {
                "name": "ENVIRONMENT_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": task_app.secret_name, "key": task_app.secret_key}},
            }
        ]
    env += key_env + _s3_env(spec, settings) + judge_env + _plain_env(settings)
    shm_volume, shm_mount = _shm(settings)
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": config_name(meta["name"])}},
        {"name": "workspace", "emptyDir": {}},
        shm_volume,
    ]
    mounts = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "workspace", "mountPath": WORKDIR},
        shm_mount,
    ]
    if dataset_volume:
        volumes.append({"name": "data", "configMap": dataset_volume})
        mounts.append({"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})
    image = _image(spec, ROLE_TRAINER, settings)
    init: list[dict[str, Any]] = []
    if task_app:
        verify = (
            'for i in $(seq 1 30); do posttrain verify-task-app "$TASK_APP_URL" --no-rollout && exit 0; '
            "sleep 10; done; exit 1"
        )
        init.append(
            {
                "name": "verify-task-app",
                "image": image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["sh", "-c", verify],
                "env": [{"name": "TASK_APP_URL", "value": task_app.url}, *key_env],
            }
        )
    if wait_for:
        init.append(
            {
                "name": "wait-for-servers",
                "image": image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": ["python", "-c", _wait_script(wait_for, settings.readiness_timeout_seconds)],
            }
        )
    command = [
        # torchrun, run in process by a launcher that turns a worker's configuration-error exit code
        # into the pod's exit code (torchrun alone exits 1 for every worker failure)
        "python",
        "-m",
        "posttrain_trainer.launch",
        "--nnodes=$(PET_NNODES)",
        "--nproc-per-node=$(PET_NPROC_PER_NODE)",
        "--node-rank=$(PET_NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
        "-m",
        "posttrain_trainer",
        kind,
        "--config",
        JOBFILE_PATH,
    ]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "subdomain": name,
        "serviceAccountName": trainer_service_account(job, settings),
        "initContainers": init,
        "containers": [
            {
                "name": ROLE_TRAINER,
                "image": image,
                "imagePullPolicy": settings.image_pull_policy,
                "command": command,
                "env": env,
                "ports": [{"name": "rendezvous", "containerPort": port}],
                "resources": _resources(spec, ROLE_TRAINER, topo.gpus(topo.trainer_gpus_per_pod), settings),
                "volumeMounts": mounts,
                "workingDir": WORKDIR,
            }
        ],
        "volumes": volumes,
        **_pod_scheduling(spec),
    }
    if not init:
        del pod_spec["initContainers"]
    # The trainer patches its job's status: the only pod that mounts a ServiceAccount token.
    pod_spec = security.lock_down(pod_spec, run_as_user=settings.run_as_user, read_only_root=True, token=True)
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": topo.nodes,
        "parallelism": topo.nodes,
        **failure_handling(ROLE_TRAINER, retries=settings.trainer_retries, nodes=topo.nodes),
        "suspend": bool(spec.get("suspend")),
        "template": {"metadata": {"labels": {**lbls, **_queue_labels(spec)}}, "spec": pod_spec},
    }
    if _queue_labels(spec) and not spec.get("suspend"):
        # Kueue owns Job.spec.suspend while the job waits in its queue: do not fight its admission.
        del job_spec["suspend"]
    deadline = spec.get("activeDeadlineSeconds")
    if deadline:
        job_spec["activeDeadlineSeconds"] = int(deadline)
    trainer = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(job, name, ROLE_TRAINER, _queue_labels(spec)),
        "spec": job_spec,
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(job, name, ROLE_TRAINER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: meta["name"], LABEL_ROLE: ROLE_TRAINER},
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port}],
        },
    }
    return trainer, service


def _judge(spec: dict[str, Any], settings: OperatorSettings) -> tuple[bool, str | None, str | None, int]:
    """(self-hosted?, provider, model, gpus) of spec.judge; (False, None, None, 0) when there is no judge."""
    judge = specs.section(spec, "judge")
    options = specs.section(judge, "options")
    if not judge or specs.get(judge, "enabled") is False:
        return False, None, None, 0
    provider = specs.get(options, "provider") or specs.get(judge, "provider")
    model = specs.get(options, "model") or specs.get(judge, "model")
    if not provider or not model:
        return False, None, None, 0  # synth: an incomplete [judge.options] means "no judge"
    self_hosted = str(provider).lower() in SELF_HOSTED_PROVIDERS
    gpus = int(specs.get(options, "gpus", 0) or specs.get(judge, "gpus", 0) or 1) if self_hosted else 0
    return self_hosted, str(provider), str(model), gpus


def render_rljob(
    job: dict[str, Any],
    settings: OperatorSettings,
    task_app: TaskAppTarget,
    config: dict[str, Any] | None = None,
) -> Rendered:
    """Every child of an RLJob. `task_app` is the verified target; `config` the normalised synth config."""
    meta = job["metadata"]
    spec = job["spec"]
    ns = meta["namespace"]
    suspended = bool(spec.get("suspend"))
    topo = topology(spec, "rl")
    config = config if config is not None else specs.spec_to_config(spec)
    base, model_path = model_ids(spec, settings)
    port = settings.server_port
    vllm = specs.section(spec, "vllm")
    max_len = specs.get(vllm, "maxModelLen")
    children: list[dict[str, Any]] = []
    servers: list[str] = []

    rollout_args = ["--model", model_path, "--served-model-name", base]
    rollout_args += ["--tensor-parallel-size", str(topo.tensor_parallel)]
    if max_len:
        rollout_args += ["--max-model-len", str(max_len)]
    r_name = rollout_name(meta["name"])
    rollout_dep, rollout_svc = _server_deployment(
        job,
        settings,
        role=ROLE_ROLLOUT,
        name=r_name,
        replicas=topo.rollout_replicas,
        gpus_per_pod=topo.gpus(topo.tensor_parallel if topo.gpus_for_vllm > 0 else 0),
        args=rollout_args,
        suspended=suspended,
    )
    rollout_url = service_url(r_name, ns, port)
    servers.append(rollout_url)
    endpoints: dict[str, Any] = {"policy": [rollout_url], "reference": None, "judges": {}}
    server_children = [rollout_dep, rollout_svc]

    if topo.reference_dedicated:
        ref_name = reference_name(meta["name"])
        ref_args = ["--model", model_path, "--served-model-name", base]
        ref_args += ["--tensor-parallel-size", str(topo.gpus_for_ref)]
        ref_dep, ref_svc = _server_deployment(
            job,
            settings,
            role=ROLE_REFERENCE,
            name=ref_name,
            replicas=1,
            gpus_per_pod=topo.gpus(topo.gpus_for_ref),
            args=ref_args,
            suspended=suspended,
        )
        server_children += [ref_dep, ref_svc]
        endpoints["reference"] = service_url(ref_name, ns, port)
        servers.append(endpoints["reference"])

    self_hosted, provider, judge_model, judge_gpus = _judge(spec, settings)
    judge_env: list[dict[str, Any]] = []
    if self_hosted and judge_model:
        j_name = judge_name(meta["name"])
        j_uri = base_model_path(judge_model, settings)
        j_args = ["--model", j_uri, "--served-model-name", judge_model]
        j_args += ["--tensor-parallel-size", str(judge_gpus)]
        j_dep, j_svc = _server_deployment(
            job,
            settings,
            role=ROLE_JUDGE,
            name=j_name,
            replicas=1,
            gpus_per_pod=topo.gpus(judge_gpus),
            args=j_args,
            suspended=suspended,
        )
        server_children += [j_dep, j_svc]
        endpoints["judges"] = {"judge": service_url(j_name, ns, port)}
        servers.append(endpoints["judges"]["judge"])
    elif provider:
        judge = specs.section(spec, "judge")
        ref = specs.get(judge, "apiKeySecretRef") or {}
        env_name = f"{re.sub(r'[^A-Z0-9]', '_', provider.upper())}_API_KEY"
        judge_env = [
            {
                "name": env_name,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": ref.get("name") or settings.judge_secret_name,
                        "key": ref.get("key") or env_name,
                        "optional": True,
                    }
                },
            }
        ]

    jobfile = render_jobfile(job, settings, kind="rl", config=config, task_app=task_app, endpoints=endpoints)
    trainer, trainer_svc = render_trainer(
        job,
        settings,
        kind="rl",
        topo=topo,
        task_app=task_app,
        wait_for=servers,
        judge_env=judge_env,
    )
    identity = render_trainer_identity(job, settings)
    network = _network_policy(job, settings, task_app.name)
    children = [render_config_map(job, jobfile), network, *server_children, *identity, trainer_svc, trainer]
    return Rendered(
        children=children, topology=topo, jobfile=jobfile, token_secret=token_secret_name(meta["name"])
    )


def render_sftjob(
    job: dict[str, Any], settings: OperatorSettings, config: dict[str, Any] | None = None
) -> Rendered:
    """Every child of an SFTJob: the ConfigMap, the trainer Job and its headless Service."""
    spec = job["spec"]
    topo = topology(spec, "sft")
    config = config if config is not None else specs.spec_to_config(spec)
    train, train_vol = _dataset_path(spec.get("dataset"), f"{DATA_MOUNT}")
    validation, val_vol = _dataset_path(spec.get("validationDataset"), f"{DATA_MOUNT}")
    volume = train_vol or val_vol
    if train_vol and val_vol and val_vol["name"] != train_vol["name"]:
        validation = None  # one ConfigMap volume only; put both files in the same ConfigMap
    jobfile = render_jobfile(
        job, settings, kind="sft", config=config, dataset={"train": train, "validation": validation}
    )
    trainer, trainer_svc = render_trainer(
        job,
        settings,
        kind="sft",
        topo=topo,
        task_app=None,
        wait_for=[],
        judge_env=[],
        dataset_volume=volume,
    )
    identity = render_trainer_identity(job, settings)
    network = _network_policy(job, settings, None)
    children = [render_config_map(job, jobfile), network, *identity, trainer_svc, trainer]
    return Rendered(children=children, topology=topo, jobfile=jobfile)


def _network_policy(job: dict[str, Any], settings: OperatorSettings, task_app: str | None) -> dict[str, Any]:
    metadata = _meta(job, network_policy_name(job["metadata"]["name"]), ROLE_NETWORK)
    return render_network_policy(job, metadata, server_port=settings.server_port, task_app=task_app)


def render_token_secret(job: dict[str, Any], token: str) -> dict[str, Any]:
    """The RLJob's rollout token Secret (owned by the job) holding `token`."""
    metadata = _meta(job, token_secret_name(job["metadata"]["name"]), ROLE_TOKEN)
    return rollout_token.render_token_secret(metadata, token)


def render_task_app(task_app: dict[str, Any], settings: OperatorSettings) -> list[dict[str, Any]]:
    """Deployment + Service for a TaskApp with spec.image (nothing for spec.url)."""
    spec = task_app.get("spec") or {}
    if not spec.get("image"):
        return []
    meta = task_app["metadata"]
    name = child_name(meta["name"], ROLE_TASK_APP)
    port = int(spec.get("port") or 8000)
    lbls = labels(task_app, ROLE_TASK_APP)
    selector = {LABEL_JOB: meta["name"], LABEL_ROLE: ROLE_TASK_APP}
    env = [{"name": str(k), "value": str(v)} for k, v in sorted((spec.get("env") or {}).items())]
    if isinstance(spec.get("env"), list):
        env = list(spec["env"])
    secret = spec.get("apiKeySecretRef") or {}
    if secret.get("name"):
        env.append(
            {
                "name": "ENVIRONMENT_API_KEY",
                "valueFrom": {
                    "secretKeyRef": {
                        "name": secret["name"],
                        "key": secret.get("key") or "ENVIRONMENT_API_KEY",
                    }
                },
            }
        )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(task_app, name, ROLE_TASK_APP),
        "spec": {
            "replicas": int(spec.get("replicas") if spec.get("replicas") is not None else 1),
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": lbls},
                # someone else's program: its root filesystem stays writable; no ServiceAccount token
                "spec": security.lock_down(
                    {
                        "containers": [
                            {
                                "name": "task-app",
                                "image": spec["image"],
                                "imagePullPolicy": settings.image_pull_policy,
                                "ports": [{"name": "http", "containerPort": port}],
                                "env": env,
                                "readinessProbe": {
                                    "httpGet": {"path": "/", "port": port},
                                    "periodSeconds": 5,
                                },
                            }
                        ],
                        **_pod_scheduling(spec),
                    },
                    run_as_user=settings.run_as_user,
                    read_only_root=False,
                    token=False,
                ),
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(task_app, name, ROLE_TASK_APP),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": port, "targetPort": port}]},
    }
    return [deployment, service]


def task_app_service_url(task_app: dict[str, Any]) -> str:
    spec = task_app.get("spec") or {}
    meta = task_app["metadata"]
    if spec.get("url"):
        return str(spec["url"]).rstrip("/")
    return service_url(
        child_name(meta["name"], ROLE_TASK_APP), meta["namespace"], int(spec.get("port") or 8000)
    )


def desired_state(child: dict[str, Any]) -> dict[str, Any]:
    """The mutable parts of a child the controller keeps in line (suspend -> replicas 0 / Job suspended)."""
    if child["kind"] == "Deployment":
        return {"replicas": child["spec"]["replicas"]}
    if child["kind"] == "Job":
        return {"suspend": bool(child["spec"]["suspend"])} if "suspend" in child["spec"] else {}
    return {}
