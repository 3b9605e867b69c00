"""Vision RL end to end on CPU: the shapes task app (examples/taskapps/shapes, a process on 127.0.0.1) sends
Pillow-drawn PNGs as image_url data: URIs through the real rollout server to real vLLM (CPU backend) serving a
tiny random Qwen2-VL (head_dim 32, fp32); the trainer rebuilds the pixel values with the model's processor.

What must hold:
  - the rollout server applies max_images_per_step (the oldest image dropped first) before vLLM sees the
    request, fetches http image URLs once and sends them on as data: URIs, and captures vLLM's exact prompt
    ids (image pad tokens included) with the image it was given;
  - the trainer's fp32 logprobs of the sampled tokens match vLLM's (KL and the largest |delta| reported,
    asserted small), and they depend on the image: the wrong image gives a much larger mismatch;
  - a few GSPO iterations through rl.train (the trainer's own loop): weights synced to vLLM every iteration,
    the sampler mismatch reported every iteration, and the policy's logprobs on an image prompt moved."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from fixtures.vllm import STOP_GRACE_S, RolloutServer, start_rollout_server
from posttrain.api.rollout_settings import RolloutSettings
from posttrain.local.processes import ProcessSet
from posttrain.local.taskapp import start_taskapp
from posttrain.localhost import stop_group

REPO = Path(__file__).resolve().parents[2]
SHAPES_APP = REPO / "examples" / "taskapps" / "shapes" / "app.py"
KEY = "sk_env_test_shapes_taskapp_0001"

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def shapes_taskapp(tmp_path_factory) -> Iterator[str]:
    with ProcessSet() as procs:
        url, _ = start_taskapp(
            procs, api_key=KEY, log_dir=tmp_path_factory.mktemp("shapes"), app_path=SHAPES_APP
        )
        yield url


@pytest.fixture(scope="module")
def vl_server(vllm_vl_model_dir, tmp_path_factory) -> Iterator[RolloutServer]:
    from posttrain import reaper

    extra = ["--dtype", "float32", "--max-images-per-step", "1"]
    proc, server = start_rollout_server(
        Path(vllm_vl_model_dir), tmp_path_factory.mktemp("rollout-vl"), extra=extra
    )
    try:
        yield server
    finally:
        stop_group(proc, STOP_GRACE_S)
        reaper.unwatch(proc.pid)


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(env_config: dict, iterations: int = 1) -> dict:
    return {
        "rollout": {
            "env_name": "shapes",
            "policy_name": "shapes",
            "max_turns": 1,
            "env_config": env_config,
            "policy_config": {"temperature": 1.0, "max_tokens": 6, "use_vision": True},
        },
        "training": {
            "num_epochs": 1,
            "iterations_per_epoch": iterations,
            "batch_size": 2,
            "group_size": 4,
            "learning_rate": 5e-3,
            "num_minibatches": 1,
        },
        "model": {"supports_vision": True},
    }


def _trainer_logprobs(model, seqs, processor, images=None):
    from posttrain_trainer import gspo
    from posttrain_trainer.rl import TrainSeq, _collate

    rows = [
        TrainSeq(s.prompt_ids, s.completion_ids, s.completion_mask, 0.0, images=list(images or s.images))
        for s in seqs
    ]
    batch = _collate(rows, 0, processor)
    with torch.no_grad():
        lp = gspo.token_logprobs(
            model, batch.input_ids, batch.attention_mask, model_inputs=batch.model_inputs
        )
    sampler = batch.completion_values([s.sampling_logprobs for s in seqs])
    mask = batch.loss_mask
    delta = (lp - sampler) * mask
    kl = float(((torch.exp(delta) - 1 - delta) * mask).sum() / mask.sum())
    return kl, float(delta.abs().max())


def test_images_reach_vllm_and_trainer_logprobs_match(
    vl_server, shapes_taskapp, vllm_vl_model_dir, one_thread
):
    from posttrain_trainer.modeling import load_model_and_tokenizer, load_processor
    from posttrain_trainer.rl_vision import drop_sampled_media_tokens, media_token_ids
    from posttrain_trainer.rollouts import RolloutClient, RolloutLoop, plan_rollouts

    sys.path.insert(0, str(SHAPES_APP.parent))
    import app as shapes  # noqa: PLC0415 - the task app's own picture(), to know which frame is newest

    sys.path.pop(0)
    config = _config({"frames": 2, "images": "url"})  # http URLs: the rollout server inlines what it fetched
    client = RolloutClient(
        task_url=shapes_taskapp, settings=RolloutSettings.from_config(config), model=vl_server.served_model_name, api_key=KEY
    )
    with RolloutLoop() as loop:
        results = loop.collect(client, plan_rollouts("vis", 0, [0, 1, 2], 2, [vl_server.url]))
    assert [r.error for r in results if not r.ok] == []
    processor = load_processor(vllm_vl_model_dir)
    pad = processor.image_token_id
    seqs = [s for r in results for s in r.sequences]
    # a random policy samples the pad token itself now and then: such sequences are left out (rl_vision)
    seqs, _ = drop_sampled_media_tokens(seqs, media_token_ids(processor))
    for r in results:
        (s,) = r.sequences
        newest = shapes.picture(r.spec.seed, 1, 56)[2]
        assert s.images == [newest]  # 2 frames sent, max_images_per_step = 1 kept the newest
        assert s.prompt_ids.count(pad) == 4  # 56x56 px = 16 patches of 14 -> 4 tokens after the 2x2 merge
        assert s.logprobs_captured and len(s.sampling_logprobs) == len(s.completion_ids) > 0

    model, _ = load_model_and_tokenizer(vllm_vl_model_dir, dtype=torch.float32)
    model.eval()
    kl, max_delta = _trainer_logprobs(model, seqs, processor)
    blank = shapes.picture(999, 0, 56)[2]
    wrong_kl, wrong_max = _trainer_logprobs(model, seqs, processor, images=[blank])
    print(f"vision sampler/trainer fp32: KL {kl:.2e}, max |delta logprob| {max_delta:.2e}; "
          f"other image: KL {wrong_kl:.2e}, max {wrong_max:.2e}")  # fmt: skip
    assert max_delta < 1e-3 and kl < 1e-6
    assert wrong_max > 10 * max_delta  # the logprobs depend on the image the trainer gives the model


def test_gspo_on_images_syncs_weights_and_moves_image_logprobs(
    vl_server, shapes_taskapp, vllm_vl_model_dir, tmp_path, one_thread, monkeypatch
):
    from posttrain.api.jobfile import JobFile
    from posttrain_trainer import rl
    from posttrain_trainer.modeling import load_model_and_tokenizer, load_processor
    from posttrain_trainer.rl_vision import drop_sampled_media_tokens, media_token_ids
    from posttrain_trainer.rollouts import RolloutClient, RolloutLoop, plan_rollouts

    monkeypatch.setenv("ENVIRONMENT_API_KEY", KEY)
    iterations = 3
    config = _config({"reward": "partial"}, iterations)
    config["training"]["weight_sync_interval"] = 1
    # fp32 end to end (no bf16 autocast, weights synced in fp32 to the fp32 server): the sampler/trainer
    # mismatch is then rounding noise in every iteration, also after each weight sync
    config["training"]["parallelism"] = {"bf16": False}
    uid = str(uuid.uuid4())
    job = JobFile.model_validate(
        {
            "kind": "rl",
            "job": {"name": "vision-rl", "namespace": "test", "uid": uid},
            "config": config,
            "base_model": vl_server.served_model_name,  # the name the fixture serves it under
            "model_path": str(vllm_vl_model_dir),
            "task_app": {"url": shapes_taskapp},
            "endpoints": {"policy": [vl_server.url]},
            "weight_sync": {"via": "path", "shared_dir": str(tmp_path / "weights")},
            "report": {"mode": "file", "path": str(tmp_path / "report.jsonl")},
            "workdir": str(tmp_path / "work"),
        }
    )
    # a fixed image prompt, sampled from the served base weights, to measure the policy before and after
    client = RolloutClient(
        task_url=shapes_taskapp, settings=RolloutSettings.from_config(_config({})), model=vl_server.served_model_name, api_key=KEY
    )
    processor = load_processor(vllm_vl_model_dir)
    media = media_token_ids(processor)

    def probe(iteration: int):
        """Seed 7's picture, sampled; retried while the policy samples a pad token (left out in training)."""
        for attempt in range(5):
            with RolloutLoop() as loop:
                (result,) = loop.collect(
                    client, plan_rollouts(f"probe{attempt}", iteration, [7], 1, [vl_server.url])
                )
            assert result.ok, result.error
            kept, _ = drop_sampled_media_tokens(result.sequences, media)
            if kept:
                return kept[0]
        raise AssertionError("the policy sampled a pad token in 5 probes")

    before_seq = probe(0)
    base, _ = load_model_and_tokenizer(vllm_vl_model_dir, dtype=torch.float32)

    metrics = rl.train(job)
    assert metrics["iterations"] == iterations

    lines = [json.loads(x) for x in (tmp_path / "report.jsonl").read_text().splitlines() if x.strip()]
    events = [x for x in lines if x.get("event") == "iteration"]
    syncs = [x for x in lines if x.get("event") == "weight_sync"]
    assert len(events) == iterations and len(syncs) == iterations - 1
    progress = [
        x["progress"] for x in lines if "progress" in x and x["progress"].get("samplerKl") is not None
    ]
    assert progress and all(p["samplerMaxAbsDelta"] < 1e-3 for p in progress)  # also in status.progress
    assert all(isinstance(e["media_tokens_sampled"], int) for e in events)
    trained_in = [e for e in events if e["train_sequences"]]  # a group of equal rewards trains nothing
    assert len(trained_in) >= 2
    for e in trained_in:
        print(f"iteration {e['step']}: sampler KL {e['sampler_kl']:.2e} max |delta| "
              f"{e['sampler_max_abs_delta']:.2e} mismatch {e['sampler_mismatch']:.2e}")  # fmt: skip
        assert e["sampler_kl"] < 1e-6 and e["sampler_max_abs_delta"] < 1e-3
    assert httpx.get(f"{vl_server.url}/v1/weights", timeout=10).json()["weight_version"] == iterations - 1

    final = Path(tmp_path / "work" / "final")
    trained, _ = load_model_and_tokenizer(final if final.exists() else vllm_vl_model_dir, dtype=torch.float32)
    assert final.exists() and load_processor(final).image_token_id == processor.image_token_id
    before = _row_logprobs(base, before_seq, processor)
    after = _row_logprobs(trained, before_seq, processor)
    moved = float((after - before).abs().max())
    print(f"image prompt logprobs moved by up to {moved:.3f} after {iterations} GSPO iterations")
    assert moved > 1e-2

    # the probe's image again, after the syncs: vLLM must not reuse (or lose) its encoder output of the old
    # weights (vLLM 0.32 killed its engine here, "Encoder cache miss", until the sync reset that cache), and
    # the served policy is the last synced one (the weights after iteration 2; the last update is not synced)
    seq = probe(1)
    served = torch.tensor(seq.sampling_logprobs)
    synced, _ = load_model_and_tokenizer(tmp_path / "weights" / f"v{iterations - 1}", dtype=torch.float32)
    assert float((_row_logprobs(synced, seq, processor) - served).abs().max()) < 1e-3
    assert float((_row_logprobs(base, seq, processor) - served).abs().max()) > 1e-2


def _row_logprobs(model, seq, processor):
    from posttrain_trainer import gspo
    from posttrain_trainer.rl import TrainSeq, _collate

    batch = _collate([TrainSeq(seq.prompt_ids, seq.completion_ids, seq.completion_mask, 0.0, images=seq.images)], 0,
                     processor)  # fmt: skip
    with torch.no_grad():
        lp = gspo.token_logprobs(
            model, batch.input_ids, batch.attention_mask, model_inputs=batch.model_inputs
        )
    return lp[batch.loss_mask.bool()]
