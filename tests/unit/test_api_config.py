"""posttrain.api.config: every synth rule and lenient alias, one test that can fail each."""

from __future__ import annotations

import copy

import pytest
from posttrain.api.config import (
    EXACTLY_ONE_MODEL,
    EXACTLY_ONE_POLICY,
    ConfigError,
    infer_type,
    load_rl,
    load_sft,
    normalized_config,
    sft_trainer_mode,
)

RL = {
    "algorithm": {"type": "online", "method": "policy_gradient", "variety": "gspo"},
    "services": {"task_url": "http://t"},
    "compute": {
        "gpu_type": "H100",
        "gpu_count": 4,
        "topology": {"gpus_for_vllm": 2, "gpus_for_training": 1, "gpus_for_ref": 1, "tensor_parallel": 2},
    },  # fmt: skip
    "model": {"base": "Qwen/Qwen3-4B", "trainer_mode": "lora", "label": "x"},
    "rollout": {
        "env_name": "math",
        "policy_name": "p",
        "max_turns": 1,
        "episodes_per_batch": 8,
        "max_concurrent_rollouts": 2,
    },  # fmt: skip
    "training": {
        "num_epochs": 1,
        "iterations_per_epoch": 2,
        "max_turns": 1,
        "batch_size": 2,
        "group_size": 4,
        "learning_rate": 1e-5,
    },  # fmt: skip
}
SFT = {
    "algorithm": {"type": "offline", "method": "sft", "variety": "lora"},
    "job": {"model": "Qwen/Qwen3-4B", "data": "d.jsonl"},
    "hyperparameters": {"n_epochs": 1, "learning_rate": 1e-5},
}


@pytest.fixture(autouse=True)
def _no_experimental(monkeypatch):
    monkeypatch.delenv("SDK_EXPERIMENTAL", raising=False)
    monkeypatch.delenv("POSTTRAIN_EXPERIMENTAL", raising=False)


def rl(**changes):
    raw = copy.deepcopy(RL)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return raw


def sft(**changes):
    raw = copy.deepcopy(SFT)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = raw
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return raw


DELETE = object()


def problems(fn, raw) -> dict[str, str]:
    with pytest.raises(ConfigError) as err:
        fn(raw)
    return {p.field or "": p.message for p in err.value.problems}


def test_baseline_is_valid():
    config, warnings = load_rl(rl())
    assert warnings == []
    out = normalized_config(config)
    assert out["model"]["base"] == "Qwen/Qwen3-4B" and "policy" not in out
    config, _ = load_sft(sft())
    assert sft_trainer_mode(config) == "lora"


# ---------------------------------------------------------------------------- model / policy


def test_exactly_one_of_source_and_base():
    both = problems(load_rl, rl(model__source="rl:Qwen/Qwen3-4B:a.b.12345678"))
    assert (
        EXACTLY_ONE_MODEL in both["model.source, model.base"] and "both" in both["model.source, model.base"]
    )
    neither = problems(load_rl, rl(model__base=DELETE))
    assert "neither" in neither["model.source, model.base"]
    nothing = problems(load_rl, rl(model=DELETE))
    assert EXACTLY_ONE_MODEL in nothing["model.source, model.base"]


def test_policy_pair_rules():
    raw = rl(model=DELETE, policy={"model_name": "Qwen/Qwen3-4B", "source": "rl:Qwen/Qwen3-4B:a.b.c1",
                                   "trainer_mode": "lora", "label": "x"})  # fmt: skip
    assert problems(load_rl, raw)["policy.model_name, policy.source"] == EXACTLY_ONE_POLICY
    raw = rl(model=DELETE, policy={"trainer_mode": "lora", "label": "x"})
    assert EXACTLY_ONE_POLICY in problems(load_rl, raw)["policy.model_name, policy.source"]
    raw = rl(model=DELETE, policy={"model_name": "Qwen/Qwen3-4B", "trainer_mode": "lora", "label": "x"})
    assert normalized_config(load_rl(raw)[0])["model"]["base"] == "Qwen/Qwen3-4B"
    raw = rl(model=DELETE, policy={"source": "ft:Qwen/Qwen3-4B:a.b.c1", "trainer_mode": "lora", "label": "x"})
    assert normalized_config(load_rl(raw)[0])["model"]["source"] == "ft:Qwen/Qwen3-4B:a.b.c1"


def test_policy_model_alias_and_defaults():
    raw = rl(model=DELETE, policy={"model": "qwen/qwen3-4b", "trainer_mode": "full", "label": "x"})
    out = normalized_config(load_rl(raw)[0])
    assert out["model"] == {"base": "Qwen/Qwen3-4B", "trainer_mode": "full", "label": "x"}
    assert out["policy"] == {"max_tokens": 512, "temperature": 0.7, "top_p": 0.95, "repetition_penalty": 1.0}


def test_trainer_mode_and_label_required_and_typed():
    assert "model.trainer_mode" in problems(load_rl, rl(model__trainer_mode=DELETE))
    assert "model.label" in problems(load_rl, rl(model__label=DELETE))
    assert "model.trainer_mode" in problems(load_rl, rl(model__trainer_mode="dora"))


def test_model_allowlist_rules(monkeypatch):
    assert "unsupported" in problems(load_rl, rl(model__base="meta-llama/Llama-3-8B"))["model.base"]
    assert "sft" in problems(load_rl, rl(model__base="Qwen/Qwen3-32B"))["model.base"]
    assert "experimental" in problems(load_rl, rl(model__base="Qwen/Qwen3-4B-Thinking-2507"))["model.base"]
    monkeypatch.setenv("SDK_EXPERIMENTAL", "1")
    load_rl(rl(model__base="Qwen/Qwen3-4B-Thinking-2507"))
    assert "only model.source" in problems(load_rl, rl(model__base="ft:Qwen/Qwen3-4B:x"))["model.base"]
    bad_source = rl(model__base=DELETE, model__source="ft:YOUR_FT_MODEL_ID")
    assert "no known base" in problems(load_rl, bad_source)["model.source"]
    assert normalized_config(load_rl(rl(model__base="qwen/QWEN3-4b"))[0])["model"]["base"] == "Qwen/Qwen3-4B"


def test_vision_autofill_for_qwen3_vl():
    out = normalized_config(load_rl(rl(model__base="Qwen/Qwen3-VL-4B-Instruct"))[0])["model"]
    assert (out["supports_vision"], out["vision_processor_id"], out["max_images_per_message"]) == (
        True, "Qwen/Qwen3-VL-4B-Instruct", 1,
    )  # fmt: skip
    src = rl(model__base=DELETE, model__source="rl:Qwen/Qwen3-VL-8B-Thinking:ns.job.0123abcd")
    out = normalized_config(load_rl(src)[0])["model"]
    assert out["vision_processor_id"] == "Qwen/Qwen3-VL-8B-Thinking"
    kept = rl(model__base="Qwen/Qwen3-VL-4B-Instruct", model__max_images_per_message=3)
    assert normalized_config(load_rl(kept)[0])["model"]["max_images_per_message"] == 3
    plain = normalized_config(load_rl(rl())[0])["model"]
    assert "supports_vision" not in plain and "vision_processor_id" not in plain


def test_vision_autofill_warns_only_for_what_the_user_wrote():
    tiny = rl(model__base="posttrain/tiny-random-qwen2-vl", rollout__policy_config={"use_vision": True})
    config, warnings = load_rl(tiny)
    assert (config.model.supports_vision, config.model.max_images_per_message) == (True, 1)
    assert not [w for w in warnings if "vision" in w], warnings  # filled in: neither "no effect" nor "unsupported"
    assert not [w for w in load_rl(rl(model__base="Qwen/Qwen3-VL-4B-Instruct"))[1] if "vision" in w]
    written = rl(model__base="Qwen/Qwen3-VL-4B-Instruct", model__supports_vision=True)
    assert any(w.startswith("model.supports_vision: accepted") for w in load_rl(written)[1])


def test_vision_and_thinking_fields():
    raw = rl(rollout__policy_config={"image_only_mode": True, "use_vision": False})
    assert "rollout.policy_config.use_vision" in problems(load_rl, raw)
    raw = rl(rollout__image_only_mode=True, rollout__use_vision=False)
    assert "rollout.use_vision" in problems(load_rl, raw)
    _, warnings = load_rl(rl(rollout__policy_config={"use_vision": True}))
    assert any("vision" in w for w in warnings)
    assert "rollout.policy_config.thinking_mode" in problems(
        load_rl, rl(rollout__policy_config={"thinking_mode": "deep"})
    )
    assert "rollout.policy_config.thinking_budget" in problems(
        load_rl, rl(rollout__policy_config={"thinking_budget": 0})
    )
    out = normalized_config(
        load_rl(rl(rollout__policy_config={"thinking_mode": "think", "thinking_budget": 256}))[0]
    )
    assert out["rollout"]["policy_config"] == {"thinking_mode": "think", "thinking_budget": 256}
    assert "model.max_images_per_message" in problems(load_rl, rl(model__max_images_per_message=0))


# ---------------------------------------------------------------------------- algorithm


def test_rl_algorithm():
    assert "algorithm" in problems(load_rl, rl(algorithm__variety="grpo"))
    assert "algorithm" in problems(load_rl, rl(algorithm__type="offline"))
    assert "algorithm" in problems(load_rl, rl(algorithm__method="ppo"))
    assert "algorithm" in problems(load_rl, rl(algorithm=DELETE))
    out = normalized_config(load_rl(rl(algorithm={"variety": "gspo"}))[0])
    assert out["algorithm"] == {"type": "online", "method": "policy_gradient", "variety": "gspo"}
    out = normalized_config(load_rl(rl(algorithm__method="gspo"))[0])
    assert out["algorithm"]["method"] == "policy_gradient"


@pytest.mark.parametrize(
    ("algo", "ok"),
    [
        (("offline", "sft", "fft"), True),
        (("offline", "sft", "lora"), True),
        (("offline", "supervised_finetune", "fft"), True),
        (("offline", "supervised_finetune", "lora"), False),
        (("online", "sft", "fft"), False),
        (("offline", "sft", "dpo"), False),
    ],
)
def test_sft_algorithms(algo, ok):
    raw = sft(algorithm=dict(zip(("type", "method", "variety"), algo, strict=True)))
    if algo[2] == "fft":
        raw["hyperparameters"]["train_kind"] = "fft"
    if ok:
        load_sft(raw)
    else:
        assert "algorithm" in problems(load_sft, raw)


def test_sft_modes_fft_lora_qlora():
    assert sft_trainer_mode(load_sft(sft(algorithm__variety="fft"))[0]) == "full"
    assert sft_trainer_mode(load_sft(sft())[0]) == "lora"
    assert sft_trainer_mode(load_sft(sft(training={"use_qlora": True}))[0]) == "qlora"
    assert sft_trainer_mode(load_sft(sft(algorithm__variety="qlora"))[0]) == "qlora"
    assert "training.use_qlora" in problems(
        load_sft, sft(algorithm__variety="fft", training={"use_qlora": True})
    )
    assert "hyperparameters.train_kind" in problems(load_sft, sft(hyperparameters__train_kind="fft"))
    assert "training.mode" in problems(load_sft, sft(training={"mode": "full_finetune"}))
    assert "algorithm" in problems(load_sft, sft(algorithm=DELETE))


def test_sft_hyperparameter_rules():
    assert "hyperparameters.n_epochs" in problems(load_sft, sft(hyperparameters={"n_epochs": 0}))
    load_sft(sft(hyperparameters={"n_epochs": 0, "total_steps": 10}))
    assert "hyperparameters.warmup_ratio" in problems(load_sft, sft(hyperparameters__warmup_ratio=1.5))
    assert "hyperparameters.learning_rate" in problems(load_sft, sft(hyperparameters__learning_rate=0))
    assert "hyperparameters.train_kind" in problems(load_sft, sft(hyperparameters__train_kind="adapter"))
    out = normalized_config(load_sft(sft(hyperparameters=DELETE))[0])
    assert out["hyperparameters"] == {"n_epochs": 1}


def test_sft_job_rules():
    assert "job.model" in problems(load_sft, sft(job__model=DELETE))
    assert "job.model" in problems(load_sft, sft(job__model="gpt-4o"))
    out = normalized_config(load_sft(sft(job={"model": "Qwen/Qwen3-32B", "data_path": "x.jsonl"}))[0])
    assert out["job"] == {"model": "Qwen/Qwen3-32B", "data": "x.jsonl"}
    out = normalized_config(load_sft(sft(job__model="rl:qwen/qwen3-4b:ns.a.0011aabb"))[0])
    assert out["job"]["model"] == "rl:Qwen/Qwen3-4B:ns.a.0011aabb"
    assert "compute.nodes" in problems(
        load_sft, sft(compute={"gpu_type": "H100", "gpu_count": 3, "nodes": 2})
    )


# ---------------------------------------------------------------------------- topology


def test_topology_required_and_alias():
    assert "compute.topology" in problems(load_rl, rl(compute__topology=DELETE))
    raw = rl(compute__topology=DELETE)
    raw["topology"] = {
        "gpus_for_vllm": 2,
        "gpus_for_training": 2,
        "gpus_for_ref": 0,
        "type": "single_node_split",
    }
    out = normalized_config(load_rl(raw)[0])
    assert "topology" not in out and out["compute"]["topology"]["gpus_for_training"] == 2
    raw["compute"]["topology"] = {
        "gpus_for_training": 1,
        "gpus_for_ref": 1,
    }  # [compute.topology] wins per key
    assert normalized_config(load_rl(raw)[0])["compute"]["topology"]["gpus_for_training"] == 1


def test_topology_arithmetic():
    msg = problems(load_rl, rl(compute__gpu_count=5))["compute.topology"]
    assert "= 4 but compute.gpu_count = 5" in msg
    load_rl(
        rl(compute__gpu_count=5, compute__topology={"gpus_for_vllm": 2, "gpus_for_training": 2})
    )  # partial: no sum
    assert "compute.topology.tensor_parallel" in problems(load_rl, rl(compute__topology__tensor_parallel=4))
    assert "compute.nodes" in problems(load_rl, rl(compute__nodes=2))
    load_rl(rl(compute__gpu_count=5, compute__nodes=2, compute__topology__gpus_for_training=2))
    bad = rl(compute__gpu_count=6, compute__nodes=2, compute__topology__gpus_for_training=3)
    assert "compute.nodes" in problems(load_rl, bad)
    assert "vllm.tensor_parallel_size" in problems(load_rl, rl(vllm={"tensor_parallel_size": 1}))
    assert "compute.gpu_count" in problems(load_rl, rl(compute__gpu_count=0))
    assert "compute.gpu_type" in problems(load_rl, rl(compute__gpu_type=" "))


def test_reference_placement_precedence():
    out = normalized_config(load_rl(rl())[0])  # gpus_for_ref = 1 -> dedicated
    assert out["compute"]["topology"]["reference_placement"] == "dedicated"
    assert out["reference"]["placement"] == "dedicated"
    raw = rl(
        compute__topology__gpus_for_ref=0,
        compute__topology__gpus_for_training=2,
        reference={"placement": "shared"},
    )
    raw["compute"]["topology"]["reference_placement"] = "none"  # synth's injected default loses
    out = normalized_config(load_rl(raw)[0])
    assert out["compute"]["topology"]["reference_placement"] == "shared"
    raw = rl(compute__topology__gpus_for_ref=0, compute__topology__gpus_for_training=2)
    out = normalized_config(load_rl(raw)[0])
    assert (
        out["compute"]["topology"]["reference_placement"] == "none"
        and out["reference"]["placement"] == "none"
    )
    raw = rl(
        compute__topology__gpus_for_ref=0,
        compute__topology__gpus_for_training=2,
        reference={"placement": "dedicated"},
    )
    assert "compute.topology.gpus_for_ref" in problems(load_rl, raw)
    raw = rl(compute__topology__reference_placement="shared")  # an explicit non-"none" placement is kept
    assert normalized_config(load_rl(raw)[0])["compute"]["topology"]["reference_placement"] == "shared"


# ---------------------------------------------------------------------------- rollout / training / eval


def test_required_sections_and_keys():
    assert "rollout" in problems(load_rl, rl(rollout=DELETE))
    assert "rollout.env_name" in problems(load_rl, rl(rollout__env_name=""))
    assert "rollout.max_concurrent_rollouts" in problems(load_rl, rl(rollout__max_concurrent_rollouts=DELETE))
    assert "compute" in problems(load_rl, rl(compute=DELETE))
    for key in (
        "num_epochs",
        "iterations_per_epoch",
        "max_turns",
        "batch_size",
        "group_size",
        "learning_rate",
    ):
        assert f"training.{key}" in problems(load_rl, rl(**{f"training__{key}": DELETE}))
    load_rl(rl(training=DELETE))
    assert "evaluation.seeds" in problems(load_rl, rl(evaluation={"instances": 1, "every_n_iters": 1}))


def test_group_size_at_least_two_and_positive_learning_rate():
    assert "training.group_size" in problems(load_rl, rl(training__group_size=1))
    assert "training.learning_rate" in problems(load_rl, rl(training__learning_rate=0))
    assert "training.step_rewards_mode" in problems(load_rl, rl(training__step_rewards_mode="dense"))


def test_lora_alias_merges_into_training_lora():
    raw = rl(lora={"r": 8, "alpha": 16}, training__lora={"r": 32})
    out = normalized_config(load_rl(raw)[0])
    assert "lora" not in out and out["training"]["lora"] == {"r": 32, "alpha": 16}


# ---------------------------------------------------------------------------- judge / rubric


JUDGE = {"options": {"provider": "openai", "model": "gpt-4o-mini", "outcome": True}}


def test_judge_rules():
    load_rl(rl(judge=JUDGE))
    assert "judge.options.provider" in problems(
        load_rl, rl(judge={"options": {"provider": "anthropic", "model": "m"}})
    )
    raw = rl(judge={"options": {"provider": "groq", "model": "m", "event": False, "outcome": False}})
    assert "judge.options" in problems(load_rl, raw)
    assert "judge.reward_blend" in problems(
        load_rl, rl(judge={**JUDGE, "reward_blend": {"env": 0.0, "outcome": 0}})
    )
    assert "judge.reward_blend" in problems(load_rl, rl(judge={**JUDGE, "reward_blend": {"env": -1.0}}))
    _, warnings = load_rl(rl(judge={"enabled": False, "options": {"timeout_s": 3}}))
    assert warnings == []  # disabled: no warning
    _, warnings = load_rl(rl(judge={"options": {"timeout_s": 3}}))
    assert any("no judge" in w for w in warnings)


def test_verifier_aliases_merge():
    raw = rl(verifier=JUDGE, services__verifier_url="http://v")
    out = normalized_config(load_rl(raw)[0])
    assert "verifier" not in out and out["judge"]["options"]["provider"] == "openai"
    assert out["services"]["judge_url"] == "http://v" and "verifier_url" not in out["services"]


def test_rubric_rules():
    assert "rubric.weights" in problems(load_rl, rl(rubric={"weights": {"env": 0, "event": 0, "outcome": 0}}))
    assert "rubric.weights.env" in problems(load_rl, rl(rubric={"weights": {"env": -1}}))
    _, warnings = load_rl(rl(rubric={"enabled": True}))
    assert any("rubric" in w for w in warnings)


# ---------------------------------------------------------------------------- unknown keys / misc


def test_unknown_keys_kept_everywhere_and_smoke_dropped():
    raw = rl(smoke={"max_steps": 2}, data={"seed_start": 5}, training__my_knob=[1, 2],
             compute__topology__gpus_per_node=8, rollout__policy_config={"custom": {"a": 1}})  # fmt: skip
    out = normalized_config(load_rl(raw)[0])
    assert "smoke" not in out and out["data"] == {"seed_start": 5}
    assert out["training"]["my_knob"] == [1, 2]
    assert out["compute"]["topology"]["gpus_per_node"] == 8
    assert out["rollout"]["policy_config"]["custom"] == {"a": 1}


def test_tags_become_strings():
    out = normalized_config(load_rl(rl(tags={"n": 3, "on": True, "s": "x"}))[0])
    assert out["tags"] == {"n": "3", "on": "true", "s": "x"}


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        ({"algorithm": {"method": "policy_gradient"}}, "rl"),
        ({"algorithm": {"type": "online"}}, "rl"),
        ({"algorithm": {"variety": "grpo"}}, "rl"),
        ({"job_type": "rl"}, "rl"),
        ({"services": {"task_url": "x"}}, "rl"),
        ({"algorithm": {"type": "offline", "method": "sft"}}, "sft"),
        ({"job": {"model": "Qwen/Qwen3-4B"}}, "sft"),
        ({"hyperparameters": {"n_epochs": 1}}, "sft"),
        ({"tags": {}}, None),
    ],
)
def test_infer_type(raw, kind):
    assert infer_type(raw) == kind


def test_fsdp_is_one_sharding_of_gspo_full_fine_tuning():
    full = {"model__trainer_mode": "full"}
    config, warnings = load_rl(rl(**full, training__parallelism={"fsdp": True}))
    assert config.training.parallelism.fsdp and warnings == []
    both = problems(load_rl, rl(**full, training__parallelism={"fsdp": True, "use_deepspeed": True}))
    assert "use_deepspeed" in both["training.parallelism.fsdp"]
    lora = problems(load_rl, rl(training__parallelism={"fsdp": True}))
    assert 'trainer_mode = "lora"' in lora["training.parallelism.fsdp"]
    _, warnings = load_sft(sft(hyperparameters__parallelism={"fsdp": True}))
    assert any(w.startswith("hyperparameters.parallelism.fsdp") for w in warnings), warnings
    restem = rl(**full, training__parallelism={"fsdp": True}, algorithm__variety="restem", algorithm__method=DELETE)
    _, warnings = load_rl(restem)
    assert any(w.startswith("training.parallelism.fsdp: ReST-EM") for w in warnings), warnings
