"""Pure: the operator's read of the Secrets of one namespace it serves. Its ClusterRole may create Secrets
but read none: in every opted-in namespace it binds the ClusterRole posttrain-operator-secrets (`get` on
Secrets, nothing else) to its own ServiceAccount with a RoleBinding, made once per namespace and owned by
nobody (controller/namespace_objects.py). It holds `bind` on that one ClusterRole, so RBAC's escalation
check lets it make the binding without holding the read cluster-wide; the reach policy
(manifests/base/operator-policy.yaml) admits that binding only in an opted-in namespace other than the
operator's own, with exactly this roleRef and this one subject. In its own namespace it reads only
posttrain-token-key (Role posttrain-operator-self, by name)."""

from __future__ import annotations

from typing import Any

from posttrain.controller.render.names import ROLE_ACCESS
from posttrain.controller.settings import LABEL_MANAGED_BY, LABEL_ROLE, MANAGER, OperatorSettings

RBAC = "rbac.authorization.k8s.io"
# The ClusterRole (manifests/base/operator-rbac.yaml) and the name of each namespace's binding of it.
SECRETS_ROLE = "posttrain-operator-secrets"


def render_secret_access(namespace: str, settings: OperatorSettings) -> list[dict[str, Any]]:
    """The namespace's RoleBinding posttrain-operator-secrets; none where the install grants the read itself
    (settings.secrets_binding off) or in the operator's own namespace."""
    if not settings.secrets_binding or namespace == settings.operator_namespace:
        return []
    return [
        {
            "apiVersion": f"{RBAC}/v1",
            "kind": "RoleBinding",
            "metadata": {
                "name": SECRETS_ROLE,
                "namespace": namespace,
                "labels": {LABEL_MANAGED_BY: MANAGER, LABEL_ROLE: ROLE_ACCESS},
            },
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": SECRETS_ROLE},
            "subjects": [
                {
                    "kind": "ServiceAccount",
                    "name": settings.operator_service_account,
                    "namespace": settings.operator_namespace,
                }
            ],
        }
    ]
