"""Namespaces opt in to posttrain (controller/tenancy.py): the reach policy's refusal becomes a job that
waits, Pending with reason NamespaceNotEnabled naming the label; any other refusal is not mistaken for it.
The policy itself is proven on the real API server in tests/integration/test_operator_reach.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from fixtures.jobs import job_object, sft_spec
from posttrain.controller.kube import KubeError, _status_message
from posttrain.controller.objects import parse_job
from posttrain.controller.status import Observed, derive_status, get_condition
from posttrain.controller.tenancy import NOT_ENABLED, REACH_REFUSED, not_opted_in, reach_refusal

NS = "n" * 63  # the longest namespace name: the refusal's message is longer than KubeError's own text


OPTED_OUT = f"namespace {NS} has not opted in to posttrain: a cluster admin labels it posttrain.dev/tenant=enabled"


def refusal(status: int = 403, policy: str = "posttrain-operator-reach", said: str = OPTED_OUT) -> KubeError:
    message = (
        f'rolebindings.rbac.authorization.k8s.io "posttrain-trainer-status" is forbidden: ValidatingAdmissionPolicy'
        f" '{policy}' with binding '{policy}' denied request: {said}"
    )
    body = json.dumps({"kind": "Status", "status": "Failure", "message": message, "reason": "Forbidden"}).encode()
    path = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/posttrain-trainer-status"
    return KubeError(status, f"PATCH {path}: {body.decode()[:300]}", None, _status_message(body))


def test_the_reach_policys_refusal_names_the_label_to_set() -> None:
    err = refusal()
    assert "has not opted in" not in str(err)  # cut short: the full Status message is what is read
    why = not_opted_in(err, NS)
    assert why is not None
    assert f"namespace {NS} has not opted in" in why
    assert f"kubectl label namespace {NS} posttrain.dev/tenant=enabled" in why


def test_other_refusals_are_not_taken_for_it() -> None:
    assert not_opted_in(refusal(policy="someone-elses-policy"), NS) is None
    assert not_opted_in(refusal(status=500), NS) is None
    assert not_opted_in(KubeError(403, "secrets is forbidden: User cannot create resource"), NS) is None
    assert not_opted_in(ValueError("has not opted in to posttrain posttrain-operator-reach"), NS) is None


def test_a_blocked_job_waits_pending_with_the_reason() -> None:
    job = parse_job(job_object("SFTJob", sft_spec(), name="j", namespace=NS))
    why = not_opted_in(refusal(), NS)
    assert why
    now = datetime(2026, 11, 27, tzinfo=UTC)
    out = derive_status(job, observed=Observed(), expected=None, verification=None, now=now, blocked=(NOT_ENABLED, why))
    assert (out["phase"], out["reason"], out["message"]) == ("Pending", NOT_ENABLED, why)
    ready = get_condition(out, "Ready")
    assert ready and ready["status"] == "False" and ready["reason"] == NOT_ENABLED
    assert "completionTime" not in out  # not an end: it goes on once the namespace opts in
    # An invalid spec still fails: waiting for the namespace would not make it valid.
    failed = derive_status(job, observed=Observed(), expected=None, verification=None, now=now,
                           invalid="spec.x: bad", blocked=(NOT_ENABLED, why))  # fmt: skip
    assert failed["phase"] == "Failed"


def test_any_other_refusal_of_the_reach_policy_is_reported_in_its_own_words() -> None:
    said = "a Job of the posttrain operator runs the trainer identity: serviceAccountName posttrain-trainer or x"
    assert not_opted_in(refusal(said=said), NS) is None
    reason, message = reach_refusal(refusal(said=said), NS) or ("", "")
    assert reason == REACH_REFUSED and message.endswith(said) and "posttrain-operator-reach" in message
    assert reach_refusal(refusal(), NS) == (NOT_ENABLED, not_opted_in(refusal(), NS))
    long = reach_refusal(refusal(said="x" * 5000), NS)
    assert long is not None and len(long[1]) < 400  # bounded: it goes into status
    assert reach_refusal(refusal(policy="someone-elses-policy", said=said), NS) is None
    assert reach_refusal(KubeError(403, "forbidden"), NS) is None


def test_the_policy_names_what_the_operator_renders() -> None:
    """The reach policy hard-codes names the code defines: they must not drift apart."""
    from pathlib import Path

    import yaml
    from posttrain.controller.render.identity import NAMESPACE_ROLE, POLICY_SERVICE_ACCOUNT
    from posttrain.controller.render.network import NETWORK_POLICY
    from posttrain.controller.settings import OperatorSettings
    from posttrain.controller.tenancy import REACH_POLICY, TENANT_ENABLED, TENANT_LABEL

    path = Path(__file__).resolve().parents[2] / "manifests/base/operator-policy.yaml"
    policy, binding = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == REACH_POLICY
    text = path.read_text()
    settings = OperatorSettings()
    for name in (POLICY_SERVICE_ACCOUNT, settings.trainer_service_account, NAMESPACE_ROLE, NETWORK_POLICY):
        assert f"'{name}'" in text, name
    assert f"'{TENANT_LABEL}' in namespaceObject.metadata.labels" in text
    assert f"namespaceObject.metadata.labels['{TENANT_LABEL}'] == '{TENANT_ENABLED}'" in text
    assert f"{TENANT_LABEL}={TENANT_ENABLED}" in text  # the message tells the admin what to set
