"""The trainer identity's run-time choice and the once-per-namespace apply (controller/trainer_identity.py).
The admission policy itself is proven on the real API server (tests/integration/test_trainer_identity.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml
from posttrain.controller.kube import KubeError
from posttrain.controller.namespace_objects import NamespaceObjects
from posttrain.controller.render.identity import TRAINER_POLICY
from posttrain.controller.settings import OperatorSettings
from posttrain.controller.trainer_identity import resolve_trainer_identity

POLICY_FILE = Path(__file__).resolve().parents[2] / "manifests/base/trainer-policy.yaml"


class PolicyKube:
    """GETs answer from `objects` (path suffix -> object, or an HTTP status to fail with); applies are
    recorded."""

    def __init__(self, objects: dict[str, Any]):
        self.objects = objects
        self.applied: list[tuple[str, str, str]] = []

    async def get(self, path: str) -> dict[str, Any] | None:
        found = next((v for k, v in self.objects.items() if path.endswith(k)), None)
        if isinstance(found, int):
            raise KubeError(found, "no")
        return found

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0.01)  # let other jobs' passes run meanwhile
        self.applied.append((obj["metadata"]["namespace"], obj["kind"], obj["metadata"]["name"]))
        return {}


def installed() -> dict[str, Any]:
    docs = {d["kind"]: d for d in yaml.safe_load_all(POLICY_FILE.read_text()) if d}
    return {
        f"validatingadmissionpolicies/{TRAINER_POLICY}": docs["ValidatingAdmissionPolicy"],
        f"validatingadmissionpolicybindings/{TRAINER_POLICY}": docs["ValidatingAdmissionPolicyBinding"],
    }


def mode(kube: PolicyKube, **settings: Any) -> str:
    return asyncio.run(resolve_trainer_identity(kube, OperatorSettings(**settings))).trainer_identity  # type: ignore[arg-type]


def test_the_namespace_identity_only_where_the_policy_holds_it_to_its_job() -> None:
    assert mode(PolicyKube(installed())) == "namespace"
    # absent, unbound, only warning, unreadable: the per-job identity instead
    assert mode(PolicyKube({})) == "job"
    without_binding = installed()
    del without_binding[f"validatingadmissionpolicybindings/{TRAINER_POLICY}"]
    assert mode(PolicyKube(without_binding)) == "job"
    warn_only = installed()
    binding = warn_only[f"validatingadmissionpolicybindings/{TRAINER_POLICY}"]
    warn_only[f"validatingadmissionpolicybindings/{TRAINER_POLICY}"] = {
        **binding, "spec": {**binding["spec"], "validationActions": ["Warn"]}
    }  # fmt: skip
    assert mode(PolicyKube(warn_only)) == "job"
    assert mode(PolicyKube({f"validatingadmissionpolicies/{TRAINER_POLICY}": 403})) == "job"
    # a ServiceAccount the policy does not match
    assert mode(PolicyKube(installed()), trainer_service_account="mine") == "job"
    # the other modes are taken as they are, without a look
    assert mode(PolicyKube({}), trainer_identity="static") == "static"


def test_the_namespace_objects_are_applied_once_per_namespace() -> None:
    kube = PolicyKube({})
    objects = NamespaceObjects()
    settings = OperatorSettings()

    async def many_jobs() -> list[int]:
        jobs = [objects.ensure(kube, settings, ns) for ns in ["a"] * 20 + ["b"] * 5]  # type: ignore[arg-type]
        return await asyncio.gather(*jobs)

    writes = asyncio.run(many_jobs())
    # each: the operator's Secret read, the trainer identity, 3 NetworkPolicies (render/network.py)
    assert sum(writes) == 14 and len(kube.applied) == 14
    assert {(ns, kind) for ns, kind, _ in kube.applied} == {
        (ns, kind) for ns in "ab" for kind in ("ServiceAccount", "Role", "RoleBinding", "NetworkPolicy")
    }
    # Someone deleted the Role and the NetworkPolicy: once the watch shows them gone (and our own apply is
    # not just on its way), the next job's pass applies those two again, once.
    objects.grace = 0.0
    fences = {"NetworkPolicy/posttrain-egress", "NetworkPolicy/posttrain-task-apps"}
    seen = {"ServiceAccount/posttrain-trainer", "RoleBinding/posttrain-trainer-status", *fences,
            "RoleBinding/posttrain-operator-secrets"}  # fmt: skip
    before = len(kube.applied)
    assert asyncio.run(objects.ensure(kube, settings, "a", seen)) == 2  # type: ignore[arg-type]
    assert {kind for _, kind, _ in kube.applied[before:]} == {"Role", "NetworkPolicy"}
    seen |= {"Role/posttrain-trainer-status", "NetworkPolicy/posttrain-jobs"}
    assert asyncio.run(objects.ensure(kube, settings, "a", seen)) == 0  # type: ignore[arg-type]
    # A restarted operator whose watch shows them in place writes nothing.
    fresh = NamespaceObjects()
    assert asyncio.run(fresh.ensure(kube, settings, "a", seen)) == 0  # type: ignore[arg-type]
    # With a per-job trainer identity, the namespace gets the operator's Secret read and its
    # NetworkPolicies only; with the read granted by the install (overlays/namespaced), the policies only.
    job_mode = OperatorSettings(trainer_identity="job")
    assert asyncio.run(objects.ensure(kube, job_mode, "c")) == 4  # type: ignore[arg-type]
    assert kube.applied[-4][:2] == ("c", "RoleBinding") and kube.applied[-1][:2] == ("c", "NetworkPolicy")
    granted = OperatorSettings(trainer_identity="job", secrets_binding=False)
    assert asyncio.run(objects.ensure(kube, granted, "d")) == 3  # type: ignore[arg-type]
    assert {kind for ns, kind, _ in kube.applied if ns == "d"} == {"NetworkPolicy"}
