"""How deep a spec may nest: the API server's bound (api/depth_policy.py, a ValidatingAdmissionPolicy whose
CEL is evaluated here with cel-python, as the API server runs it) and the operator's decoder
(controller/safejson.py), which reads any object the API server holds, however deep, without
RecursionError."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posttrain.api.depth_policy import SPEC_DEPTH, depth_rule, policy_documents, spec_depth
from posttrain.controller import safejson
from posttrain.controller.objects import parse_job
from posttrain.controller.spec_errors import SpecError

celpy = pytest.importorskip("celpy")


def nested(levels: int, leaf: str = "1") -> str:
    """JSON text of `levels` objects one inside the other (json.dumps itself would recurse)."""
    return '{"a":' * levels + leaf + "}" * levels


def allowed(spec: object, depth: int) -> bool:
    env = celpy.Environment()
    program = env.program(env.compile(depth_rule(depth, root="spec")))
    return bool(program.evaluate({"spec": celpy.json_to_cel(spec)}))


@pytest.mark.parametrize("levels", [1, 2, 3, 4])
def test_the_policy_admits_a_spec_as_deep_as_the_bound_and_no_deeper(levels: int) -> None:
    depth = 4
    spec = json.loads(nested(levels))  # spec itself is one level
    assert spec_depth(spec) == levels
    assert allowed(spec, depth)
    assert not allowed(json.loads(nested(depth + 1)), depth)
    assert not allowed({"x": [[[[1]]]]}, depth)  # lists count like objects
    assert allowed({"x": [1, "s", True, 1.5], "y": {"z": None}}, depth)


def test_the_policy_document_binds_every_kind_and_denies() -> None:
    policy, binding = policy_documents()
    rule = policy["spec"]["matchConstraints"]["resourceRules"][0]
    assert rule["resources"] == ["rljobs", "sftjobs", "taskapps"] and "UPDATE" in rule["operations"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert policy["spec"]["validations"][0]["expression"] == depth_rule(SPEC_DEPTH)


def test_the_decoder_reads_an_object_too_deep_for_json_and_marks_it() -> None:
    text = ('{"type":"ADDED","object":{"apiVersion":"posttrain.dev/v1alpha1","kind":"RLJob","metadata":'
            '{"name":"deep","namespace":"ns","uid":"u1","annotations":{"x":"{{[[\\"}"}},'
            '"spec":{"training":{"extras":' + nested(9000) + "}}}}").encode()  # fmt: skip (the API server takes 10,000)
    with pytest.raises(RecursionError):
        json.loads(text)
    event = safejson.loads(text)
    obj = event["object"]
    assert obj["metadata"]["annotations"] == {"x": '{{[["}'}  # brackets inside strings do not count
    assert safejson.undecodable(obj).startswith("spec.training.extras.a.a.")
    with pytest.raises(SpecError) as err:
        parse_job(obj)
    assert str(err.value).startswith("spec.training.extras.a.a.")
    assert "nested deeper than" in str(err.value)
    listing = safejson.loads(b'{"kind":"RLJobList","items":[' + json.dumps(obj).encode() + b',{"metadata":{}}]}')
    assert safejson.UNDECODABLE in listing["items"][0] and safejson.UNDECODABLE not in listing["items"][1]


def test_the_decoder_leaves_ordinary_objects_as_json_reads_them() -> None:
    for value in ({"a": [{"b": "]]}}" * 50}] * 40, "c": nested(3)}, [], "x", {"k": json.loads(nested(60))}):
        text = json.dumps(value).encode()
        assert safejson.loads(text) == json.loads(text)
    assert safejson.depth_exceeds(nested(65).encode()) and not safejson.depth_exceeds(nested(64).encode())


def test_convert_refuses_a_toml_nested_deeper_than_the_cluster_takes_naming_the_line() -> None:
    from posttrain.api.convert import toml_to_cr
    from posttrain.errors import UserError

    head = (Path(__file__).resolve().parents[2] / "examples/demo/rl.toml").read_text() + "\n[custom]\n"

    def inline(levels: int) -> str:
        return "{a=" * levels + "1" + "}" * levels

    with pytest.raises(UserError) as err:
        toml_to_cr(head + f"x = {inline(SPEC_DEPTH)}\n", file="deep.toml", task_url="http://t")
    problem = err.value.problems[0]
    assert problem.field.startswith("custom.x.a.a") and problem.line == head.count("\n") + 1
    assert "nested deeper than" in str(problem)
    # As deep as allowed: converted, and the spec is within the policy's bound (extras add one level).
    cr, _ = toml_to_cr(head + f"x = {inline(SPEC_DEPTH - 3)}\n", task_url="http://t")
    assert cr["spec"]["extras"]["custom"]["x"]["a"]
    assert spec_depth(cr["spec"]) <= SPEC_DEPTH
    assert allowed(cr["spec"], SPEC_DEPTH)


def test_kopfs_client_decodes_with_the_bounded_decoder() -> None:
    """kopf's list, patch and watch decoding goes through safejson once the hook is installed."""
    import asyncio

    from kopf._cogs.clients import api

    safejson.install_kopf_hook()
    assert api.json.loads is safejson.loads
    deep = ('{"metadata":{"name":"x"},"spec":{"extras":' + nested(5000) + "}}").encode()

    class Response:
        async def read(self) -> bytes:
            return deep

        async def __aenter__(self) -> Response:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

    async def fake_request(**_: object) -> Response:
        return Response()

    original = api.request
    api.request = fake_request  # type: ignore[assignment]
    try:
        for verb in (api.get, api.patch, api.post, api.delete):
            body = asyncio.run(verb("/x", settings=None, logger=None))
            assert body["metadata"] == {"name": "x"} and safejson.undecodable(body).startswith("spec.extras.a")
    finally:
        api.request = original  # type: ignore[assignment]
