"""crds/ is generated from posttrain.api: it must equal what the models give, and be structural."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml
from posttrain.api import crdgen
from posttrain.commands.crds import stale

REPO = Path(__file__).resolve().parents[2]
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
crd_files = lru_cache(crdgen.crd_files)


@lru_cache
def crd(kind: str) -> dict:
    return crdgen.crd(kind)


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
    columns = version["additionalPrinterColumns"]
    # the default view: what someone polling wants; model ids (long) only with -o wide (priority 1)
    assert [c["name"] for c in columns if not c.get("priority")] == [
        "Phase", "Progress", "Reward", "Eval", "Reason", "Age",
    ]  # fmt: skip
    assert [c["name"] for c in columns if c.get("priority") == 1] == ["Model", "Fine-Tuned-Model"]
    assert {c["name"]: c["jsonPath"] for c in columns}["Progress"] == ".status.progress.display"
    sft = [c["name"] for c in crd("SFTJob")["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert sft == ["Phase", "Progress", "Loss", "Eval", "Reason", "Age"]
    ta = [c["name"] for c in crd("TaskApp")["spec"]["versions"][0]["additionalPrinterColumns"] if not c.get("priority")]
    assert ta == ["Verified", "Reason", "Age"]
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
        doc = yaml.load(text, Loader=Loader)
        assert doc["kind"] == "CustomResourceDefinition"


# ---------------------------------------------------------------------------- CEL rules, evaluated
# cel-python evaluates the generated rules against objects: the same expressions the API server runs.

celpy = __import__("pytest").importorskip("celpy")
_ENV = celpy.Environment()
_PROGRAMS: dict[str, object] = {}


def _eval(rule: str, value, old=None) -> bool:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _ENV.program(_ENV.compile(rule))
    activation = {"self": celpy.json_to_cel(value)}
    if old is not None:
        activation["oldSelf"] = celpy.json_to_cel(old)
    return bool(_PROGRAMS[rule].evaluate(activation))


def violations(kind: str, obj: dict, old: dict | None = None) -> list[str]:
    """Messages of every rule the object breaks (transition rules only when `old` is given), walking the
    schema as the API server does."""
    schema = crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    out: list[str] = []

    def walk(node, value, old_value, path):
        for rule in node.get("x-kubernetes-validations", []):
            transition = "oldSelf" in rule["rule"]
            if transition and old_value is None:
                continue
            if not _eval(rule["rule"], value, old_value if transition else None):
                out.append(f"{path}: {rule['message']}")
        if isinstance(value, dict):
            for name, sub in (node.get("properties") or {}).items():
                if name in value:
                    old_sub = old_value.get(name) if isinstance(old_value, dict) else None
                    walk(sub, value[name], old_sub, f"{path}.{name}")
        if isinstance(value, list) and isinstance(node.get("items"), dict):
            for i, item in enumerate(value):
                walk(node["items"], item, None, f"{path}[{i}]")

    walk(schema, obj, old, "")
    return out


def _example(name: str) -> dict:
    return yaml.safe_load((REPO / "examples" / "crs" / f"{name}.yaml").read_text())


def test_examples_pass_every_rule_and_updates_of_suspend_are_allowed():
    import copy

    for path in sorted((REPO / "examples" / "crs").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert violations(doc["kind"], doc) == [], path.name
        assert violations(doc["kind"], doc, old=doc) == [], path.name
        if doc["kind"] != "TaskApp":
            suspended = copy.deepcopy(doc)
            suspended["spec"]["suspend"] = True
            assert violations(doc["kind"], suspended, old=doc) == []


def test_cel_exactly_one_of_model_source_base():
    import copy

    doc = _example("rl_qwen3_4b")
    both = copy.deepcopy(doc)
    both["spec"]["model"]["source"] = "rl:Qwen/Qwen3-4B:a.b.12345678"
    assert any("model.source" in v and "model.base" in v for v in violations("RLJob", both))
    neither = copy.deepcopy(doc)
    del neither["spec"]["model"]["base"]
    assert violations("RLJob", neither)
    sft = _example("sft_lora")
    del sft["spec"]["model"]["base"]
    assert violations("SFTJob", sft)


def test_cel_topology_arithmetic():
    import copy

    doc = _example("rl_qwen3_4b")
    bad_sum = copy.deepcopy(doc)
    bad_sum["spec"]["compute"]["gpuCount"] = 5
    assert any("gpuCount" in v for v in violations("RLJob", bad_sum))
    bad_tp = copy.deepcopy(doc)
    bad_tp["spec"]["compute"]["topology"]["tensorParallel"] = 3
    bad_tp["spec"]["compute"]["topology"]["gpusForVllm"] = 2
    assert any("tensorParallel" in v for v in violations("RLJob", bad_tp))
    bad_nodes = copy.deepcopy(doc)
    bad_nodes["spec"]["compute"]["nodes"] = 2  # 1 trainer GPU on 2 nodes
    assert any("nodes" in v for v in violations("RLJob", bad_nodes))


def test_cel_task_app_dataset_taskapp_spec_algorithm():
    import copy

    doc = _example("rl_qwen3_4b")
    both = copy.deepcopy(doc)
    both["spec"]["taskApp"]["url"] = "http://x"
    assert any("taskApp" in v for v in violations("RLJob", both))
    algo = copy.deepcopy(doc)
    algo["spec"]["algorithm"]["variety"] = "grpo"
    assert any("gspo" in v for v in violations("RLJob", algo))
    sft = _example("sft_lora")
    sft["spec"]["dataset"]["configMapRef"] = {"name": "d", "key": "train.jsonl"}
    assert any("uri or configMapRef" in v for v in violations("SFTJob", sft))
    sft2 = _example("sft_lora")
    sft2["spec"]["algorithm"]["method"] = "supervised_finetune"  # synth: supervised_finetune only with fft
    assert violations("SFTJob", sft2)
    app = _example("taskapp-math")
    app["spec"]["url"] = "http://x"
    assert any("url or image" in v for v in violations("TaskApp", app))


def test_cel_spec_is_immutable_except_suspend():
    import copy

    old = _example("rl_qwen3_4b")
    changed = copy.deepcopy(old)
    changed["spec"]["training"]["learningRate"] = 1e-3
    assert any("spec.training" in v and "immutable" in v for v in violations("RLJob", changed, old=old))
    added = copy.deepcopy(old)
    added["spec"]["images"] = {"trainer": "x"}
    assert any("added or removed" in v for v in violations("RLJob", added, old=old))
    removed = copy.deepcopy(old)
    del removed["spec"]["tags"]
    assert any("added or removed" in v for v in violations("RLJob", removed, old=old))
    extras = copy.deepcopy(old)
    extras["spec"]["training"]["extras"] = {"k": 1}
    assert violations("RLJob", extras, old=old)
    # TaskApps may change (image roll-outs, replicas)
    app = _example("taskapp-math")
    scaled = copy.deepcopy(app)
    scaled["spec"]["replicas"] = 3
    assert violations("TaskApp", scaled, old=app) == []


def test_cel_task_app_urls_refuse_user_info_query_fragment_and_other_schemes():
    import copy

    doc = _example("rl_qwen3_4b")
    doc["spec"]["taskApp"] = {"url": "http://task-app:8000/apps/math"}
    assert violations("RLJob", doc) == []
    app = _example("taskapp-math")
    del app["spec"]["image"]
    for bad in ("http://h:8000/internal/admin?x=", "http://h/#", "http://user:pw@h:8000", "ftp://h/",
                "http://h/a b"):  # fmt: skip
        job = copy.deepcopy(doc)
        job["spec"]["taskApp"]["url"] = bad
        assert any("taskApp.url must be an http(s) URL" in v for v in violations("RLJob", job)), bad
        app["spec"]["url"] = bad
        assert any("spec.url must be an http(s) URL" in v for v in violations("TaskApp", app)), bad
