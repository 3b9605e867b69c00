"""The operator's Secret read per namespace (controller/render/secret_access.py): its RoleBinding is one of
the namespace's own objects, made before a task app's key is read there, and a 403 right after it is made
(the API server's RBAC cache) is read again, then a retryable check, never a failed verification. Proven
on the real API server by tests/integration/test_operator_reach.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from posttrain.api.resources import LABEL_USE, USE_TASK_APP_KEY
from posttrain.controller import taskapp_resolve
from posttrain.controller.kube import KubeError
from posttrain.controller.namespace_objects import render_namespace_objects
from posttrain.controller.render.secret_access import SECRETS_ROLE, render_secret_access
from posttrain.controller.runtime import Runtime
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.taskapp_resolve import SECRET_FORBIDDEN, check_task_app, unlabelled_secret
from posttrain.controller.tenancy import NOT_ENABLED
from posttrain.controller.verify import Attempt, VerifyPolicy

SETTINGS = OperatorSettings()
REFUSED = (
    "validatingadmissionpolicy 'posttrain-operator-reach' with binding 'posttrain-operator-reach' denied "
    "request: namespace team-b has not opted in to posttrain: a cluster admin labels it ..."
)


def test_the_binding_names_exactly_the_secret_role_and_the_operators_own_account() -> None:
    (binding,) = render_secret_access("team-a", SETTINGS)
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["name"] == SECRETS_ROLE == "posttrain-operator-secrets"
    assert binding["metadata"]["namespace"] == "team-a" and "ownerReferences" not in binding["metadata"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SECRETS_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "posttrain-operator", "namespace": "posttrain-system"}]
    # first of the namespace's objects: a task app's key is read right after
    assert render_namespace_objects("team-a", SETTINGS)[0] == binding
    other = OperatorSettings(operator_namespace="ops", operator_service_account="op")
    assert render_secret_access("team-a", other)[0]["subjects"] == [{"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]


def test_no_binding_in_the_operators_own_namespace_nor_where_the_install_grants_the_read() -> None:
    assert render_secret_access("posttrain-system", SETTINGS) == []
    assert render_secret_access("team-a", OperatorSettings(secrets_binding=False)) == []
    kinds = {(o["kind"], o["metadata"]["name"]) for o in render_namespace_objects("posttrain-system", SETTINGS)}
    assert ("RoleBinding", SECRETS_ROLE) not in kinds


class SecretKube:
    """Applies are recorded; a Secret's GETs answer 403 `forbidden` times first (RBAC has not seen the
    binding yet), or always once `refuse_apply` refuses the binding (the reach policy)."""

    def __init__(self, forbidden: int = 0, refuse_apply: bool = False) -> None:
        self.forbidden, self.refuse_apply = forbidden, refuse_apply
        self.log: list[str] = []

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.log.append(f"apply {obj['kind']}/{obj['metadata']['name']}")
        if self.refuse_apply:
            raise KubeError(403, "denied", api_message=REFUSED)
        return {}

    def _read(self, what: str) -> None:
        self.log.append(what)
        if self.forbidden:
            self.forbidden -= 1
            raise KubeError(403, "secrets is forbidden")

    async def secret_labels(self, namespace: str, name: str) -> dict[str, str] | None:
        self._read(f"labels {name}")
        return {LABEL_USE: USE_TASK_APP_KEY}

    async def read_secret_key(self, namespace: str, name: str, key: str) -> tuple[str, str, dict[str, str]]:
        self._read(f"read {name}")
        return "sk-1", "7", {LABEL_USE: USE_TASK_APP_KEY}


def runtime(kube: SecretKube) -> tuple[Runtime, list[str | None]]:
    rt = Runtime(settings=SETTINGS, kube=kube)  # type: ignore[arg-type]
    keys: list[str | None] = []

    async def probe(url: str, api_key: str | None, **_: Any) -> Attempt:
        keys.append(api_key)
        return Attempt(True, "Verified", "ok")

    rt.check_task_app = probe  # type: ignore[method-assign]
    return rt, keys


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(taskapp_resolve, "FORBIDDEN_DELAYS", (0.0, 0.0, 0.0))


def check(rt: Runtime, namespace: str = "team-a") -> Attempt:
    policy = VerifyPolicy.from_settings(SETTINGS)
    return asyncio.run(check_task_app(rt, namespace, "http://math:8000", "task-key", "ENVIRONMENT_API_KEY", policy))


def test_the_binding_is_made_before_the_key_is_read_and_a_403_just_after_is_read_again() -> None:
    kube = SecretKube(forbidden=2)
    rt, keys = runtime(kube)
    assert check(rt).ok and keys == ["sk-1"]
    assert kube.log[0] == f"apply RoleBinding/{SECRETS_ROLE}"
    reads = [line for line in kube.log if not line.startswith("apply")]
    assert reads == ["labels task-key"] * 3 + ["read task-key"]
    # once per namespace: the next check applies nothing
    before = len(kube.log)
    rt._secret_cache.clear()
    assert check(rt).ok and not [line for line in kube.log[before:] if line.startswith("apply")]


def test_a_403_that_lasts_is_a_retryable_check_naming_the_binding_not_a_failure() -> None:
    rt, keys = runtime(SecretKube(forbidden=100))
    got = check(rt)
    assert not got.ok and got.reason == SECRET_FORBIDDEN and got.retryable
    assert SECRETS_ROLE in got.message and "task-key" in got.message and not keys
    # the metadata-only read of a deployed TaskApp's Secrets says the same
    got = asyncio.run(unlabelled_secret(rt, "team-a", ["task-key"]))
    assert got is not None and got.reason == SECRET_FORBIDDEN


def test_a_namespace_that_has_not_opted_in_says_so_and_no_secret_is_read() -> None:
    kube = SecretKube(refuse_apply=True)
    rt, keys = runtime(kube)
    got = check(rt, "team-b")
    assert not got.ok and got.reason == NOT_ENABLED and "posttrain.dev/tenant=enabled" in got.message
    assert all(line.startswith("apply") for line in kube.log) and not keys
