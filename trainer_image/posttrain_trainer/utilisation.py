"""Where an iteration's wall time went on each side: the idle share of the trainer (the time it waited for
rollouts or for the servers to load its weights) and of the rollout servers (the time none of their requests
ran and no weights loaded, from the busy seconds each server counts: GET /v1/weights, busy_seconds). Each
policy endpoint counts as its replicas (replicas.py, resolved at every read); a replica seen in only one of
two reads (a pod replaced in between) gives no share."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from posttrain_trainer import replicas
from posttrain_trainer.server_auth import rollout_auth_headers


def idle_share(busy_seconds: float, wall_seconds: float) -> float | None:
    """1 - busy / wall, held to [0, 1]; None for an empty interval."""
    if wall_seconds <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - busy_seconds / wall_seconds))


def trainer_busy_seconds(update: dict[str, Any], sync: dict[str, Any]) -> float:
    """The trainer's own work in an iteration: the update, and writing the weights for the servers (the
    rest of a sync is the servers loading them)."""
    return float(update.get("seconds") or 0.0) + float(sync.get("weight_sync_save_seconds") or 0.0)


def servers_idle_share(before: Sequence[float | None], after: Sequence[float | None], wall: float) -> float | None:
    """The servers' mean idle share over an interval of `wall` seconds, from each server's busy seconds at its
    start and end (a server that did not answer either time is left out; None when none answered)."""
    shares = [
        idle_share(b - a, wall)
        for a, b in zip(before, after, strict=True)
        if a is not None and b is not None and b >= a
    ]
    shares = [s for s in shares if s is not None]
    return sum(shares) / len(shares) if shares else None


class ServerClocks:
    """Rank 0: reads each policy server's busy seconds; idle_share() covers the time since the last call."""

    def __init__(
        self, endpoints: Sequence[str], timeout_s: float = 10.0, resolve: replicas.Resolver | None = None
    ):
        self.endpoints = list(endpoints)
        self.timeout_s = timeout_s
        self.resolve = resolve  # replicas.py's resolver (None: socket.getaddrinfo)
        self._last = self.read()

    def read(self) -> tuple[float, dict[str, float | None]]:
        """(monotonic time, busy seconds per replica URL)."""
        import httpx

        out: dict[str, float | None] = {}
        for endpoint in replicas.expand(self.endpoints, self.resolve):  # resolved again at every read
            try:
                r = httpx.get(
                    f"{endpoint.rstrip('/')}/v1/weights", headers=rollout_auth_headers(), timeout=self.timeout_s
                )
                value = r.json().get("busy_seconds") if r.status_code == 200 else None
                out[endpoint] = float(value) if isinstance(value, int | float) else None
            except (httpx.HTTPError, ValueError, AttributeError):
                out[endpoint] = None  # an older server, or one that is restarting: no share from it
        return time.monotonic(), out

    def idle_share(self) -> float | None:
        (t0, before), (t1, after) = self._last, self.read()
        self._last = (t1, after)
        both = [url for url in after if url in before]
        return servers_idle_share([before[u] for u in both], [after[u] for u in both], t1 - t0)
