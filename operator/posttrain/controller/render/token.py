"""Pure: the per-job token that guards the rollout servers' privileged endpoints (POST /v1/weights and the
captures). The operator puts a random token into the RLJob's Secret <job>-config (render/jobfile.py: the
same Secret carries the job file; the only random value the operator writes; created once, never read
back by the operator); the rollout, reference and judge servers and the trainer get it as
POSTTRAIN_ROLLOUT_TOKEN from that Secret. Only the job's trainer can therefore swap the policy's weights
or read its rollouts, also against other posttrain pods of the same namespace, which the namespace's
NetworkPolicy lets in (render/network.py); a task app still calls the open /v1/chat/completions."""

from __future__ import annotations

import base64
import copy
from typing import Any

from posttrain.controller.objects import Owner
from posttrain.controller.render.names import config_name

TOKEN_ENV = "POSTTRAIN_ROLLOUT_TOKEN"
TOKEN_KEY = "token"


def with_token(secret: dict[str, Any], token: str) -> dict[str, Any]:
    """The job's Secret (render/jobfile.py) with the rollout token added under the key `token`."""
    out = copy.deepcopy(secret)
    out["data"][TOKEN_KEY] = base64.b64encode(token.encode()).decode()
    return out


def token_env(owner: Owner) -> list[dict[str, Any]]:
    """POSTTRAIN_ROLLOUT_TOKEN from the job's Secret (servers and trainer alike)."""
    ref = {"name": config_name(owner.name), "key": TOKEN_KEY}
    return [{"name": TOKEN_ENV, "valueFrom": {"secretKeyRef": ref}}]
