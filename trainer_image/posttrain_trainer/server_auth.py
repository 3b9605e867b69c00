"""The token the rollout servers demand on their privileged endpoints (POST /v1/weights, the captures). The
operator (a per-job Secret) and the local runner put it in POSTTRAIN_ROLLOUT_TOKEN for the servers and
the trainer; without it the servers run open (a bare `posttrain_rollout serve` on a laptop)."""

from __future__ import annotations

import os

TOKEN_ENV = "POSTTRAIN_ROLLOUT_TOKEN"


def rollout_auth_headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token else {}
