"""The local runner's pure parts and its process handling (real child processes, stopped by process group)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from posttrain.errors import UserError
from posttrain.local import models, runner
from posttrain.local.processes import ProcessFailed, ProcessSet


def test_fine_tuned_id_resolves_to_the_earlier_jobs_final_folder():
    model_id = "rl:HuggingFaceTB/SmolLM2-135M-Instruct:local.demo-rl.1a2b3c4d"
    resolved = models.resolve_model(None, model_id, bucket="posttrain")
    assert resolved.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolved.model_path == "s3://posttrain/jobs/local/demo-rl-1a2b3c4d/final/"
    assert resolved.source_id == model_id
    with pytest.raises(UserError):
        models.resolve_model(None, "ft:YOUR_FT_MODEL_ID", bucket="b")


def test_unknown_base_without_weights_is_a_user_error(tmp_path):
    with pytest.raises(UserError) as err:
        models.resolve_model("Qwen/Qwen3-4B", None, bucket="b")
    assert "--model-path" in str(err.value)
    assert models.resolve_model(
        "Qwen/Qwen3-4B", None, bucket="b", model_path=str(tmp_path)
    ).model_path == str(tmp_path)


def test_the_tiny_vision_model_is_a_base_the_runner_builds_for_vllm(tmp_path, monkeypatch):
    from posttrain.api import model_ids

    vl = "posttrain/tiny-random-qwen2-vl"
    assert model_ids.normalize_base(vl, "rl") == vl
    monkeypatch.setattr(models, "MODELS_DIR", tmp_path)
    resolved = models.resolve_model(vl, None, bucket="b")
    assert resolved.model_path == str(tmp_path / "tiny-random-qwen2-vl-hd32")
    config = json.loads((tmp_path / "tiny-random-qwen2-vl-hd32" / "config.json").read_text())
    text = config.get("text_config") or config
    # vLLM's CPU attention rejects head_dim 16 (the builder's default hidden size 64 over 4 heads)
    assert text["hidden_size"] // text["num_attention_heads"] == 32, text
    assert (tmp_path / "tiny-random-qwen2-vl-hd32" / "processor_config.json").is_file()


def test_model_fields_and_reference_detection():
    rl = {"model": {"base": "b", "label": "My Run"}, "reference": {"placement": "dedicated"}}
    assert runner.model_fields("rl", rl) == ("b", None, "My Run")
    assert runner.needs_reference(rl)
    assert not runner.needs_reference(
        {"compute": {"topology": {"reference_placement": "none", "gpus_for_ref": 0}}}
    )
    assert runner.needs_reference({"compute": {"topology": {"gpus_for_ref": 1}}})
    assert runner.needs_reference({"reference": {"placement": "shared"}})  # on one machine: a server too
    assert runner.model_fields("sft", {"job": {"model": "m"}}) == ("m", None, None)
    assert runner.model_fields("rl", {"policy": {"source": "ft:b:ns.n.12345678", "label": "x"}})[
        1
    ].startswith("ft:")
    assert runner.slug("My Run_01!") == "my-run-01"


def test_progress_lines_and_report_reading(tmp_path):
    line = runner.format_progress({"step": 3, "total": 10, "meanReturn": 0.4567, "loss": 0.1})
    assert line == "step 3/10  mean_return 0.4567  loss 0.1"
    assert runner.format_progress({"step": 1, "loss": -0.0}) == "step 1  loss 0"
    detail = runner.format_iteration(
        {"event": "iteration", "step": 2, "rollouts": 64, "failed_rollouts": 1, "groups": 8, "mixed_groups": 3,
         "train_sequences": 24, "grad_norm": 0.3851, "clip_fraction": 0.0, "rollout_seconds": 11.59,
         "update_seconds": 21.1, "weight_sync_seconds": None}
    )  # fmt: skip
    assert detail == (
        "rollouts 64, 1 failed, mixed groups 3/8, trained 24 seqs, grad_norm 0.385, clipped 0% | "
        "rollout 11.6 s, update 21.1 s, sync - s"
    )
    judged = runner.format_iteration(
        {"rollouts": 4, "failed_rollouts": 1, "groups": 2, "judged": 3, "judge_failed": 1}
    )
    assert judged.startswith(
        "rollouts 4, 1 failed, judged 3 (1 without a judge score, left out), mixed groups"
    )
    assert runner.format_progress({"step": 2, "judgeFailed": 1}) == "step 2  judge_failed 1"
    cut = runner.format_iteration({"rollouts": 8, "truncated": 3, "empty_responses": 1, "groups": 2})
    assert cut.startswith("rollouts 8, 3 cut at max_tokens, 1 empty, mixed groups")
    turns = runner.format_iteration({"rollouts": 8, "groups": 2, "mean_turns": 3.0, "decision_rewards_nonzero": 2,
                                     "decision_reward_sum": 1.25})  # fmt: skip
    assert turns.startswith("rollouts 8, 3.0 turns/episode, decision rewards 2 non-zero (sum 1.25), mixed groups")
    assert "turns/episode" not in runner.format_iteration({"rollouts": 8, "mean_turns": 1.0})
    packed = runner.format_iteration({"rollouts": 64, "groups": 8, "mixed_groups": 8, "train_sequences": 64,
                                      "forward_positions": 1890, "padded_positions": 3904})  # fmt: skip
    assert "trained 64 seqs (packed: 1,890 of 3,904 positions), grad_norm" in packed
    assert "packed" not in runner.format_iteration({"rollouts": 8, "forward_positions": 90, "padded_positions": 90})
    # dynamic sampling: the groups it rolled out to find the batch's groups with signal, and its rounds
    refilled = runner.format_iteration({"rollouts": 64, "groups": 8, "mixed_groups": 8, "groups_sampled": 19,
                                        "sampling_rounds": 3})  # fmt: skip
    assert "mixed groups 8/8 (19 sampled, 3 rounds), trained" in refilled
    one = runner.format_iteration({"rollouts": 64, "groups": 8, "mixed_groups": 8, "groups_sampled": 8,
                                   "sampling_rounds": 1})  # fmt: skip
    assert "mixed groups 8/8 (8 sampled, 1 round), trained" in one
    assert "sampled" not in runner.format_iteration({"rollouts": 64, "groups": 8, "mixed_groups": 8})
    report = tmp_path / "report.jsonl"
    report.write_text(json.dumps({"progress": {"step": 1}}) + "\n" + '{"result": {"fine_tuned')
    offset, lines = runner._read_report(report, 0)
    assert lines == [{"progress": {"step": 1}}]
    with report.open("a") as handle:
        handle.write('_model": "ft:x"}}\n')
    offset, lines = runner._read_report(report, offset)
    assert lines == [{"result": {"fine_tuned_model": "ft:x"}}]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except OSError:
        return False


def test_process_set_stops_children_and_grandchildren(tmp_path):
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    with ProcessSet() as procs:
        proc = procs.start("sleeper", [sys.executable, "-c", script], tmp_path / "sleeper.log")
        deadline = time.time() + 20
        while time.time() < deadline and not (tmp_path / "sleeper.log").read_text().strip():
            time.sleep(0.1)
        grandchild = int((tmp_path / "sleeper.log").read_text().split()[0])
        assert _alive(proc.pid) and _alive(grandchild)
    assert not _alive(proc.pid)
    time.sleep(0.2)
    assert not _alive(grandchild)


def test_exited_child_is_reported_with_its_log(tmp_path):
    with ProcessSet() as procs:
        proc = procs.start(
            "broken", [sys.executable, "-c", "print('boom'); raise SystemExit(3)"], tmp_path / "b.log"
        )
        proc.wait(20)
        with pytest.raises(ProcessFailed) as err:
            procs.check_alive()
    assert "code 3" in str(err.value) and "boom" in str(err.value)


def test_demo_chains_the_sft_model_into_the_rl_config(tmp_path):
    import tomllib

    from posttrain.local import demo
    from posttrain.local.evaluate import parse_seeds

    ft = "ft:HuggingFaceTB/SmolLM2-135M-Instruct:local.demo-sft.1a2b3c4d"
    out = demo.chained_config(demo.DEMO_DIR / "rl.toml", ft, tmp_path / "rl.toml")
    model = tomllib.loads(out.read_text())["model"]
    assert model["source"] == ft and "base" not in model
    assert parse_seeds("1000000-1000003,7") == [1000000, 1000001, 1000002, 1000003, 7]


def test_demo_reward_curve_has_one_point_per_iteration(tmp_path):
    from posttrain.local import demo

    rows = [{"progress": {"step": 1, "total": 2, "meanReturn": 0.1}}, {"event": "weight_sync"},
            {"progress": {"step": 2, "total": 2, "meanReturn": 0.4}}, "not json",
            {"progress": {"step": 2, "total": 2, "meanReturn": 0.4, "evalScore": 0.9}}]  # fmt: skip
    (tmp_path / "report.jsonl").write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"
    )
    progress = demo.progress_of(tmp_path)
    assert [p["meanReturn"] for p in progress] == [0.1, 0.4]
    assert progress[-1]["evalScore"] == 0.9
    png = demo.plot(progress, tmp_path / "curve.png", "title\nsubtitle")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_ctrl_c_is_a_clean_exit_130(monkeypatch, capsys):
    from posttrain.local import demo

    def interrupted(argv=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(demo, "main", interrupted)
    assert demo.run([]) == 130
    assert "stopped every process" in capsys.readouterr().err


def test_demo_task_and_held_out_seeds_are_fixed():
    """The demo adapts to the machine, never by making the task easier: two-digit + one-digit addition, the
    reward on the last number, and 128 held-out seeds of the task app's eval split, evaluated greedily."""
    import tomllib

    from posttrain.local import demo

    config = tomllib.loads((demo.DEMO_DIR / "rl.toml").read_text())
    assert config["rollout"]["env_config"] == {"difficulty": "medium"}
    assert config["rollout"]["policy_config"]["max_tokens"] == 16
    assert config["evaluation"]["seeds"] == list(range(1_000_000, 1_000_128))
    assert config["evaluation"].get("temperature", 0.0) == 0.0
    assert config["evaluation"]["every_n_iters"] > config["training"]["iterations_per_epoch"]
    assert demo._eval_seeds_text(demo.DEMO_DIR / "rl.toml") == "128 seeds 1000000-1000127"


def test_demo_reads_evaluations_iterations_and_phases(tmp_path):
    from posttrain.local import demo

    rows = [{"event": "evaluation", "step": 0, "eval_score": 0.1},
            {"event": "iteration", "step": 1, "rollout_seconds": 2.0, "update_seconds": 3.0,
             "weight_sync_seconds": 0.5, "iteration_seconds": 6.0},
            {"event": "iteration", "step": 2, "rollout_seconds": 1.0, "update_seconds": 2.0,
             "weight_sync_seconds": 0.5, "iteration_seconds": 4.0},
            {"event": "evaluation", "step": 2, "eval_score": 0.9}]  # fmt: skip
    (tmp_path / "report.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "rollout-policy.log").write_text(
        "x posttrain_rollout INFO vLLM ready after 41.5 s\n"
    )
    assert [e["eval_score"] for e in demo.evaluations_of(tmp_path)] == [0.1, 0.9]
    detail = demo.iterations_of(tmp_path)
    assert demo._phase_seconds(tmp_path, detail) == {
        "rollouts_s": 3.0, "updates_s": 5.0, "weight_syncs_s": 1.0, "iterations_s": 10.0, "vllm_start_s": 41.5,
    }  # fmt: skip
    assert [demo.trainer_processes(n) for n in (1, 2, 3, 8, 64)] == [1, 1, 1, 4, 4]


def test_train_local_prints_the_machine_and_the_dtypes_it_will_use(monkeypatch):
    from posttrain import hardware
    from posttrain.local.runner import _precision_line

    avx2 = hardware.Capability(device="cpu", cpu_model="AMD EPYC", cpu_capability="AVX2", cpu_bf16=False)
    monkeypatch.setattr(hardware, "probe", lambda: avx2)
    rl_bf16 = {"training": {"parallelism": {"bf16": True}}}
    line = _precision_line(rl_bf16)
    assert line.startswith("machine: cpu AMD EPYC (torch AVX2, native bf16: no); dtypes (bf16): compute fp32")
    assert "WARNING" in line and "parallelism.force_bf16 = true" in line and "\n" not in line
    sft_forced = {"hyperparameters": {"parallelism": {"force_bf16": True}}}
    assert "compute bf16 autocast" in _precision_line(sft_forced)
    assert "dtypes (auto): compute fp32" in _precision_line({}) and "WARNING" not in _precision_line({})


def test_a_lora_rl_policy_is_served_and_synced_in_float32_on_a_bf16_cpu(monkeypatch):
    """On a CPU with native bf16 the trainer computes in bf16, but a LoRA policy's weight sync and vLLM run
    in float32 (posttrain.hardware): the line the run prints says so."""
    from posttrain import hardware
    from posttrain.local.runner import _lora_policy, _precision_line

    zen4 = hardware.Capability(device="cpu", cpu_model="AMD EPYC", cpu_capability="AVX512", cpu_bf16=True)
    monkeypatch.setattr(hardware, "probe", lambda: zen4)
    lora = {"model": {"trainer_mode": "lora"}}
    assert _lora_policy(lora) and not _lora_policy({"model": {"trainer_mode": "full"}}) and not _lora_policy({})
    line = _precision_line(lora)
    assert "compute bf16 autocast" in line and "weight sync float32, vLLM --dtype float32" in line
    assert "weight sync bfloat16, vLLM --dtype bfloat16" in _precision_line({"model": {"trainer_mode": "full"}})


def _demo_job_rows() -> tuple[list[dict], list[dict]]:
    detail = [{"step": 1, "rollout_seconds": 10.0, "update_seconds": 6.0, "weight_sync_seconds": 1.0,
               "iteration_seconds": 17.5, "mean_return": 0.05, "mixed_groups": 3, "groups": 8},
              {"step": 2, "rollout_seconds": 8.0, "update_seconds": 4.0, "weight_sync_seconds": 1.0,
               "iteration_seconds": 13.5, "mean_return": 0.5, "mixed_groups": 6, "groups": 8}]  # fmt: skip
    evaluations = [{"event": "evaluation", "step": 0, "eval_score": 0.086, "eval_seconds": 5.0},
                   {"event": "evaluation", "step": 2, "eval_score": 0.891, "eval_seconds": 4.0}]  # fmt: skip
    return detail, evaluations


def test_demo_phase_table_splits_start_up_iterations_and_evaluations():
    from posttrain.local import demo_report

    marks: dict[str, float] = {}
    lines = [(2.0, "  starting policy rollout server on 127.0.0.1:1 (log x)"),
             (62.0, "  ready    policy rollout server http://127.0.0.1:1 (62 s)"),
             (80.0, '  event {"event": "evaluation", "step": 0, "eval_score": 0.086}'),
             (90.0, "  step 1/2"),
             (115.0, '  event {"event": "evaluation", "step": 2, "eval_score": 0.891}')]  # fmt: skip
    for at, line in lines:
        demo_report.note_line(marks, line, at)
    assert marks == {"vllm_begin": 2.0, "vllm_ready": 62.0, "first_eval_seen": 80.0, "last_eval_seen": 115.0}
    detail, evaluations = _demo_job_rows()
    timings = {"model_s": 30.0, "rl_s": 120.0}
    rows = dict(demo_report.phase_rows(timings, marks, detail, evaluations))
    assert rows == {
        "start-up: model conversion (once per machine)": 30.0,
        "start-up: job (embedded S3, task app)": 2.0,
        "start-up: vLLM (policy rollout server)": 60.0,
        "start-up: trainer (its model load after vLLM is ready)": 13.0,  # the first evaluation line came 18 s after vLLM, 5 s of it eval
        "held-out evaluation, base model": 5.0,
        "iteration 1": 17.5,
        "iteration 2": 13.5,
        "held-out evaluation, final model": 4.0,
        "final save and stop": 5.0,
    }
    table = demo_report.phase_table(timings, marks, detail, evaluations, total_s=152.0)
    by_name = {line[2:50].strip(): line[50:].split() for line in table.splitlines()}
    assert by_name["iteration 1"] == ["17.5", "10.0", "6.0", "1.0", "0.050", "3/8"]
    assert by_name["start-up, in all"] == ["105.0"]  # 30 + 2 + 60 + 13
    assert by_name["iterations (2), in all"] == ["31.0", "18.0", "10.0", "2.0"]
    assert by_name["held-out evaluations, in all"] == ["9.0"]
    assert by_name["total"] == ["152.0"]


def test_demo_phase_table_marks_phases_it_did_not_see():
    from posttrain.local import demo_report

    table = demo_report.phase_table({"rl_s": 50.0}, {}, [], [], total_s=50.0)
    by_name = {line[2:50].strip(): line[50:].split() for line in table.splitlines()}
    assert by_name["start-up: vLLM (policy rollout server)"] == ["-"]
    assert by_name["held-out evaluation, final model"] == ["-"]
    assert by_name["total"] == ["50.0"]


def test_demo_reward_png_shows_the_held_out_points(tmp_path):
    """The held-out greedy points (base at iteration 0, final after the last) are drawn beside the training
    curve, in their own colour: the PNG has that colour's pixels only when there are evaluations."""
    import numpy as np
    from matplotlib import colors, image
    from posttrain.local import demo_report

    detail, evaluations = _demo_job_rows()
    progress = [{"step": 1, "meanReturn": 0.05}, {"step": 2, "meanReturn": 0.5}]
    assert demo_report.curve_series(progress, evaluations) == {
        "train": [(1.0, 0.05), (2.0, 0.5)],
        "held_out": [(0.0, 0.086), (2.0, 0.891)],
    }
    red = np.array(colors.to_rgb(demo_report.HELD_OUT_COLOR))

    def red_pixels(path):
        pixels = image.imread(path)[..., :3]
        return int((np.abs(pixels - red).max(axis=-1) < 0.02).sum())

    with_points = demo_report.plot(progress, tmp_path / "a.png", "t", evaluations)
    without = demo_report.plot(progress, tmp_path / "b.png", "t")
    assert with_points.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert red_pixels(with_points) > 100 and red_pixels(without) == 0


def test_demo_phase_table_of_a_run_that_stopped_after_the_base_evaluation():
    from posttrain.local import demo_report

    rows = dict(demo_report.phase_rows({}, {}, [], [{"event": "evaluation", "step": 0, "eval_seconds": 7.0}]))
    assert rows["held-out evaluation, base model"] == 7.0
    assert rows["held-out evaluation, final model"] is None
