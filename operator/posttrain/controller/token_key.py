"""The operator's key for the jobs' rollout tokens (render/token.py derives each job's token from it and the
job's uid). It lives in one Secret of the operator's own namespace (settings.token_key_secret), made by the
first operator that starts with a fresh random key and read by every later one, so restarted operators and
replicas derive the same tokens: a job's Secret deleted or made again holds the token its running servers
were started with. Tenants cannot read it (it is in no tenant's namespace). Where the operator may not read
or make that Secret (a namespaced install without a Role there), it uses a key of its own process and says
so: tokens then hold for the life of one operator process (a job's Secret is made again only when it is
missing)."""

from __future__ import annotations

import base64
import logging
import secrets
from pathlib import Path

from posttrain.controller.kube import Kube, KubeError, object_path
from posttrain.controller.settings import LABEL_MANAGED_BY, MANAGER, OperatorSettings

logger = logging.getLogger(__name__)
KEY_FIELD = "key"
KEY_BYTES = 32
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The operator pod's namespace ("" out of a cluster)."""
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip()
    except OSError:
        return ""


def key_namespace(settings: OperatorSettings) -> str:
    """Where the key's Secret is: the setting, else the operator pod's own namespace, else "" (none)."""
    return settings.token_key_namespace or own_namespace()


def _decoded(secret: dict | None) -> bytes | None:
    raw = ((secret or {}).get("data") or {}).get(KEY_FIELD)
    try:
        key = base64.b64decode(raw or "", validate=True)
    except ValueError:
        return None
    return key if len(key) >= KEY_BYTES else None


async def load_token_key(kube: Kube, settings: OperatorSettings) -> bytes:
    namespace, name = key_namespace(settings), settings.token_key_secret
    if not namespace:
        logger.warning("no namespace for the token key Secret (POSTTRAIN_TOKEN_KEY_NAMESPACE): rollout tokens "
                       "hold for this operator process only")  # fmt: skip
        return secrets.token_bytes(KEY_BYTES)
    path = object_path("v1", "Secret", namespace, name)
    try:
        key = _decoded(await kube.get(path))
        if key is not None:
            return key
        fresh = secrets.token_bytes(KEY_BYTES)
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace, "labels": {LABEL_MANAGED_BY: MANAGER}},
            "type": "Opaque",
            "data": {KEY_FIELD: base64.b64encode(fresh).decode()},
        }
        if await kube.create(body):
            return fresh
        key = _decoded(await kube.get(path))  # another replica made it first
        if key is not None:
            return key
        raise KubeError(409, f"Secret {namespace}/{name} holds no usable key")
    except KubeError as err:
        logger.warning("token key Secret %s/%s not usable (HTTP %s): rollout tokens hold for this operator "
                       "process only", namespace, name, err.status)  # fmt: skip
        return secrets.token_bytes(KEY_BYTES)


__all__ = ["load_token_key", "key_namespace", "own_namespace"]
