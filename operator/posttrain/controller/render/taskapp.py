"""Pure: task apps. Where a job's task app is (spec.taskApp: a URL, or a TaskApp by name: its verified URL,
its own URL, or the Service of its Deployment) and which Secret holds its key; and a TaskApp's children
when it is deployed from an image: a Deployment and a Service <taskapp>-task-app. A task app is someone
else's program: its pods keep a writable root filesystem and mount no ServiceAccount token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from posttrain.api.resources import DEFAULT_API_KEY_SECRET_KEY, RLJobSpec, Scheduling
from posttrain.controller.bounds import truncate
from posttrain.controller.objects import TaskAppObject
from posttrain.controller.render import pods, security
from posttrain.controller.render.names import ROLE_TASK_APP, service_url, task_app_name
from posttrain.controller.settings import OperatorSettings

DISPLAY_URL_MAX = 200


@dataclass(frozen=True)
class TaskAppTarget:
    """Where the task app is and which Secret holds its key."""

    url: str
    secret_name: str | None
    secret_key: str = DEFAULT_API_KEY_SECRET_KEY
    name: str | None = None  # the TaskApp's name when referenced by name

    @property
    def display(self) -> str:
        """For status messages: the URL is cut to keep room for why the task app failed."""
        url = truncate(self.url, DISPLAY_URL_MAX)
        return f"TaskApp {self.name} ({url})" if self.name else f"task app {url}"


def task_app_service_url(app: TaskAppObject) -> str:
    """The URL a TaskApp is reached at: spec.url, else the Service of its Deployment."""
    if app.spec.url:
        return app.spec.url.rstrip("/")
    return service_url(task_app_name(app.owner.name), app.owner.namespace, app.spec.port)


def task_app_target(spec: RLJobSpec, app: TaskAppObject | None = None) -> TaskAppTarget | None:
    """The task app a job talks to; `app` is the TaskApp when spec.taskApp.name names one."""
    ref = spec.task_app
    secret = ref.api_key_secret_ref
    url = ref.url
    if ref.name and app is not None:
        url = app.status.get("url") or app.spec.url or url
        if not url and app.spec.image:
            url = task_app_service_url(app)
        secret = secret or app.spec.api_key_secret_ref
    if not url:
        return None
    return TaskAppTarget(
        url=str(url).rstrip("/"),
        secret_name=secret.name if secret else None,
        secret_key=(secret.key if secret else None) or DEFAULT_API_KEY_SECRET_KEY,
        name=ref.name,
    )


def secrets_of(app: TaskAppObject) -> list[str]:
    """Every Secret a deployed TaskApp's pod would get: its key's, and those its env names."""
    names = [app.spec.api_key_secret_ref.name] if app.spec.api_key_secret_ref is not None else []
    for item in app.spec.env or []:
        ref = item.value_from.secret_key_ref if item.value_from is not None else None
        if ref is not None and ref.name not in names:
            names.append(ref.name)
    return names


def _env(app: TaskAppObject) -> list[dict[str, Any]]:
    env = [e.model_dump(by_alias=True, exclude_none=True) for e in app.spec.env or []]
    secret = app.spec.api_key_secret_ref
    if secret is not None and secret.name:
        ref = {"name": secret.name, "key": secret.key or DEFAULT_API_KEY_SECRET_KEY}
        env.append({"name": DEFAULT_API_KEY_SECRET_KEY, "valueFrom": {"secretKeyRef": ref}})
    return env


def task_app_resources(scheduling: Scheduling | None, settings: OperatorSettings) -> dict[str, Any]:
    """spec.scheduling.resources' requests/limits for every role, the operator's TaskApp defaults for the rest."""
    given = scheduling.resources if scheduling is not None else None
    requests = dict(given.requests or {}) if given is not None else {}
    limits = dict(given.limits or {}) if given is not None else {}
    requests, limits = pods.default_resources(
        requests, limits, settings.task_app_default_requests, settings.task_app_default_limits
    )
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def render_task_app(app: TaskAppObject, settings: OperatorSettings) -> list[dict[str, Any]]:
    """Deployment + Service for a TaskApp with spec.image (nothing for spec.url)."""
    spec, owner = app.spec, app.owner
    if not spec.image:
        return []
    name = task_app_name(owner.name)
    container = {
        "name": ROLE_TASK_APP,
        "image": spec.image,
        "imagePullPolicy": settings.image_pull_policy,
        "ports": [{"name": "http", "containerPort": spec.port}],
        "env": _env(app),
        "readinessProbe": {"httpGet": {"path": "/", "port": spec.port}, "periodSeconds": 5},
        "resources": task_app_resources(spec.scheduling, settings),
    }
    pod = security.lock_down(
        {"containers": [container], **pods.pod_scheduling(spec.scheduling)},
        run_as_user=settings.run_as_user,
        read_only_root=False,
        token=False,
    )
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": pods.child_meta(owner, name, ROLE_TASK_APP),
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": pods.selector(owner, ROLE_TASK_APP)},
            "template": {"metadata": {"labels": pods.labels(owner, ROLE_TASK_APP)}, "spec": pod},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": pods.child_meta(owner, name, ROLE_TASK_APP),
        "spec": {
            "selector": pods.selector(owner, ROLE_TASK_APP),
            "ports": [{"name": "http", "port": spec.port, "targetPort": spec.port}],
        },
    }
    return [deployment, service]
