"""posttrain.api.model_ids: allowlist, experimental gating, fine-tuned ids, S3 locations."""

from __future__ import annotations

import re

import pytest
from posttrain.api import model_ids as m


def test_posttrain_ids_and_prefix():
    uid = "0f3a9c12-aaaa-bbbb-cccc-123456789abc"
    assert m.uid8(uid) == "0f3a9c12"
    assert (
        m.fine_tuned_model_id("rl", "Qwen/Qwen3-4B", "team", "math-rl", uid)
        == "rl:Qwen/Qwen3-4B:team.math-rl.0f3a9c12"
    )
    assert m.fine_tuned_model_id("ft", "Qwen/Qwen3-4B", "team", "warm", uid).startswith("ft:Qwen/Qwen3-4B:")
    assert m.job_artifact_prefix("team", "math-rl", uid) == "jobs/team/math-rl-0f3a9c12/"
    with pytest.raises(ValueError):
        m.fine_tuned_model_id("xx", "Qwen/Qwen3-4B", "team", "warm", uid)


def test_resolve_and_parse():
    model_id = "ft:HuggingFaceTB/SmolLM2-135M-Instruct:default.demo.sft.ab12cd34"
    parsed = m.parse_fine_tuned_id(model_id)
    assert (parsed.prefix, parsed.base, parsed.namespace, parsed.name, parsed.uid8) == (
        "ft", "HuggingFaceTB/SmolLM2-135M-Instruct", "default", "demo.sft", "ab12cd34",
    )  # fmt: skip
    assert str(parsed) == model_id
    assert (
        m.resolve_model_source(model_id, "posttrain")
        == "s3://posttrain/jobs/default/demo.sft-ab12cd34/final/"
    )
    assert m.resolve_model_source("s3://b/x/final/", "posttrain") == "s3://b/x/final/"
    with pytest.raises(m.ModelIdError):
        m.parse_fine_tuned_id("ft:YOUR_FT_MODEL_ID")
    with pytest.raises(m.ModelIdError):
        m.resolve_model_source("Qwen/Qwen3-4B", "b")


def test_roundtrip_with_operator_shape():
    uid = "12345678-9abc-def0-1234-56789abcdef0"
    model_id = m.fine_tuned_model_id("rl", "Qwen/Qwen3-4B", "ns", "job", uid)
    assert (
        m.resolve_model_source(model_id, "bkt") == f"s3://bkt/{m.job_artifact_prefix('ns', 'job', uid)}final/"
    )


def test_allowlist_case_insensitive_and_modes():
    assert m.normalize_base("qwen/qwen3-4b", "rl") == "Qwen/Qwen3-4B"
    assert m.normalize_base("Qwen/Qwen3-32B", "sft") == "Qwen/Qwen3-32B"
    with pytest.raises(m.ModelIdError, match="sft"):
        m.normalize_base("Qwen/Qwen3-32B", "rl")
    with pytest.raises(m.ModelIdError, match="unsupported"):
        m.normalize_base("meta-llama/Llama-3-8B", "rl")
    assert (
        m.normalize_base("HuggingFaceTB/SmolLM2-135M-Instruct", "rl") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert m.normalize_base("posttrain/tiny-random-qwen2", "sft") == "posttrain/tiny-random-qwen2"
    assert m.normalize_base("/models/mine", "rl") == "/models/mine"


def test_experimental_gating(monkeypatch):
    monkeypatch.delenv("SDK_EXPERIMENTAL", raising=False)
    monkeypatch.delenv("POSTTRAIN_EXPERIMENTAL", raising=False)
    for model_id, mode in (("Qwen/Qwen3-4B-Thinking-2507", "rl"), ("Qwen/Qwen3-235B-A22B", "sft"),
                           ("Qwen/Qwen3-Coder-480B-A35B-Instruct", "sft")):  # fmt: skip
        with pytest.raises(m.ModelIdError, match="experimental"):
            m.normalize_base(model_id, mode)
    monkeypatch.setenv("SDK_EXPERIMENTAL", "1")
    assert m.normalize_base("Qwen/Qwen3-4B-Thinking-2507", "rl") == "Qwen/Qwen3-4B-Thinking-2507"


def test_fine_tuned_id_rules():
    assert (
        m.normalize_source("rl:qwen/qwen3-4b:team.job.ab12cd34", "rl") == "rl:Qwen/Qwen3-4B:team.job.ab12cd34"
    )
    assert m.base_of_fine_tuned("rl:Qwen/Qwen3-4B:job_x") == "Qwen/Qwen3-4B"
    for bad in ("ft:YOUR_FT_MODEL_ID", "Qwen/Qwen3-4B"):
        with pytest.raises(m.ModelIdError):
            m.normalize_source(bad, "rl")
    with pytest.raises(m.ModelIdError, match="only model.source"):
        m.normalize_base("ft:Qwen/Qwen3-4B:job", "rl")
    with pytest.raises(m.ModelIdError):  # the base inside the id must allow the mode
        m.normalize_source("ft:Qwen/Qwen3-32B:job", "rl")


def test_a_synth_backend_id_is_refused_with_a_fix():
    """synth's own ids (ft:<base>:job_...) name weights on synth's backend: posttrain cannot find them, so
    they are refused up front (and the CRD's pattern refuses them at kubectl apply)."""
    with pytest.raises(m.ModelIdError, match="not a posttrain fine-tuned id") as err:
        m.normalize_source("ft:Qwen/Qwen3-4B:job_abc123", "rl")
    assert "rl:<base>:<namespace>.<name>.<uid8>" in (err.value.fix or "")
    for ok in ("ft:Qwen/Qwen3-4B:default.math-sft-full.7c1e2a9b", "s3://bucket/jobs/x/final/", "/models/m"):
        assert m.is_resolvable_source(ok), ok
    for bad in (
        "ft:Qwen/Qwen3-4B:job_abc123",
        "Qwen/Qwen3-4B",
        "ft:x",
        "s3://",
        "rl:Qwen/Qwen3-4B:a.b." + "x" * 9,
    ):
        assert not m.is_resolvable_source(bad), bad
    for base in ("Qwen/Qwen3-4B", "posttrain/tiny-random-qwen2", "/models/qwen", "s3://b/base/"):
        assert re.fullmatch(m.BASE_PATTERN, base), base
    for bad in ("{base}", "Qwen/Qwen3 4B", "a/b/../../c d", ""):
        assert not re.fullmatch(m.BASE_PATTERN, bad), bad
