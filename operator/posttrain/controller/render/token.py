"""Pure: the per-job token that guards the rollout servers' privileged endpoints (POST /v1/weights and the
captures). The operator makes one Secret per RLJob with a random token (the only random value it writes;
created once, never read back by the operator), owned by the job; the rollout, reference and judge
servers and the trainer get it as POSTTRAIN_ROLLOUT_TOKEN from that Secret. Only the job's trainer can
therefore swap the policy's weights or read its rollouts; a task app still calls the open
/v1/chat/completions."""

from __future__ import annotations

import base64
from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render.names import ROLE_TOKEN, token_secret_name
from posttrain.controller.render.pods import child_meta

TOKEN_ENV = "POSTTRAIN_ROLLOUT_TOKEN"
TOKEN_KEY = "token"


def render_token_secret(owner: Owner, token: str) -> dict[str, Any]:
    """The RLJob's rollout token Secret, owned by the job, holding `token`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": child_meta(owner, token_secret_name(owner.name), ROLE_TOKEN),
        "data": {TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def token_env(owner: Owner) -> list[dict[str, Any]]:
    """POSTTRAIN_ROLLOUT_TOKEN from the job's token Secret (servers and trainer alike)."""
    ref = {"name": token_secret_name(owner.name), "key": TOKEN_KEY}
    return [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}]
