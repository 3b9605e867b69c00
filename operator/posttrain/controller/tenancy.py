"""Pure: which namespaces the operator may act in. A cluster admin opts a namespace in with the label
posttrain.dev/tenant=enabled; the ValidatingAdmissionPolicy posttrain-operator-reach
(manifests/base/operator-policy.yaml) refuses every write of the operator's account elsewhere, but for the
status of posttrain's own objects and Events about them. So the operator does not guess: where the API
server refuses a child with that policy's "has not opted in" message, the job (or TaskApp) waits with
reason NamespaceNotEnabled and that message, and goes on at a later pass once the namespace is labelled.
Any other refusal by that policy (an install whose settings render what the policy does not admit, e.g. a
trainer ServiceAccount it does not name) waits the same way with reason OperatorReachRefused and the
policy's own message, instead of a retry loop that never says why."""

from __future__ import annotations

from posttrain.controller.kube import KubeError

TENANT_LABEL = "posttrain.dev/tenant"
TENANT_ENABLED = "enabled"
REACH_POLICY = "posttrain-operator-reach"
NOT_ENABLED = "NamespaceNotEnabled"
REACH_REFUSED = "OperatorReachRefused"
_MARK = "has not opted in to posttrain"
_DENIED = "denied request: "
MESSAGE_MAX = 300


def not_opted_in(err: BaseException, namespace: str) -> str | None:
    """The reason to show when `err` is the reach policy refusing a write in a namespace that has not opted
    in; None for any other error. The message is ours, not the API server's text (which is bounded
    anyway), so it reads the same whatever the API server adds around it."""
    if not isinstance(err, KubeError) or err.status not in (403, 422):
        return None
    text = err.api_message or str(err)
    if REACH_POLICY not in text or _MARK not in text:
        return None
    return (
        f"namespace {namespace} has not opted in to posttrain: a cluster admin labels it "
        f"{TENANT_LABEL}={TENANT_ENABLED} (kubectl label namespace {namespace} {TENANT_LABEL}={TENANT_ENABLED}); "
        "it waits until then"
    )


def reach_refusal(err: BaseException, namespace: str) -> tuple[str, str] | None:
    """(reason, message) when `err` is the reach policy refusing a write; None for any other error."""
    if (why := not_opted_in(err, namespace)) is not None:
        return NOT_ENABLED, why
    if not isinstance(err, KubeError) or err.status not in (403, 422):
        return None
    text = err.api_message or str(err)
    if f"'{REACH_POLICY}'" not in text or _DENIED not in text:
        return None
    said = text.split(_DENIED, 1)[1].strip()[:MESSAGE_MAX]
    return REACH_REFUSED, f"the operator's admission policy {REACH_POLICY} refused it: {said}"
