"""Task-app resolution: where an RLJob's task app is (a TaskApp by name, from the operator's index, or a
URL), how to check it, and one check of it with the key from its Secret (through the shared check cache).
The TaskApp loop uses the same check and the Secret's task-app label rule. Before a Secret of a namespace is
read, the namespace's own objects are in place (controller/namespace_objects.py): among them the
operator's RoleBinding posttrain-operator-secrets, its only read of that namespace's Secrets
(render/secret_access.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from posttrain.api.resources import LABEL_USE, USE_TASK_APP_KEY
from posttrain.controller.kube import KubeError
from posttrain.controller.objects import Job, TaskAppObject
from posttrain.controller.render.taskapp import TaskAppTarget, task_app_target
from posttrain.controller.runtime import Runtime
from posttrain.controller.taskapp_index import TASKAPP_INDEX, TaskAppView, trusts_the_apps_check
from posttrain.controller.tenancy import reach_refusal
from posttrain.controller.verify import (
    INVALID_SPEC as TASKAPP_INVALID,
)
from posttrain.controller.verify import (
    SECRET_MISSING,
    SECRET_NOT_LABELLED,
    TASKAPP_MISSING,
    Attempt,
    VerifyPolicy,
)

T = TypeVar("T")
# The operator may not read the Secret (403): its RoleBinding in the namespace is missing, or so new that the
# API server's RBAC cache has not seen it yet. Retried, within a read and at the next check.
SECRET_FORBIDDEN = "SecretForbidden"
FORBIDDEN_DELAYS = (0.25, 0.5, 1.0, 2.0)  # seconds between reads refused with 403


class SecretForbidden(Exception):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"the operator may not read Secret {name} of namespace {namespace} (403): its "
                         "RoleBinding posttrain-operator-secrets there is missing or not in force yet; retrying")  # fmt: skip
        self.attempt = Attempt(False, SECRET_FORBIDDEN, str(self))


async def secret_access(rt: Runtime, namespace: str, seen: set[str] | None = None) -> Attempt | None:
    """The namespace's own objects, its Secret read among them, applied before a Secret of it is read
    (`seen`: what the watches hold; without it, applied once per process). None when they are in place;
    the reach policy's refusal (e.g. the namespace has not opted in, controller/tenancy.py) as a failed
    check."""
    try:
        await rt.namespace_objects.ensure(rt.kube, rt.settings, namespace, seen)
    except KubeError as err:
        if (refused := reach_refusal(err, namespace)) is None:
            raise
        return Attempt(False, *refused)
    return None


async def read_secret(namespace: str, name: str, read: Callable[[], Awaitable[T]]) -> T:
    """`read()` of Secret `name`; a 403 is read again a few times (a RoleBinding made a moment ago), then
    raised as SecretForbidden."""
    for delay in (*FORBIDDEN_DELAYS, None):
        try:
            return await read()
        except KubeError as err:
            if err.status != 403:
                raise
            if delay is None:
                raise SecretForbidden(namespace, name) from err
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


def not_labelled(secret: str) -> Attempt:
    return Attempt(False, SECRET_NOT_LABELLED, f"Secret {secret} is not labelled {LABEL_USE}={USE_TASK_APP_KEY}: "
                   "label it to let the operator give its key to the task app")  # fmt: skip


async def unlabelled_secret(rt: Runtime, namespace: str, names: list[str]) -> Attempt | None:
    """The first of these Secrets that exists without the task-app label, as a failed check (from their
    metadata alone): a TaskApp's pod gets no Secret its owner did not mark for task apps."""
    for name in names:
        try:
            labels = await read_secret(namespace, name, lambda n=name: rt.kube.secret_labels(namespace, n))
        except SecretForbidden as forbidden:
            return forbidden.attempt
        if labels is not None and labels.get(LABEL_USE) != USE_TASK_APP_KEY:
            return not_labelled(name)
    return None


async def check_task_app(
    rt: Runtime, namespace: str, url: str, secret_name: str | None, secret_key: str, policy: VerifyPolicy
) -> Attempt:
    """One check of a task app with the key from its Secret, through the shared check cache."""
    key = version = None
    secret = None
    if secret_name:
        if (refused := await secret_access(rt, namespace)) is not None:
            return refused
        try:
            found = await read_secret(namespace, secret_name, lambda: rt.secret_key(namespace, secret_name, secret_key))
        except SecretForbidden as forbidden:
            return forbidden.attempt
        if found.labels is not None and found.labels.get(LABEL_USE) != USE_TASK_APP_KEY:
            return not_labelled(secret_name)  # its data was never read: it never leaves the cluster
        if found.value is None:
            return Attempt(False, SECRET_MISSING, f"Secret {secret_name} (key {secret_key}) not found")
        key, version, secret = found.value, found.version, (namespace, secret_name, secret_key)
    ttl = min(rt.settings.verify_cache_seconds, policy.period_seconds)
    return await rt.check_task_app(
        url,
        key,
        namespace=namespace,
        secret=secret,
        secret_version=version,
        deadline=policy.request_timeout,
        ttl=ttl,
        failure_ttl=min(ttl, policy.backoff_initial),
    )


@dataclass(frozen=True)
class Resolved:
    """An RLJob's task app: where it is (None when it cannot be found: `problem` says why), how to check
    it, and how status messages name it."""

    target: TaskAppTarget | None
    policy: VerifyPolicy
    display: str
    problem: Attempt | None = None
    trusted: bool = False  # a TaskApp the operator has verified itself: its jobs need no check of their own


def indexed_task_app(indexes: dict[str, Any], namespace: str, name: str) -> TaskAppView | None:
    """A TaskApp as the operator's index holds it (controller/handlers_taskapp.py); None when absent."""
    index = indexes.get(TASKAPP_INDEX)
    if index is None or (namespace, name) not in index:
        return None
    return next(iter(index[namespace, name]), None)


async def resolve_task_app(rt: Runtime, job: Job, indexes: dict[str, Any]) -> Resolved:
    ref = job.rl.task_app
    policy = VerifyPolicy.from_settings(rt.settings)
    app: TaskAppObject | None = None
    if ref.name:
        display = f"TaskApp {ref.name}"
        view = indexed_task_app(indexes, job.owner.namespace, ref.name)
        if view is None:
            return Resolved(None, policy, display, Attempt(False, TASKAPP_MISSING, f"{display} not found"))
        if view.app is None:
            return Resolved(None, policy, display, Attempt(False, TASKAPP_INVALID, f"{display}: {view.error}"))
        app = view.app
        policy = VerifyPolicy.from_settings(rt.settings, app.spec.verification)
    target = task_app_target(job.rl, app)
    if target is None:
        display = f"TaskApp {ref.name}" if ref.name else "task app"
        return Resolved(
            None, policy, display, Attempt(False, TASKAPP_MISSING, "no task app URL (spec.taskApp)")
        )
    return Resolved(target, policy, target.display, trusted=app is not None and trusts_the_apps_check(target, app))


async def check_job_task_app(rt: Runtime, job: Job, policy: VerifyPolicy, indexes: dict[str, Any]) -> Attempt:
    resolved = await resolve_task_app(rt, job, indexes)
    if resolved.target is None:
        return resolved.problem or Attempt(False, TASKAPP_MISSING, "no task app")
    target = resolved.target
    return await check_task_app(rt, job.owner.namespace, target.url, target.secret_name, target.secret_key, policy)
