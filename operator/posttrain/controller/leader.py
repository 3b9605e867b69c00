"""Only one operator acts: a coordination.k8s.io Lease (settings.leader_election). A process waits until it
holds the Lease before it starts anything (kopf's watches, the children's watches, the jobs' loops), renews
it every lease_seconds / 3, and stops (the process exits non-zero, its Deployment starts it again as a
standby) as soon as it cannot renew it in time or finds another holder: two replicas never both act, and a
standby takes over lease_seconds after the holder died. kopf's peering pauses kopf's own handlers only,
not the loops the operator runs itself, and lets peers of equal priority both act, so it is not enough.

Expiry is judged as client-go does: by how long the Lease went unchanged on this process's own clock, never
by comparing another machine's timestamps with ours."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from posttrain.controller.kube import Kube, KubeError

logger = logging.getLogger(__name__)


def identity() -> str:
    """This process: the pod's name (the hostname in a pod) and a random suffix (a restart is a new holder)."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    def __init__(self, kube: Kube, namespace: str, name: str, *, lease_seconds: float = 15.0,
                 holder: str | None = None) -> None:  # fmt: skip
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        self.collection = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.name = namespace, name
        self.lease_seconds = max(2.0, lease_seconds)
        self.holder = holder or identity()
        self.lost = asyncio.Event()
        self._seen: tuple[Any, Any] | None = None  # (holder, renewTime) last seen of another holder
        self._seen_at = 0.0  # monotonic time it last changed

    def _body(self, lease: dict[str, Any] | None) -> dict[str, Any]:
        spec = dict((lease or {}).get("spec") or {})
        now = _micro_now()
        if spec.get("holderIdentity") != self.holder:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if lease else 0)
        spec.update(holderIdentity=self.holder, renewTime=now, leaseDurationSeconds=int(self.lease_seconds))
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _free(self, lease: dict[str, Any]) -> bool:
        """Whether the Lease is ours to take: held by us or nobody, or unchanged for its whole duration."""
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        if not holder or holder == self.holder:
            return True
        seen = (holder, spec.get("renewTime"))
        now = time.monotonic()
        if seen != self._seen:
            self._seen, self._seen_at = seen, now
            return False
        duration = float(spec.get("leaseDurationSeconds") or self.lease_seconds)
        return now - self._seen_at > duration

    async def try_acquire(self) -> bool:
        """One attempt: True when this process holds the Lease now."""
        lease = await self.kube.request("GET", self.path, absent_ok=True, retries=1)
        if lease is None:
            try:
                await self.kube.request("POST", self.collection, body=self._body(None), retries=0, parse=False)
            except KubeError as err:
                if err.status == 409:
                    return False  # another process made it first
                raise
            return True
        if not self._free(lease):
            return False
        try:
            await self.kube.request("PUT", self.path, body=self._body(lease), retries=0, parse=False)
        except KubeError as err:
            if err.status == 409:
                return False  # changed under us: someone renewed or took it
            raise
        return True

    async def acquire(self) -> None:
        """Wait until this process holds the Lease."""
        logged = False
        while True:
            try:
                if await self.try_acquire():
                    logger.info("holding Lease %s/%s as %s", self.namespace, self.name, self.holder)
                    return
            except KubeError as err:
                logger.warning("Lease %s/%s: %s", self.namespace, self.name, err)
            if not logged:
                holder = (self._seen or ("?",))[0]
                logger.info("standing by: Lease %s/%s is held by %s", self.namespace, self.name, holder)
                logged = True
            await asyncio.sleep(self.lease_seconds / 4)

    async def keep(self) -> None:
        """Renew the Lease until cancelled; set `lost` (and return) once it cannot be kept."""
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                lease = await self.kube.request("GET", self.path, absent_ok=True, retries=0)
                holder = ((lease or {}).get("spec") or {}).get("holderIdentity")
                if lease is not None and holder != self.holder:
                    logger.error("Lease %s/%s taken by %s: stopping", self.namespace, self.name, holder)
                    self.lost.set()
                    return
                if lease is None:
                    await self.kube.request("POST", self.collection, body=self._body(None), retries=0,
                                            parse=False)  # fmt: skip
                else:
                    await self.kube.request("PUT", self.path, body=self._body(lease), retries=0, parse=False)
                renewed = time.monotonic()
            except (KubeError, TimeoutError) as err:
                logger.warning("Lease %s/%s not renewed: %s", self.namespace, self.name, err)
            # stop before a standby may take over (it waits a whole duration of no change)
            if time.monotonic() - renewed > self.lease_seconds * 2 / 3:
                logger.error("Lease %s/%s not renewed for %.0fs: stopping", self.namespace, self.name,
                             time.monotonic() - renewed)  # fmt: skip
                self.lost.set()
                return

    async def release(self) -> None:
        """Hand the Lease over at a clean stop: a standby takes it at once."""
        try:
            lease = await self.kube.request("GET", self.path, absent_ok=True, retries=0)
            if lease and (lease.get("spec") or {}).get("holderIdentity") == self.holder:
                body = self._body(lease)
                body["spec"]["holderIdentity"] = None
                await self.kube.request("PUT", self.path, body=body, retries=0, parse=False)
        except (KubeError, TimeoutError) as err:
            logger.warning("Lease %s/%s not released: %s", self.namespace, self.name, err)
