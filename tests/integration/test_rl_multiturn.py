"""Multi-turn RL end to end on real parts: the craftworld task app (examples/taskapps/craftworld) as a process,
the real rollout server (posttrain_rollout serve: vLLM CPU on the tiny random Qwen2, token capture per cid),
the trainer's own rollout client with synth's step-reward settings, and rl.py's update on the same weights.

What must hold:
  - episodes have more than one turn, and the decision rewards of the task app (info.meta.decision_rewards)
    reach the trainer, some of them non-zero;
  - the step_rewards block of the TOML reached the task app's request (the app echoes the settings it
    applied in metrics.details.stepwise);
  - the whole conversation's tokens are captured exactly: each decision's sampled tokens are trained (mask 1,
    exactly the tokens vLLM sampled for that call), every token in between (tool results, chat-template glue)
    is in the sequence with mask 0, and the sequence is the last call's prompt + completion;
  - per-decision credit gives per-token advantages, and rl.gspo_update trains them (GSPO-token)."""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

import httpx
import pytest
from fixtures.vllm import STOP_GRACE_S, start_rollout_server
from posttrain import reaper
from posttrain.api.rollout_settings import RolloutSettings
from posttrain.local.processes import ProcessSet
from posttrain.local.taskapp import start_taskapp
from posttrain.localhost import stop_group
from posttrain_trainer.rollouts import (
    RolloutClient,
    RolloutLoop,
    build_rollout_request,
    build_sequences,
    inference_url,
    plan_rollouts,
)
from posttrain_trainer.step_rewards import returns_to_go

REPO = Path(__file__).resolve().parents[2]
APP = REPO / "examples" / "taskapps" / "craftworld" / "app.py"
KEY = "sk_env_multiturn_test_1"
TURNS = 4
GROUP = 4


def _world_module():
    spec = importlib.util.spec_from_file_location("craftworld_world", APP.parent / "craftworld.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["craftworld_world"] = module
    spec.loader.exec_module(module)
    return module


W = _world_module()
# seeds that start where something can be gathered at once, so a random policy unlocks achievements
SEEDS = [s for s in range(200) if W.make_world(s, "train").area in ("forest", "lake")][:4]
CONFIG = {
    "rollout": {
        "env_name": "craftworld",
        "policy_name": "craftworld-react",
        "max_turns": TURNS,
        "max_concurrent_rollouts": 8,
        "env_config": {"max_steps_per_episode": TURNS},
        # the tiny model's vLLM has no tool parser: offer the tool, let it answer in text
        "policy_config": {"temperature": 1.0, "max_tokens": 12, "tool_choice": "none"},
    },
    "training": {
        "max_turns": TURNS,
        "step_rewards_enabled": True,
        "step_rewards_mode": "decision_stepwise",
        "step_rewards_strategy": "per_achievement",
        "step_rewards_indicator_lambda": 0.5,
        "step_rewards_beta": 0.0,
        "step_rewards_weights": {"collect_wood": 0.8, "collect_drink": 0.4},
        "step_rewards_k_limits": {"collect_wood": 2, "collect_drink": 3},
        "event_rewards_kind": "absolute",
    },
}


@pytest.fixture(scope="module")
def servers(vllm_model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("multiturn")
    proc, policy = start_rollout_server(Path(vllm_model_dir), run_dir, max_model_len=2048)
    try:
        with ProcessSet() as procs:
            url, _ = start_taskapp(procs, api_key=KEY, log_dir=run_dir, app_path=APP)
            yield url, policy
    finally:
        stop_group(proc, STOP_GRACE_S)
        reaper.unwatch(proc.pid)


@pytest.mark.timeout(900)
def test_multi_turn_episode_tokens_are_exact(servers, vllm_model_dir):
    """Episodes by hand: the app's conversation (full trace) against the rollout server's captures. One token
    per reply: a sampled token's text re-tokenises to itself about half the time with the tiny byte-level
    BPE, so some turns extend the previous call token for token (one sequence, environment tokens masked)
    and others start a new sequence; both must be exact."""
    from transformers import AutoTokenizer

    task_url, policy = servers
    tokenizer = AutoTokenizer.from_pretrained(str(vllm_model_dir))
    config = {**CONFIG, "rollout": {**CONFIG["rollout"], "policy_config": {**CONFIG["rollout"]["policy_config"],
                                                                          "max_tokens": 1}}}  # fmt: skip
    merged_total = 0
    for seed in SEEDS:
        cid = f"mt-exact-s{seed}-r0"
        body = build_rollout_request(
            settings=RolloutSettings.from_config(config),
            model=policy.served_model_name,
            run_id=cid,
            seed=seed,
            url=inference_url(policy.url, cid),
        )
        body["record"].update(return_trace=True, trace_format="full")
        response = httpx.post(f"{task_url}/rollout", json=body, headers={"X-API-Key": KEY}, timeout=600)
        assert response.status_code == 200, response.text
        data = response.json()
        captures = httpx.get(f"{policy.url}/v1/captures/{cid}", timeout=30).json()
        httpx.delete(f"{policy.url}/v1/captures/{cid}", timeout=30)
        steps = data["trajectories"][0]["steps"]
        assert len(steps) == TURNS == len(captures)
        assert all("decision_rewards" in s["info"]["meta"] for s in steps)
        # the TOML's step_rewards block reached the app: it echoes what it applied
        stepwise = data["metrics"]["details"]["stepwise"]
        assert (stepwise["mode"], stepwise["strategy"], stepwise["indicator_lambda"]) == (
            "decision_stepwise", "per_achievement", 0.5)  # fmt: skip
        assert stepwise["weights"] == {"collect_wood": 0.8, "collect_drink": 0.4}
        assert stepwise["k_limits"] == {"collect_wood": 2, "collect_drink": 3}
        messages = data["trace"]["markov_blanket_message_history"]
        assert messages[0]["role"] == "system" and sum(m["role"] == "assistant" for m in messages) == TURNS

        seqs = build_sequences(captures)
        # every policy token of every call is trained exactly once, attributed to its call
        trained = [
            [t for s in seqs for t, m, c in zip(s.completion_ids, s.completion_mask, s.call_index, strict=True)
             if m and c == i]
            for i in range(len(captures))
        ]  # fmt: skip
        assert trained == [c["completion_token_ids"] for c in captures]
        for seq in seqs:
            # a sequence = its last call's prompt + completion: nothing invented, nothing lost
            calls = sorted({c for c in seq.call_index if c >= 0})
            last = calls[-1]
            assert seq.prompt_ids + seq.completion_ids == (
                captures[last]["prompt_token_ids"] + captures[last]["completion_token_ids"]
            )
            assert seq.prompt_ids == captures[calls[0]]["prompt_token_ids"]
            if len(calls) > 1:
                merged_total += len(calls) - 1
                glue = [t for t, m in zip(seq.completion_ids, seq.completion_mask, strict=True) if not m]
                text = tokenizer.decode(glue)
                # the environment's replies (and the template's turn markers) are there, masked
                assert text.count("Result:") == len(calls) - 1 and "<|im_start|>" in text
    print(
        f"exact episodes: {len(SEEDS)} x {TURNS} calls, {merged_total} turns merged into their episode's sequence"
    )
    assert merged_total >= 1


@pytest.mark.timeout(900)
def test_trainer_runs_multi_turn_episodes_with_decision_credit(servers, vllm_model_dir):
    import torch
    from posttrain_trainer import distributed as D
    from posttrain_trainer.modeling import load_model_and_tokenizer
    from posttrain_trainer.optim import build_optimizer, build_scheduler
    from posttrain_trainer.rl import gspo_update, sequences_from_results
    from posttrain_trainer.rl_config import RLTrainerConfig

    task_url, policy = servers
    client = RolloutClient(task_url=task_url, settings=RolloutSettings.from_config(CONFIG), model=policy.served_model_name, api_key=KEY)
    started = time.perf_counter()
    results = []
    with RolloutLoop() as loop:
        for it in range(6):  # a random policy: a few iterations make a non-zero decision reward near certain
            specs = plan_rollouts("mt", it, SEEDS, GROUP, [policy.url])
            results += loop.collect(client, specs)
            if any(d for r in results for d in r.decision_rewards):
                break
    rollout_seconds = time.perf_counter() - started
    ok = [r for r in results if r.ok]
    assert len(ok) == len(results), [r.error for r in results if not r.ok][:3]
    assert all(r.turns == TURNS for r in ok)  # more than one turn: the whole budget of agent/env ops
    nonzero = [d for r in ok for d in r.decision_rewards if d]
    assert nonzero, "no decision reward in any episode"
    assert all(len(r.decision_rewards) == TURNS for r in ok)
    # decision rewards follow the TOML: absolute events, per_achievement weights x lambda 0.5
    assert set(nonzero) <= {0.5 * w for w in (0.8, 0.4, 1.0, 1.8, 1.2, 1.4, 2.0)} | {
        0.5 * k for k in range(1, 9)
    }

    last = results[-len(SEEDS) * GROUP :]
    seqs, stats = sequences_from_results(last)
    assert stats["mean_turns"] == TURNS
    tokens = [sum(len(s.prompt_ids) + len(s.completion_ids) for s in r.sequences) for r in last]
    conversation = [len(r.sequences[-1].prompt_ids) + len(r.sequences[-1].completion_ids) for r in last]
    policy_tokens = [sum(s.policy_tokens for s in r.sequences) for r in last]
    assert all(t > 0 for t in policy_tokens)
    credited = [s for s in seqs if s.token_advantages is not None]
    # credit compares a decision with the same turn of its group's other rollouts: there is some where they differ
    by_group: dict[int, list[list[float]]] = {}
    for r in last:
        if r.ok:
            by_group.setdefault(r.spec.group, []).append(returns_to_go(r.decision_rewards))
    if any(len({tuple(g) for g in togo}) > 1 for togo in by_group.values()):
        assert credited, "decision rewards gave no per-token credit"
        for s in credited:
            assert len(s.token_advantages) == len(s.completion_ids)

    # the update on the served weights: per-token advantages train through GSPO-token
    model, tokenizer = load_model_and_tokenizer(vllm_model_dir, trainer_mode="full", seed=0)
    cfg = RLTrainerConfig(batch_size=len(SEEDS), group_size=GROUP, learning_rate=1e-4, seed=0)
    optimizer = build_optimizer(model, lr=cfg.learning_rate)
    engine = D.build_engine(model, optimizer, build_scheduler(optimizer, total_steps=4, name="constant"),
                            cfg.parallel, max_grad_norm=cfg.max_grad_norm)  # fmt: skip
    before = [p.detach().clone() for p in model.parameters()]
    update_started = time.perf_counter()
    update = gspo_update(engine, seqs, cfg, tokenizer.pad_token_id, iteration=0) if seqs else None
    update_seconds = time.perf_counter() - update_started
    if seqs:
        assert update["optimizer_steps"] >= 1 and torch.isfinite(torch.tensor(update["loss"]))
        assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))
    print(
        f"multi-turn: {len(ok)} episodes, turns/episode {stats['mean_turns']}, decision rewards non-zero "
        f"{len(nonzero)} of {sum(len(r.decision_rewards) for r in ok)} (sum {sum(nonzero):.2f}), tokens/episode "
        f"{statistics.mean(conversation):.0f} (policy {statistics.mean(policy_tokens):.0f}; trained sequences "
        f"{statistics.mean(tokens):.0f}), sequences/episode "
        f"{statistics.mean(len(r.sequences) for r in last):.2f}, credited sequences {len(credited)}/{len(seqs)}, "
        f"rollouts {rollout_seconds:.1f} s, update {update_seconds:.1f} s"
    )
