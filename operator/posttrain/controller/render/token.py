"""Pure: the per-job token that guards the rollout servers' privileged endpoints (POST /v1/weights and the
captures). The operator makes one Secret per RLJob with a random token (the only random value it writes;
created once, never read back by the operator), owned by the job; the rollout, reference and judge
servers and the trainer get it as POSTTRAIN_ROLLOUT_TOKEN from that Secret. Only the job's trainer can
therefore swap the policy's weights or read its rollouts; a task app still calls the open
/v1/chat/completions."""

from __future__ import annotations

import base64
from typing import Any

TOKEN_ENV = "POSTTRAIN_ROLLOUT_TOKEN"
TOKEN_KEY = "token"


def render_token_secret(metadata: dict[str, Any], token: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata,
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_env(secret_name: str) -> list[dict[str, Any]]:
    return [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": {"name": secret_name, "key": TOKEN_KEY}}}]
