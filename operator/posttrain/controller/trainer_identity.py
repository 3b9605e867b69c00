"""The trainer's identity at run time (settings.trainer_identity, render/identity.py).

At start the operator looks for the ValidatingAdmissionPolicy that confines the namespace identity to its
own job (two GETs). Without it, or without the right to read it, a shared ServiceAccount would let one
job's trainer patch another job's status, so the operator then makes the per-job identity instead, and
says so. In mode `namespace` the ServiceAccount, Role and RoleBinding of a namespace are server-side
applied once per namespace (by the first job there), not per job, and again only when the operator's
watch of them (controller/children.py, the namespace's index key) shows one gone."""

from __future__ import annotations

import asyncio
import logging
import time

from posttrain.controller.kube import Kube, KubeError
from posttrain.controller.render.identity import (
    POLICY_SERVICE_ACCOUNT,
    TRAINER_POLICY,
    render_namespace_identity,
)
from posttrain.controller.settings import OperatorSettings

logger = logging.getLogger(__name__)
ADMISSION = "/apis/admissionregistration.k8s.io/v1"


async def policy_in_force(kube: Kube) -> str | None:
    """None when the trainer policy and its Deny binding are installed; otherwise why not."""
    try:
        policy = await kube.get(f"{ADMISSION}/validatingadmissionpolicies/{TRAINER_POLICY}")
        binding = await kube.get(f"{ADMISSION}/validatingadmissionpolicybindings/{TRAINER_POLICY}")
    except KubeError as err:
        # (a namespaced operator may not read cluster-wide policies: that is expected, not a refused write)
        return "the operator's role does not let it read it" if err.status == 403 else f"reading it failed: {err}"
    if policy is None:
        return "it is not installed"
    spec = (binding or {}).get("spec") or {}
    if spec.get("policyName") != TRAINER_POLICY or "Deny" not in (spec.get("validationActions") or []):
        return "its binding (validationActions: [Deny]) is not installed"
    return None


async def resolve_trainer_identity(kube: Kube, settings: OperatorSettings) -> OperatorSettings:
    """The settings to run with: mode `namespace` only where the policy holds it to the pod's own job."""
    if settings.trainer_identity != "namespace":
        return settings
    if settings.trainer_service_account != POLICY_SERVICE_ACCOUNT:
        why = f"the ServiceAccount {settings.trainer_service_account} is not the one it matches"
    else:
        why = await policy_in_force(kube)
    if why is None:
        logger.info("trainer identity: ServiceAccount %s per namespace, held to its own job by %s",
                    settings.trainer_service_account, TRAINER_POLICY)  # fmt: skip
        return settings
    logger.warning("trainer identity: per job, since the ValidatingAdmissionPolicy %s cannot confine a "
                   "shared one: %s", TRAINER_POLICY, why)  # fmt: skip
    return settings.model_copy(update={"trainer_identity": "job"})


class NamespaceIdentities:
    """The namespaces whose trainer identity this process has applied or seen (mode `namespace`)."""

    def __init__(self, grace: float = 15.0) -> None:
        self.grace = grace  # seconds for our own apply to show up in the watch before applying again
        self.done: dict[str, float] = {}  # namespace -> monotonic time it was applied (0: seen in place)
        self._locks: dict[str, asyncio.Lock] = {}

    def _current(self, namespace: str, wanted: set[str], seen: set[str] | None) -> bool:
        """Whether nothing is to be done: applied a moment ago, or every object is in the watch."""
        if seen is not None and wanted <= seen:
            self.done.setdefault(namespace, 0.0)
            return True
        applied = self.done.get(namespace)
        if applied is None:
            return False
        # applied, and either the caller has no watch to look at or the watch has not caught up yet
        return seen is None or time.monotonic() - applied < self.grace

    async def ensure(
        self, kube: Kube, settings: OperatorSettings, namespace: str, seen: set[str] | None = None
    ) -> int:
        """Apply the namespace's ServiceAccount, Role and RoleBinding when they are not in `seen` (what
        the operator's watches hold, "Kind/name"; someone may have deleted one), once; returns the writes
        made."""
        if settings.trainer_identity != "namespace":
            return 0
        objects = render_namespace_identity(namespace, settings)
        wanted = {f"{o['kind']}/{o['metadata']['name']}" for o in objects}
        if self._current(namespace, wanted, seen):
            return 0
        async with self._locks.setdefault(namespace, asyncio.Lock()):
            if self._current(namespace, wanted, seen):  # another job of the namespace applied them meanwhile
                return 0
            for obj in objects:
                await kube.apply(obj)
            self.done[namespace] = time.monotonic()
            return len(objects)
