"""Pure: the per-job token that guards the rollout servers' privileged endpoints (POST /v1/weights and the
captures). The operator puts the token into the RLJob's Secret <job>-config (render/jobfile.py: the same
Secret carries the job file; created once, never read back by the operator); the rollout, reference and
judge servers and the trainer get it as POSTTRAIN_ROLLOUT_TOKEN from that Secret. The token is derived, not
drawn: an HMAC of the job's namespace, kind, name and uid under the operator's key (controller/token_key.py),
so a Secret deleted or made again while the job runs holds the very token its running servers started
with, and a trainer made again still matches them. Only the job's trainer can therefore swap the policy's weights
or read its rollouts, also against other posttrain pods of the same namespace, which the namespace's
NetworkPolicy lets in (render/network.py); a task app still calls the open /v1/chat/completions."""

from __future__ import annotations

import base64
import copy
import hashlib
import hmac
from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render.names import config_name

TOKEN_ENV = "POSTTRAIN_ROLLOUT_TOKEN"
TOKEN_KEY = "token"


def derived_token(key: bytes, owner: Owner) -> str:
    """The job's rollout token: HMAC-SHA256 of the job's identity (its uid: a job made again under the same
    name gets another token) under the operator's key, URL-safe base64 (43 characters)."""
    message = f"posttrain rollout token\n{owner.namespace}\n{owner.kind}\n{owner.name}\n{owner.uid}".encode()
    digest = hmac.new(key, message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def with_token(secret: dict[str, Any], token: str) -> dict[str, Any]:
    """The job's Secret (render/jobfile.py) with the rollout token added under the key `token`."""
    out = copy.deepcopy(secret)
    out["data"][TOKEN_KEY] = base64.b64encode(token.encode()).decode()
    return out


def token_env(owner: Owner) -> list[dict[str, Any]]:
    """POSTTRAIN_ROLLOUT_TOKEN from the job's Secret (servers and trainer alike)."""
    ref = {"name": config_name(owner.name), "key": TOKEN_KEY}
    return [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}]
