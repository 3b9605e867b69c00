"""Pure: a job's trainer, an Indexed Job of `nodes` pods (one per node, completions = parallelism = nodes)
running torchrun, and, when there is more than one pod, the headless Service that gives pod 0 the stable
DNS name torchrun's rendezvous needs (<job>-trainer-0.<job>-trainer.<namespace>.svc). A single pod is its
own rendezvous (127.0.0.1): no other pod ever looks it up.

Each pod mounts the job file and the TOML from the job's Secret (at /etc/posttrain/job.json; the Secret's
rollout token is not among the files: the trainer gets it in its environment), a /workspace emptyDir and
a memory-backed /dev/shm.
Before the trainer starts, init containers re-verify the task app (RLJob) and wait for every server's
/health. The trainer is the only pod that mounts a ServiceAccount token: it patches its job's status."""

from __future__ import annotations

from typing import Any

from posttrain.api import trackers
from posttrain.api.topology import Topology
from posttrain.controller.objects import Job
from posttrain.controller.render import pods, security, token
from posttrain.controller.render.identity import trainer_service_account
from posttrain.controller.render.names import ROLE_TRAINER, config_name, trainer_name
from posttrain.controller.render.taskapp import TaskAppTarget
from posttrain.controller.render.trainer_policy import failure_handling
from posttrain.controller.settings import COMPLETION_INDEX_ANNOTATION, OperatorSettings

CONFIG_MOUNT = "/etc/posttrain"
JOBFILE_KEY = "job.json"  # keys of the job's Secret (render/jobfile.py), and file names under CONFIG_MOUNT
TOML_KEY = "config.toml"
JOBFILE_PATH = f"{CONFIG_MOUNT}/{JOBFILE_KEY}"
DATA_MOUNT = "/data"
WORKDIR = "/workspace"
LOOPBACK = "127.0.0.1"
TASK_APP_KEY_ENV = "ENVIRONMENT_API_KEY"
# The operator's settings the init container's task-app check needs (posttrain.controller.verify.policy_from_env)
ADDRESS_SETTINGS_ENV = {
    "POSTTRAIN_TASK_APP_ALLOWED_NETWORKS": "task_app_allowed_networks",
    "POSTTRAIN_TASK_APP_DENIED_NETWORKS": "task_app_denied_networks",
    "POSTTRAIN_API_SERVER_ADDRESSES": "api_server_addresses",
}


def torchrun_env(job: Job, settings: OperatorSettings, topo: Topology) -> list[dict[str, Any]]:
    """torchrun's rendezvous: node count and rank (the pod's completion index), pod 0 as the master."""
    name = trainer_name(job.owner.name)
    master = f"{name}-0.{name}.{job.owner.namespace}.svc" if topo.nodes > 1 else LOOPBACK
    port = str(settings.master_port)
    rank = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
    return [
        {"name": "PET_NNODES", "value": str(topo.nodes)},
        {"name": "PET_NPROC_PER_NODE", "value": str(topo.nproc_per_node)},
        {"name": "PET_NODE_RANK", "valueFrom": rank},
        {"name": "MASTER_ADDR", "value": master},
        {"name": "MASTER_PORT", "value": port},
        {"name": "PET_MASTER_ADDR", "value": master},
        {"name": "PET_MASTER_PORT", "value": port},
        {"name": "POSTTRAIN_JOBFILE", "value": JOBFILE_PATH},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
    ]


def task_app_key_env(task_app: TaskAppTarget | None) -> list[dict[str, Any]]:
    if task_app is None or not task_app.secret_name:
        return []
    ref = {"name": task_app.secret_name, "key": task_app.secret_key}
    return [{"name": TASK_APP_KEY_ENV, "valueFrom": {"secretKeyRef": ref}}]


def shutdown_timeout_env(settings: OperatorSettings) -> dict[str, Any]:
    """How long torchrun waits for its workers after SIGTERM (they checkpoint first: posttrain_trainer/
    preemption.py): the pod's grace period less a margin, so the launcher still exits 75 itself."""
    grace = settings.trainer_termination_grace_seconds
    return {"name": "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "value": str(max(5, grace - max(5, grace // 10)))}


def trainer_command(kind: str) -> list[str]:
    # torchrun, run in process by a launcher that turns a worker's configuration-error exit code into the
    # pod's exit code (torchrun alone exits 1 for every worker failure)
    return [
        "python", "-m", "posttrain_trainer.launch",
        "--nnodes=$(PET_NNODES)", "--nproc-per-node=$(PET_NPROC_PER_NODE)", "--node-rank=$(PET_NODE_RANK)",
        "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)",
        "-m", "posttrain_trainer", kind, "--config", JOBFILE_PATH,
    ]  # fmt: skip


def wait_script(urls: list[str], timeout: int) -> str:
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


def verify_task_app_command(task_app: TaskAppTarget, settings: OperatorSettings) -> list[str]:
    """The operator's own check (posttrain.controller.verify), from the trainer pod: one deadline per
    attempt, retried with backoff for as long as the operator would, fixed messages only. No shell: the
    URL is one argument."""
    return ["posttrain", "verify-task-app", "--in-cluster",
            "--retry-for", f"{max(1.0, settings.verify_timeout_seconds):g}",
            "--timeout", f"{min(max(settings.verify_request_timeout, 1.0), 60.0):g}",
            "--", task_app.url]  # fmt: skip


def verify_task_app_env(task_app: TaskAppTarget, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The task app's key (from the same Secret) and the address rules of the operator's settings."""
    rules = [{"name": env, "value": str(getattr(settings, name))}
             for env, name in ADDRESS_SETTINGS_ENV.items() if getattr(settings, name)]  # fmt: skip
    return [*task_app_key_env(task_app), *rules]


def init_containers(
    image: str, settings: OperatorSettings, task_app: TaskAppTarget | None, wait_for: list[str]
) -> list[dict[str, Any]]:
    """Re-verify the task app (its key from the same Secret), then wait for the servers."""
    pull = settings.image_pull_policy
    init: list[dict[str, Any]] = []
    if task_app is not None:
        init.append({"name": "verify-task-app", "image": image, "imagePullPolicy": pull,
                     "command": verify_task_app_command(task_app, settings),
                     "env": verify_task_app_env(task_app, settings)})  # fmt: skip
    if wait_for:
        command = ["python", "-c", wait_script(wait_for, settings.readiness_timeout_seconds)]
        init.append({"name": "wait-for-servers", "image": image, "imagePullPolicy": pull, "command": command})
    return init


def volumes(
    job: Job, settings: OperatorSettings, dataset_volume: dict[str, Any] | None
) -> tuple[list[dict], list[dict]]:
    """(volumes, the trainer's mounts): the job file from the job's Secret, /workspace, a memory-backed
    /dev/shm, and a dataset ConfigMap."""
    shm_volume, shm_mount = pods.shm(settings)
    files = [{"key": key, "path": key} for key in (JOBFILE_KEY, TOML_KEY)]
    vols: list[dict[str, Any]] = [
        {"name": "config", "secret": {"secretName": config_name(job.owner.name), "items": files}},
        {"name": "workspace", "emptyDir": {}},
        shm_volume,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        {"name": "workspace", "mountPath": WORKDIR},
        shm_mount,
    ]
    if dataset_volume:
        vols.append({"name": "data", "configMap": dataset_volume})
        mounts.append({"name": "data", "mountPath": DATA_MOUNT, "readOnly": True})
    return vols, mounts


def tracker_env(job: Job, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The settings of the experiment trackers the job's report_to names (mlflow, wandb), each an optional
    key of the namespace's tracker Secret: read by the kubelet into the trainer, never by the operator."""
    named = trackers.normalize(getattr(getattr(job.spec, "training", None), "report_to", None)) or []
    ref = {"name": settings.tracker_secret_name, "optional": True}
    return [{"name": key, "valueFrom": {"secretKeyRef": {**ref, "key": key}}}
            for name in named for key in trackers.ENV_KEYS.get(name, ())]  # fmt: skip


def metrics_port(settings: OperatorSettings) -> list[dict[str, Any]]:
    """Rank 0's Prometheus port (the other ranks listen on nothing there); PodMonitors select it by name."""
    return [{"name": "metrics", "containerPort": settings.trainer_metrics_port}] if settings.trainer_metrics_port else []


def trainer_pod(
    job: Job,
    settings: OperatorSettings,
    topo: Topology,
    *,
    task_app: TaskAppTarget | None,
    wait_for: list[str],
    judge_env: list[dict[str, Any]],
    dataset_volume: dict[str, Any] | None,
) -> dict[str, Any]:
    spec = job.spec
    image = pods.image(spec, ROLE_TRAINER, settings)
    env = torchrun_env(job, settings, topo)
    if job.is_rl:
        env += token.token_env(job.owner)
    env += task_app_key_env(task_app) + pods.s3_env(spec, settings) + judge_env + pods.plain_env(settings)
    env += tracker_env(job, settings)
    if settings.trainer_metrics_port:
        env.append({"name": "POSTTRAIN_METRICS_PORT", "value": str(settings.trainer_metrics_port)})
    env.append(shutdown_timeout_env(settings))
    vols, mounts = volumes(job, settings, dataset_volume)
    container = {
        "name": ROLE_TRAINER,
        "image": image,
        "imagePullPolicy": settings.image_pull_policy,
        "command": trainer_command(job.trainer_kind),
        "env": env,
        "ports": [{"name": "rendezvous", "containerPort": settings.master_port}, *metrics_port(settings)],
        "resources": pods.resources(spec, ROLE_TRAINER, topo.gpus(topo.trainer_gpus_per_pod), settings),
        "volumeMounts": mounts,
        "workingDir": WORKDIR,
    }
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.trainer_termination_grace_seconds,
    }
    if topo.nodes > 1:
        pod["subdomain"] = trainer_name(job.owner.name)  # pod 0's DNS name under the headless Service
    pod["serviceAccountName"] = trainer_service_account(job.owner, settings)
    init = init_containers(image, settings, task_app, wait_for)
    if init:
        pod["initContainers"] = init
    gpus = topo.gpus(topo.trainer_gpus_per_pod)
    pod.update(containers=[container], volumes=vols, **pods.pod_scheduling(spec.scheduling),
               **pods.gpu_placement(spec, gpus, settings))  # fmt: skip
    return security.lock_down(pod, run_as_user=settings.run_as_user, read_only_root=True, token=True)


def trainer_job(job: Job, settings: OperatorSettings, topo: Topology, pod: dict[str, Any]) -> dict[str, Any]:
    spec, owner = job.spec, job.owner
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": topo.nodes,
        "parallelism": topo.nodes,
        **failure_handling(ROLE_TRAINER, retries=settings.trainer_retries, nodes=topo.nodes),
        "suspend": bool(spec.suspend),
        # No Kueue queue label: a job in a queue is admitted whole through its Workload (render/workload.py),
        # and held suspended until then.
        "template": {"metadata": {"labels": pods.labels(owner, ROLE_TRAINER)}, "spec": pod},
    }
    if spec.active_deadline_seconds:
        job_spec["activeDeadlineSeconds"] = int(spec.active_deadline_seconds)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": pods.child_meta(owner, trainer_name(owner.name), ROLE_TRAINER),
        "spec": job_spec,
    }


def trainer_service(job: Job, settings: OperatorSettings) -> dict[str, Any]:
    port = settings.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.child_meta(job.owner, trainer_name(job.owner.name), ROLE_TRAINER),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": pods.selector(job.owner, ROLE_TRAINER),
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port}],
        },
    }


def render_trainer(
    job: Job,
    settings: OperatorSettings,
    topo: Topology,
    *,
    task_app: TaskAppTarget | None = None,
    wait_for: list[str] | None = None,
    judge_env: list[dict[str, Any]] | None = None,
    dataset_volume: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """[headless Service, Indexed Job], or [Indexed Job] for a single pod."""
    pod = trainer_pod(job, settings, topo, task_app=task_app, wait_for=wait_for or [],
                      judge_env=judge_env or [], dataset_volume=dataset_volume)  # fmt: skip
    rendezvous = [trainer_service(job, settings)] if topo.nodes > 1 else []
    return [*rendezvous, trainer_job(job, settings, topo, pod)]
