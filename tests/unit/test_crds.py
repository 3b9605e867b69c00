"""crds/ is generated from posttrain.api: it must equal what the models give, and be structural."""

from __future__ import annotations

from pathlib import Path

import yaml
from posttrain.api.crdgen import crd, crd_files
from posttrain.commands.crds import stale

REPO = Path(__file__).resolve().parents[2]


def test_committed_crds_equal_the_models():
    problems = stale(REPO / "crds")
    assert not problems, "crds/ is stale; run `posttrain crds`: " + "; ".join(problems)


def test_one_file_per_kind():
    assert sorted(crd_files()) == [
        "posttrain.dev_rljobs.yaml",
        "posttrain.dev_sftjobs.yaml",
        "posttrain.dev_taskapps.yaml",
    ]


def _walk(schema, path="", out=None):
    out = [] if out is None else out
    out.append((path, schema))
    for name, sub in (schema.get("properties") or {}).items():
        _walk(sub, f"{path}.{name}", out)
    if isinstance(schema.get("items"), dict):
        _walk(schema["items"], f"{path}[]", out)
    if isinstance(schema.get("additionalProperties"), dict):
        _walk(schema["additionalProperties"], f"{path}{{}}", out)
    return out


def test_structural_and_preserve_unknown_only_in_extras():
    for kind in ("RLJob", "SFTJob", "TaskApp"):
        schema = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            if node.get("x-kubernetes-preserve-unknown-fields"):
                assert path.endswith(".extras"), f"{kind}{path} preserves unknown fields"
            elif path.endswith(".metadata"):
                continue
            else:
                assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{kind}{path} has no type"
            if not path.startswith(".spec"):
                continue
            if node.get("type") == "string":
                assert "maxLength" in node or "enum" in node, f"{kind}{path}: no maxLength (CEL cost)"
            if node.get("type") == "array":
                assert "maxItems" in node, f"{kind}{path}: no maxItems (CEL cost)"


def test_names_columns_subresource():
    doc = crd("RLJob")
    names = doc["spec"]["names"]
    assert names["shortNames"] == ["rlj"] and names["categories"] == ["posttrain"]
    version = doc["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase", "Model", "Step", "Return", "Fine-Tuned-Model", "Age",
    ]  # fmt: skip
    assert crd("SFTJob")["spec"]["names"]["shortNames"] == ["sftj"]
    assert crd("TaskApp")["spec"]["names"]["shortNames"] == ["ta"]
    assert doc["spec"]["scope"] == "Namespaced"


def test_cel_rules_present():
    spec = crd("RLJob")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    model_rules = [r["rule"] for r in spec["properties"]["model"]["x-kubernetes-validations"]]
    assert "has(self.base) != has(self.source)" in model_rules
    assert "self == oldSelf" in model_rules  # immutable
    assert "x-kubernetes-validations" not in spec["properties"]["suspend"]
    compute_rules = " ".join(r["rule"] for r in spec["properties"]["compute"]["x-kubernetes-validations"])
    assert "self.gpuCount" in compute_rules and "% self.nodes" in compute_rules
    topo = spec["properties"]["compute"]["properties"]["topology"]
    assert any("% self.tensorParallel" in r["rule"] for r in topo["x-kubernetes-validations"])
    assert any("oldSelf" in r["rule"] and "[" in r["rule"] for r in spec["x-kubernetes-validations"])


def test_yaml_files_parse():
    for text in crd_files().values():
        doc = yaml.safe_load(text)
        assert doc["kind"] == "CustomResourceDefinition"
