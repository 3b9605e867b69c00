"""Pure: the identity trainer pods patch their job's status with (settings.trainer_identity).

namespace: one ServiceAccount (settings.trainer_service_account) per namespace, a Role allowing PATCH on
  rljobs/status and sftjobs/status, and its RoleBinding, made once per namespace and owned by nobody (they
  serve every job of the namespace). The ValidatingAdmissionPolicy of manifests/base/trainer-policy.yaml
  lets a request through only from a pod of the job it patches.
job: ServiceAccount <job>-trainer, a Role allowing PATCH on exactly this job's status, and its RoleBinding,
  all owned by the job.
static: the shared settings.trainer_service_account, bound by whoever installed posttrain."""

from __future__ import annotations

from typing import Any

from posttrain.api.resources import GROUP
from posttrain.controller.objects import Owner
from posttrain.controller.render.names import ROLE_TRAINER, trainer_name
from posttrain.controller.render.pods import child_meta
from posttrain.controller.settings import LABEL_MANAGED_BY, LABEL_ROLE, MANAGER, OperatorSettings

IDENTITY_KINDS = {"ServiceAccount", "Role", "RoleBinding"}
RBAC = "rbac.authorization.k8s.io"
# The namespace's Role and RoleBinding (the name posttrain-trainer is the static ClusterRole's and
# posttrain-system's RoleBinding of it, manifests/base/trainer-rbac.yaml).
NAMESPACE_ROLE = "posttrain-trainer-status"
# The ValidatingAdmissionPolicy (and its binding) that confines the namespace identity to its own job.
TRAINER_POLICY = "posttrain-trainer-own-job"
# The ServiceAccount name that policy matches.
POLICY_SERVICE_ACCOUNT = "posttrain-trainer"


def trainer_service_account(owner: Owner, settings: OperatorSettings) -> str:
    if settings.trainer_identity == "job":
        return trainer_name(owner.name)
    return settings.trainer_service_account


def render_trainer_identity(owner: Owner, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The per-job identity (children of the job); nothing in the other modes."""
    if settings.trainer_identity != "job":
        return []
    name = trainer_name(owner.name)
    meta = child_meta(owner, name, ROLE_TRAINER)
    rule = {"apiGroups": [GROUP], "resources": [f"{owner.plural}/status"], "resourceNames": [owner.name],
            "verbs": ["patch"]}  # fmt: skip
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta, "rules": [rule]},
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": owner.namespace}],
        },
    ]


def render_namespace_identity(namespace: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The namespace's trainer identity (mode `namespace`): labelled as the operator's, without the job
    label (the children's watches never see them) and without an owner (no job outlives the others)."""
    account = settings.trainer_service_account
    labels = {LABEL_MANAGED_BY: MANAGER, LABEL_ROLE: ROLE_TRAINER}
    rule = {"apiGroups": [GROUP], "resources": ["rljobs/status", "sftjobs/status"], "verbs": ["patch"]}

    def meta(name: str) -> dict[str, Any]:
        return {"name": name, "namespace": namespace, "labels": dict(labels)}

    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(account)},
        {"apiVersion": f"{RBAC}/v1", "kind": "Role", "metadata": meta(NAMESPACE_ROLE), "rules": [rule]},
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "RoleBinding",
            "metadata": meta(NAMESPACE_ROLE),
            "roleRef": {"apiGroup": RBAC, "kind": "Role", "name": NAMESPACE_ROLE},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
        },
    ]
