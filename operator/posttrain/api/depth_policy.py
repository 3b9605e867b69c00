"""The bound the API server puts on how deep a job's spec may nest. A section's `extras` keep unknown TOML keys
(`x-kubernetes-preserve-unknown-fields`), which the structural schema cannot type and CRD CEL rules cannot
see; without a bound the API server stores objects nested 10,000 levels deep, far past what any Python
client (the operator's, kopf's, the CLI's) decodes. A ValidatingAdmissionPolicy can read those fields (its
CEL gets the object as the API server holds it), so this one refuses, on create and update of RLJob,
SFTJob and TaskApp, a spec nested deeper than SPEC_DEPTH levels (maps and lists alike). CEL has no
recursion: the rule is SPEC_DEPTH nested `all()`s, generated here and written by manifests/sync_crds.py into
manifests/base/crds/ (POLICY_FILE), installed with the CRDs by the kustomize base (crds/ itself holds only
CRDs: `kubectl wait --for=condition=Established -f crds/` keeps working). The operator survives objects stored without it (controller/safejson.py)."""

from __future__ import annotations

from typing import Any

from posttrain.api.resources import GROUP

SPEC_DEPTH = 16  # the typed spec nests at most 8 levels; extras get the rest
POLICY_NAME = "posttrain-spec-depth"
POLICY_FILE = "posttrain.dev_spec-depth-policy.yaml"
PLURALS = ("rljobs", "sftjobs", "taskapps")
MESSAGE = f"spec nests deeper than {SPEC_DEPTH} levels (objects and lists); keep extras shallow"


def _values(var: str, level: int) -> str:
    """The values of a map, the items of a list, or nothing (a scalar), as a CEL list."""
    return f"(type({var}) == map ? {var}.map(k{level}, {var}[k{level}]) : (type({var}) == list ? {var} : []))"


def depth_rule(depth: int = SPEC_DEPTH, root: str = "object.spec") -> str:
    """CEL that holds when `root` nests no deeper than `depth` levels below itself."""
    expr = f"!(type(v{depth}) == map || type(v{depth}) == list)"
    for level in range(depth - 1, -1, -1):
        var = root if level == 0 else f"v{level}"
        expr = f"{_values(var, level)}.all(v{level + 1}, {expr})"
    return expr


def policy_documents() -> list[dict[str, Any]]:
    """The ValidatingAdmissionPolicy and its binding (Deny), cluster-wide."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [GROUP],
                        "apiVersions": ["*"],
                        "operations": ["CREATE", "UPDATE"],
                        "resources": list(PLURALS),
                    }
                ]
            },
            "validations": [{"expression": depth_rule(), "message": MESSAGE, "reason": "Invalid"}],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY_NAME},
        "spec": {"policyName": POLICY_NAME, "validationActions": ["Deny"]},
    }
    return [policy, binding]


def policy_yaml() -> str:
    import yaml

    header = "# Generated from operator/posttrain/api/depth_policy.py by manifests/sync_crds.py; do not edit.\n"
    return header + yaml.safe_dump_all(policy_documents(), sort_keys=False, width=120)


def spec_depth(value: Any, limit: int = SPEC_DEPTH + 1) -> int:
    """How deep `value` nests (0: a scalar), counted up to `limit` (iteratively: no recursion)."""
    deepest = 0
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level + 1)
        if deepest >= limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest


def too_deep(value: Any, limit: int, path: str = "") -> str | None:
    """The path of the first map or list nested deeper than `limit` levels in `value` (None: none is)."""
    stack = [(value, path, 1)]
    while stack:
        item, where, level = stack.pop()
        if isinstance(item, dict):
            children = [(child, f"{where}.{key}" if where else str(key)) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{where}[{index}]") for index, child in enumerate(item)]
        else:
            continue
        if level > limit:
            return where
        stack.extend((child, child_path, level + 1) for child, child_path in reversed(children))
    return None
