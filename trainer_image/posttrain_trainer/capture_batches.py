"""Taking finished rollouts' captures from the policy servers in batches.

A rollout server keeps, per cid, the exact tokens and log-probabilities of every policy call made under it
(posttrain_rollout.captures). Taking them one cid at a time cost two or three requests per episode, and with
a hundred rollouts in flight httpx's connection-pool bookkeeping grew with requests x connections: in the
demo's profile it took more of the trainer's CPU than the task app took for its episodes, on cores vLLM
needs. Here finished rollouts queue their cids, and one POST /v1/captures per server takes up to `batch` of
them at once (and so removes them, failed rollouts' included). Flushing at `batch` bounds how many
untaken cids sit in a server's store, which keeps its own bound (10,000 cids) out of reach.

A server without the batch route (an older rollout image; 404 or 405) is asked per cid, GET ?pop=true."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from posttrain_trainer.server_auth import rollout_auth_headers

DEFAULT_BATCH = 512
_UNSUPPORTED = (404, 405)


class CaptureError(RuntimeError):
    """No capture could be had for a cid: the server answered none, refused the call, or was unreachable."""


@dataclass
class Taken:
    entries: list[dict[str, Any]] | None = None
    error: str | None = None  # why there are none (our words, and the server's bounded refusal reason)


def capture_url(endpoint: str, cid: str | None = None) -> str:
    base = f"{endpoint.rstrip('/')}/v1/captures"
    return base if cid is None else f"{base}/{cid}"


def refusal_text(refused: Any) -> str | None:
    """The rollout server's account of policy calls vLLM refused under a cid (its own words), if any."""
    try:
        return f"vLLM refused {int(refused['refused'])} policy call(s): {str(refused['reason'])[:300]}"
    except (KeyError, TypeError, ValueError):
        return None


def missing_text(cid: str, refused: Any = None) -> str:
    why = refusal_text(refused)
    if why:
        return f"rollout server has no capture for cid {cid}: {why}"
    return f"rollout server has no capture for cid {cid} (did the task app keep ?cid=?)"


class CaptureBatches:
    """`await add(spec)` as each rollout finishes (ok or not), `await flush()` after the last, then
    `taken(spec)` per rollout. Concurrent adds are safe: a flush swaps the queue out before it awaits."""

    def __init__(self, http: Any, *, batch: int = DEFAULT_BATCH, retries: int = 1):
        self.http = http
        self.batch = max(1, batch)
        self.retries = retries
        self._queued: dict[str, list[str]] = defaultdict(list)  # endpoint -> cids
        self._taken: dict[str, Taken] = {}
        self._batch_route: dict[str, bool] = {}  # endpoint -> whether it has POST /v1/captures
        self.requests = 0

    async def add(self, endpoint: str, cid: str) -> None:
        queue = self._queued[endpoint]
        queue.append(cid)
        if len(queue) >= self.batch:
            await self._flush_endpoint(endpoint)

    async def flush(self) -> None:
        await asyncio.gather(*(self._flush_endpoint(e) for e in list(self._queued)))

    def taken(self, cid: str) -> Taken:
        return self._taken.get(cid) or Taken(error=f"the captures of cid {cid} were never asked for")

    async def _flush_endpoint(self, endpoint: str) -> None:
        cids, self._queued[endpoint] = self._queued[endpoint], []
        if not cids:
            return
        if self._batch_route.get(endpoint, True):
            try:
                taken = await self._take_batch(endpoint, cids)
            except _NoBatchRoute:
                self._batch_route[endpoint] = False
            except Exception as err:  # noqa: BLE001 - every rollout of the batch fails with the reason
                reason = f"taking captures from {endpoint}: {type(err).__name__}: {err}"
                self._taken.update({cid: Taken(error=reason) for cid in cids})
                return
            else:
                self._taken.update(taken)
                return
        results = await asyncio.gather(*(self._take_one(endpoint, cid) for cid in cids))
        self._taken.update(zip(cids, results, strict=True))

    async def _take_batch(self, endpoint: str, cids: list[str]) -> dict[str, Taken]:
        import httpx

        response = None
        for attempt in range(self.retries + 1):
            try:
                self.requests += 1
                response = await self.http.post(
                    capture_url(endpoint), json={"cids": cids}, headers=rollout_auth_headers()
                )
                break
            except httpx.TransportError:
                if attempt == self.retries:
                    raise
                await asyncio.sleep(0.5 * (attempt + 1))
        assert response is not None
        if response.status_code in _UNSUPPORTED:
            raise _NoBatchRoute
        response.raise_for_status()
        data = response.json()
        captures = data.get("captures") if isinstance(data, dict) else None
        refusals = (data.get("refusals") if isinstance(data, dict) else None) or {}
        if not isinstance(captures, dict) or not isinstance(refusals, dict):
            raise CaptureError("POST /v1/captures answered no {captures: {...}} object")
        out = {}
        for cid in cids:
            entries = captures.get(cid)
            if isinstance(entries, list):
                out[cid] = Taken(entries=entries)
            else:
                out[cid] = Taken(error=missing_text(cid, refusals.get(cid)))
        return out

    async def _take_one(self, endpoint: str, cid: str) -> Taken:
        try:
            return Taken(entries=await take_one(self.http, endpoint, cid))
        except Exception as err:  # noqa: BLE001 - this rollout fails with the reason
            return Taken(error=str(err) if isinstance(err, CaptureError) else f"{type(err).__name__}: {err}")


async def take_one(http: Any, endpoint: str, cid: str) -> list[dict[str, Any]]:
    """One cid's captures, removed from the server as they are read (GET ?pop=true). Raises CaptureError
    when it has none, httpx.HTTPStatusError on any other refusal (401 without the job's token)."""
    response = await http.get(
        capture_url(endpoint, cid), params={"pop": "true"}, headers=rollout_auth_headers()
    )
    if response.status_code == 404:
        refused = None
        with contextlib.suppress(ValueError, KeyError, TypeError):
            refused = response.json()["error"]["refused"]
        raise CaptureError(missing_text(cid, refused))
    response.raise_for_status()
    data = response.json()
    if isinstance(data, dict):  # tolerate {"captures": [...]}
        data = data.get("captures") or []
    return list(data)


class _NoBatchRoute(Exception):
    pass
