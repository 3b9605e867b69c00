"""ReST-EM's pure parts: the E-step's keep rule (threshold, duplicates, cap per prompt), the M-step's loss
mask, the config, the operator's topology (no reference), and `filter` keeping the conversation history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from posttrain.api.convert import toml_to_cr
from posttrain.api.resources import parse_spec
from posttrain.api.restem import is_restem, to_sft_records
from posttrain.api.topology import rl_topology
from posttrain_trainer.restem_config import RestemConfigError, RestemTrainerConfig, parse_restem_config
from posttrain_trainer.restem_job import keep_samples, micro_batch_for, to_encoded
from posttrain_trainer.rollouts import EpisodeSequence, RolloutResult, RolloutSpec
from posttrain_trainer.sft_data import IGNORE_INDEX

REPO = Path(__file__).resolve().parents[2]


def _result(
    seed: int, group: int, index: int, reward: float, completion: list[int], ok: bool = True
) -> RolloutResult:
    seq = EpisodeSequence(
        prompt_ids=[1, 2, seed], completion_ids=completion, completion_mask=[1] * len(completion)
    )
    return RolloutResult(RolloutSpec(seed, group, index, f"c{seed}-{index}", "http://p"), ok, reward=reward,
                         sequences=[seq])  # fmt: skip


def test_keep_samples_applies_the_threshold_dedupes_and_caps():
    results = [
        _result(10, 0, 0, 1.0, [7, 8]),
        _result(10, 0, 1, 1.0, [7, 8]),  # the same answer again: kept once
        _result(10, 0, 2, 1.0, [9]),
        _result(10, 0, 3, 1.0, [5]),  # a third distinct right answer: over the cap of 2
        _result(11, 1, 0, 0.0, [4]),  # wrong
        _result(11, 1, 1, 1.0, [3], ok=False),  # failed rollout
        _result(12, 2, 0, 0.5, [6]),
    ]
    kept = keep_samples(results, threshold=1.0, max_per_prompt=2)
    assert [(k.seed, k.completion_ids) for k in kept] == [(10, [7, 8]), (10, [9])]
    assert [k.seed for k in keep_samples(results, threshold=0.5)] == [10, 10, 10, 12]


def test_the_m_step_trains_on_sampled_tokens_only():
    sample = keep_samples([_result(3, 0, 0, 1.0, [7, 8, 9])], threshold=1.0)[0]
    sample.completion_mask = [1, 0, 1]  # the middle token came from the environment
    [row] = to_encoded([sample])
    assert row.input_ids == [1, 2, 3, 7, 8, 9]
    assert row.labels == [IGNORE_INDEX] * 3 + [7, IGNORE_INDEX, 9]


def test_config_and_batch_split():
    text = (REPO / "examples" / "restem_math.toml").read_text()
    resource, _ = toml_to_cr(text, task_app="math")
    from posttrain.api.convert import spec_to_config

    config = spec_to_config(parse_spec("RLJob", resource["spec"]))
    assert is_restem(config)
    cfg = parse_restem_config(config)
    assert (cfg.iterations, cfg.prompts, cfg.samples_per_prompt) == (2, 24, 6)
    assert (cfg.reward_threshold, cfg.max_per_prompt, cfg.sft_epochs) == (1.0, 3, 2)
    assert len(cfg.eval_seeds) == 48 and min(cfg.eval_seeds) >= 1_000_000
    assert micro_batch_for(RestemTrainerConfig(sft_batch_size=8, micro_batch=3), 1) == 2
    assert micro_batch_for(RestemTrainerConfig(sft_batch_size=8, micro_batch=4), 2) == 4
    with pytest.raises(RestemConfigError):
        micro_batch_for(RestemTrainerConfig(sft_batch_size=7), 2)


def test_a_restem_rljob_gets_no_reference_server():
    """The operator renders rollout server + trainer for ReST-EM; a reference is never used (no KL)."""
    text = (REPO / "examples" / "restem_math.toml").read_text()
    text = text.replace(
        "gpus_for_vllm = 1\ngpus_for_training = 1",
        "gpus_for_vllm = 1\ngpus_for_training = 1\ngpus_for_ref = 1",
    )
    text = text.replace("gpu_count = 2", "gpu_count = 3")
    resource, warnings = toml_to_cr(text, task_app="math")
    assert any("ReST-EM uses no reference model" in w for w in warnings)
    spec = parse_spec("RLJob", resource["spec"])
    topo = rl_topology(spec.compute, spec.vllm, spec.reference, spec.algorithm)
    assert (topo.gpus_for_vllm, topo.gpus_for_training, topo.gpus_for_ref) == (1, 1, 0)


def test_filter_keeps_the_conversation_history():
    row = {"reward": 1, "messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
        {"role": "user", "content": "b"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "t"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "C"},
    ]}  # fmt: skip
    records = to_sft_records(row, 1)
    assert [[m["content"] for m in r["messages"]] for r in records] == [
        ["sys", "a", "A"],
        ["sys", "a", "A", "b", json.dumps([{"function": {"name": "f", "arguments": "{}"}}])],
        ["sys", "a", "A", "b", json.dumps([{"function": {"name": "f", "arguments": "{}"}}]), "t", "c", "C"],
    ]
    assert [r["messages"][-1]["role"] for r in records] == ["assistant"] * 3
