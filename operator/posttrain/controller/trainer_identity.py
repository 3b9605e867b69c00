"""The trainer's identity at run time (settings.trainer_identity, render/identity.py).

At start the operator looks for the ValidatingAdmissionPolicy that confines the namespace identity to its
own job (two GETs). Without it, or without the right to read it, a shared ServiceAccount would let one
job's trainer patch another job's status, so the operator then makes the per-job identity instead, and
says so. In mode `namespace` the ServiceAccount, Role and RoleBinding of a namespace are server-side
applied once per namespace (controller/namespace_objects.py), not per job."""

from __future__ import annotations

import logging

from posttrain.controller.kube import Kube, KubeError
from posttrain.controller.render.identity import POLICY_SERVICE_ACCOUNT, TRAINER_POLICY
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
