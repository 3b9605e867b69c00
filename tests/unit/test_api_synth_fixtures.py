"""Configs shaped like synth-ai's shipped examples (tests/unit/fixtures/synth): strict ones pass, lenient ones
pass through the aliases (synth's CLI rejects them), invalid ones fail with field paths and TOML lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from posttrain.api.config import normalized_config
from posttrain.api.convert import config_to_spec, load, spec_to_config
from posttrain.api.resources import JOB_KINDS, parse_spec
from posttrain.errors import UserError

FIXTURES = Path(__file__).parent / "fixtures" / "synth"
PASSING = sorted((FIXTURES / "strict").glob("*.toml")) + sorted((FIXTURES / "lenient").glob("*.toml"))


def _load(rel: str):
    path = FIXTURES / rel
    return load(path.read_text(), file=str(path))


@pytest.mark.parametrize("path", PASSING, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_fixture_loads_and_round_trips(path):
    kind, config, _ = load(path.read_text(), file=str(path))
    spec = config_to_spec(config, kind)
    if kind == "rl" and "taskApp" not in spec:
        spec["taskApp"] = {"name": "t"}
    assert spec_to_config(parse_spec(JOB_KINDS[kind], spec)) == normalized_config(config)


def test_rl_from_base_qwen4b_reference_placement_and_topology_alias():
    kind, config, warnings = _load("strict/rl_from_base_qwen4b.toml")
    out = normalized_config(config)
    assert kind == "rl" and "topology" not in out
    topo = out["compute"]["topology"]
    assert topo == {"type": "single_node_split", "gpus_for_vllm": 4, "gpus_for_training": 3, "gpus_for_ref": 1,
                    "tensor_parallel": 4, "reference_placement": "dedicated"}  # fmt: skip
    assert out["reference"]["placement"] == "dedicated" and out["reference"]["port"] == 8002
    assert out["rollout"]["task_app_origin_rewards_only"] is True  # unknown key kept
    assert out["training"]["weight_sync"]["weight_sync_interval"] == 1  # unknown nested key kept
    # synth keys posttrain accepts without effect are named, with the reason (posttrain.api.inert)
    assert [w.split(":")[0].split(" = ")[0] for w in warnings] == [
        "rollout.task_app_origin_rewards_only", "reference.health_interval_ms", "reference.health_max_wait_s",
        "reference.port", "rollout.batches_per_step",
    ]  # fmt: skip


def test_hosted_judge_deprecated_options_stripped_and_timeout_migrated():
    _, config, warnings = _load("strict/crafter_rl_stepwise_hosted_judge.toml")
    out = normalized_config(config)
    options = out["judge"]["options"]
    assert "max_concurrency" not in options and "tracks" not in options
    assert options["timeout_s"] == 45
    assert sum("deprecated" in w for w in warnings) == 2
    assert out["training"]["lora"]["r"] == 16 and "lora" not in out  # [lora] -> [training.lora]
    assert out["services"]["judge_url"] == "https://judge.example"
    criteria = options["rubric_overrides"]["event"]["criteria"]
    assert criteria[0]["id"] == "progress.unique_achievements"
    assert out["rollout"]["env_config"]["step_rewards"]["mode"] == "decision_stepwise"


def test_sft_strict_fixtures():
    kind, config, _ = _load("strict/crafter_fft_4b.toml")
    out = normalized_config(config)
    assert kind == "sft" and out["algorithm"]["method"] == "supervised_finetune"
    assert out["hyperparameters"]["parallelism"]["deepspeed_stage"] == 3
    assert out["data"]["validation_path"] == "ft_data/crafter_validation.jsonl"


def test_vlm_sft_lora_keys_and_nested_eval_keys_are_lifted():
    _, config, warnings = _load("strict/crafter_vlm_sft_example.toml")
    out = normalized_config(config)
    assert out["training"]["lora"] == {"r": 16, "alpha": 32, "dropout": 0.05,
                                       "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "mm_projector"]}  # fmt: skip
    assert not any(k.startswith("lora_") for k in out["hyperparameters"])
    assert out["hyperparameters"]["eval_steps"] == 100
    assert "eval_steps" not in out["hyperparameters"]["parallelism"]
    assert any("lora_" in w for w in warnings)


def test_policy_model_alias_becomes_model_section():
    _, config, _ = _load("lenient/rl_policy_model.toml")
    out = normalized_config(config)
    assert out["model"] == {"base": "Qwen/Qwen3-1.7B", "trainer_mode": "lora", "label": "math-single-step"}
    assert (
        out["policy"]["max_tokens"] == 256
        and "model" not in out["policy"]
        and "model_name" not in out["policy"]
    )
    assert out["data"]["episodes_per_iteration"] == 1280  # untyped [data] kept
    assert out["compute"]["topology"]["reference_placement"] == "dedicated"  # gpus_for_ref = 1


def test_vision_incomplete_judge_is_no_judge_with_warning():
    _, config, warnings = _load("lenient/crafter_rl_vision_qwen3vl4b.toml")
    assert any("no judge" in w for w in warnings)
    out = normalized_config(config)
    assert out["model"]["vision_processor_id"] == "Qwen/Qwen3-VL-4B-Instruct"
    assert out["model"]["max_images_per_message"] == 1
    assert out["vllm"]["limit_mm_per_prompt"] == {"image": 1}


def test_new_format_judge_without_options():
    _, config, warnings = _load("lenient/crafter_rl_stepwise_simple_NEW_FORMAT.toml")
    assert any("no judge" in w for w in warnings)
    assert normalized_config(config)["judge"]["reward_blend"] == {"env": 1.0, "event": 0.0, "outcome": 0.0}


def test_verifier_aliases():
    _, config, _ = _load("lenient/verifier_format.toml")
    out = normalized_config(config)
    assert "verifier" not in out and out["judge"]["options"]["provider"] == "groq"
    assert out["services"] == {"task_url": "https://crafter.example", "judge_url": "https://verifier.example"}


def test_qlora_variety_alias():
    _, config, warnings = _load("lenient/crafter_lora_qwen0p6b.toml")
    out = normalized_config(config)
    assert out["algorithm"]["variety"] == "lora" and out["training"]["use_qlora"] is True
    assert any("qlora" in w for w in warnings)
    _, config, _ = _load("lenient/qwen3_32b_qlora_4xh100.toml")
    out = normalized_config(config)
    assert out["job"] == {"model": "Qwen/Qwen3-32B", "data": "data/train.jsonl"}
    assert out["training"]["use_qlora"] is True


def test_rl_from_ft_template_fails_with_lines():
    path = FIXTURES / "invalid" / "rl_from_ft.toml"
    with pytest.raises(UserError) as err:
        load(path.read_text(), file=str(path))
    text = "\n".join(str(p) for p in err.value.problems)
    assert "[algorithm] is required" in text
    assert "model.source, model.base" in text and "exactly one of [model].source or [model].base" in text
    lines = {p.field: p.line for p in err.value.problems}
    assert lines["model.source, model.base"] == 16  # the [model] header
