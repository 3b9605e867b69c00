"""Pure: the trainer's own identity (while settings.per_job_trainer_identity is true): ServiceAccount
<job>-trainer, a Role allowing PATCH on exactly this job's status, and its RoleBinding, all owned by the
job. Otherwise every trainer runs as the shared settings.trainer_service_account."""

from __future__ import annotations

from typing import Any

from posttrain.api.resources import GROUP
from posttrain.controller.objects import Owner
from posttrain.controller.render.names import ROLE_TRAINER, trainer_name
from posttrain.controller.render.pods import child_meta
from posttrain.controller.settings import OperatorSettings

IDENTITY_KINDS = {"ServiceAccount", "Role", "RoleBinding"}
RBAC = "rbac.authorization.k8s.io"


def trainer_service_account(owner: Owner, settings: OperatorSettings) -> str:
    if settings.per_job_trainer_identity:
        return trainer_name(owner.name)
    return settings.trainer_service_account


def render_trainer_identity(owner: Owner, settings: OperatorSettings) -> list[dict[str, Any]]:
    if not settings.per_job_trainer_identity:
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
