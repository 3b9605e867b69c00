"""Status you can watch, the pure parts and the local side: the job table, ETA and --watch lines, the local
run registry (.runs/<run>/run.json), `status` / `logs` / `plot` on local runs, the curve points and PNG, and
which task app a local run uses."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from posttrain.cli import main
from posttrain.errors import UserError
from posttrain.jobs_view import JobRow, eta_seconds, row_from_object, table, watch_line
from posttrain.local.registry import RunRecord, find_run, list_runs
from posttrain.local.taskapp import MATH_APP, SHAPES_APP, choose_task_app
from posttrain.plotting import curve_points, plot_curves

NOW = datetime.datetime(2026, 11, 23, 12, 0, tzinfo=datetime.UTC)


def test_rows_table_eta_and_watch_line():
    obj = {"kind": "RLJob", "metadata": {"namespace": "team", "name": "math-rl"},
           "spec": {"model": {"base": "Qwen/Qwen3-4B"}},
           "status": {"phase": "Running", "startTime": "2026-11-23T11:50:00Z",
                      "progress": {"step": 4, "total": 10, "meanReturn": 0.41, "evalScore": 0.5, "loss": 0.12}}}  # fmt: skip
    row = row_from_object(obj)
    text = table([row], now=NOW).splitlines()
    assert text[0].split() == [
        "NAMESPACE",
        "NAME",
        "KIND",
        "PHASE",
        "STEP",
        "REWARD",
        "EVAL",
        "LOSS",
        "MODEL",
        "AGE",
    ]
    assert text[1].split() == ["team", "math-rl", "RLJob", "Running", "4/10", "0.41", "0.5", "0.12", "Qwen/Qwen3-4B",
                               "10m00s"]  # fmt: skip
    # 4 steps in 10 min since start: 15 min left; from watched samples: 30 s a step -> 3 min
    assert eta_seconds(4, 10, started=row.started, now=NOW) == pytest.approx(900)
    assert eta_seconds(4, 10, samples=[(0.0, 2), (60.0, 4)]) == pytest.approx(180)
    assert eta_seconds(None, 10) is None and eta_seconds(10, 10) == 0.0
    assert watch_line(row, 180) == "Running       step 4/10  reward 0.41  eval 0.5  loss 0.12  ETA 3m00s"
    done = JobRow("ns", "x", "SFTJob", "Succeeded", 5, 5, fine_tuned_model="ft:b:ns.x.1")
    assert "fine_tuned_model ft:b:ns.x.1" in watch_line(done, 0) and "ETA" not in watch_line(done, 0)


def test_registry_lists_finds_and_marks_lost_runs(tmp_path):
    a = tmp_path / "math-rl-aaaa1111"
    a.mkdir()
    record = RunRecord(a, name="math-rl", kind="rl", uid="aaaa1111-0000", model="m")
    record.update(phase="Running", progress={"step": 1, "total": 4, "loss": 2.0})
    record.update(progress={"step": 2, "meanReturn": 0.5})  # merged like a status patch
    b = tmp_path / "math-rl-bbbb2222"
    b.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (b / "run.json").write_text(json.dumps({"name": "math-rl", "kind": "rl", "uid": "bbbb2222-0000", "pid": dead.pid,
                                            "phase": "Running", "started_at": "2099-01-01T00:00:00Z"}))  # fmt: skip
    runs = list_runs(tmp_path)
    assert [r.id for r in runs] == ["math-rl-aaaa1111", "math-rl-bbbb2222"]
    assert runs[0].phase == "Running" and runs[0].progress == {
        "step": 2,
        "total": 4,
        "loss": 2.0,
        "meanReturn": 0.5,
    }
    assert runs[1].phase == "Failed" and f"the runner (pid {dead.pid}) is gone" in runs[1].message
    assert find_run(tmp_path, "math-rl").id == "math-rl-bbbb2222"  # the newest of that name
    assert find_run(tmp_path, "math-rl-aaaa1111").id == "math-rl-aaaa1111"
    assert find_run(tmp_path, "aaaa1111").id == "math-rl-aaaa1111" and find_run(tmp_path, "nope") is None


def _local_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "demo-rl-cafe0001"
    (run / "logs").mkdir(parents=True)
    record = RunRecord(
        run, name="demo-rl", kind="rl", uid="cafe0001-0000", model="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    lines = [{"event": "evaluation", "step": 0, "eval_score": 0.1}]
    for step in (1, 2, 3):
        progress = {"step": step, "total": 3, "meanReturn": 0.1 * step, "loss": 1.0 / step, "evalScore": 0.1}
        lines.append({"progress": progress})
        record.update(phase="Running", progress=progress)
    lines.append({"event": "evaluation", "step": 3, "eval_score": 0.6})
    (run / "report.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    record.update(
        phase="Succeeded", fine_tuned_model="rl:HuggingFaceTB/SmolLM2-135M-Instruct:local.demo-rl.cafe0001"
    )
    (run / "logs" / "trainer.log").write_text("step 1\nstep 2\nstep 3\n")
    (run / "logs" / "taskapp.log").write_text("listening\n")
    return run


def test_status_logs_and_plot_of_local_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config: local runs only
    run = _local_run(tmp_path)
    runs = ["--runs-dir", str(tmp_path / "runs")]
    assert main(["status", *runs]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split()[:6] == ["local", "demo-rl-cafe0001", "RLJob", "Succeeded", "3/3", "0.3"]
    assert main(["status", "demo-rl", *runs, "--watch"]) == 0
    assert capsys.readouterr().out.startswith("Succeeded     step 3/3  reward 0.3")
    assert main(["status", "demo-rl", *runs]) == 0
    assert "fine_tuned_model: rl:HuggingFaceTB" in capsys.readouterr().out
    assert main(["status", "nope", *runs]) == 3
    assert main(["logs", "demo-rl", "--role", "trainer", "--tail", "2", *runs]) == 0
    assert capsys.readouterr().out == "step 2\nstep 3\n"
    assert main(["logs", "demo-rl", *runs]) == 0
    assert "[taskapp] listening" in capsys.readouterr().out
    assert main(["logs", "demo-rl", "--role", "judge", *runs]) == 2
    assert "pick one of taskapp, trainer" in capsys.readouterr().err
    png = tmp_path / "curve.png"
    assert main(["plot", "demo-rl", "-o", str(png), *runs]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plot", "demo-rl", "-o", str(tmp_path), *runs]) == 2  # a directory
    assert run.is_dir()


def test_curve_points_from_metrics_and_report_lines():
    metrics = [{"step": 0, "eval_score": 0.1}, {"step": 1, "mean_return": 0.2, "loss": 0.5},
               {"step": 1, "eval_score": 0.3}, {"step": 2, "mean_return": 0.4, "loss": 0.25}]  # fmt: skip
    assert curve_points(metrics) == {"mean_return": [(1, 0.2), (2, 0.4)], "eval_score": [(0, 0.1), (1, 0.3)],
                                     "loss": [(1, 0.5), (2, 0.25)]}  # fmt: skip
    sft = [
        {"step": 1, "loss": 2.0},
        {"step": 1, "eval_loss": 2.5},
        {"progress": {"step": 1, "evalScore": 2.5}},
    ]
    assert curve_points(sft) == {"loss": [(1, 2.0)], "eval_loss": [(1, 2.5)]}  # an SFT eval score is a loss
    assert curve_points([{"progress": {"step": 1, "meanReturn": float("nan")}}]) == {}
    assert plot_curves([], "/nonexistent/x.png") is None


def test_choose_task_app_follows_synths_precedence_and_starts_math_only_for_math():
    math = {"rollout": {"env_name": "math"}, "services": {"task_url": "http://from-toml:1"}}
    assert choose_task_app(
        math, cli_url="http://cli:1", env={"TASK_APP_URL": "http://env:1"}, script=None
    ) == ("url", "http://cli:1")
    assert choose_task_app(math, cli_url=None, env={"TASK_APP_URL": "http://env:1"}, script=None) == (
        "url",
        "http://env:1",
    )
    assert choose_task_app(math, cli_url=None, env={}, script=None) == ("url", "http://from-toml:1")
    bare = {"rollout": {"env_name": "math"}, "services": {"task_url": "placeholder"}}
    assert choose_task_app(bare, cli_url=None, env={}, script=None) == ("start", MATH_APP)
    assert choose_task_app(bare, cli_url=None, env={}, script=Path("my_app.py")) == (
        "start",
        Path("my_app.py"),
    )
    with pytest.raises(UserError) as err:
        choose_task_app({"rollout": {"env_name": "crafter"}}, cli_url=None, env={}, script=None)
    assert "no task app for environment 'crafter'" in str(err.value) and "--task-url" in str(err.value)
    shapes = {"rollout": {"env_name": "shapes"}}  # the vision example app is bundled too
    assert choose_task_app(shapes, cli_url=None, env={}, script=None) == ("start", SHAPES_APP)


def test_train_local_refuses_a_crafter_config_without_a_task_app(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TASK_APP_URL", raising=False)
    repo = Path(__file__).resolve().parents[2]
    config = tmp_path / "crafter.toml"
    config.write_text(
        (repo / "examples" / "demo" / "rl.toml")
        .read_text()
        .replace('env_name = "math"', 'env_name = "crafter"')
    )
    assert main(["train", "--local", "--config", str(config), "--runs-dir", str(tmp_path / "runs")]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("error: services.task_url: no task app for environment 'crafter'")
    assert not list((tmp_path / "runs").glob("*/run.json"))  # nothing started


def test_the_math_task_app_says_where_it_listens_and_warns_without_a_key(tmp_path):
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if "ENVIRONMENT_API_KEY" not in k.upper()}
    proc = subprocess.Popen([sys.executable, str(repo / "examples/taskapps/math/app.py"), "--port", "0"],
                            env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        first, second = proc.stderr.readline(), proc.stderr.readline()
    finally:
        proc.terminate()
        proc.wait(30)
    assert first.startswith("posttrain math task app") and "listening on http://127.0.0.1:" in first
    port = int(first.split("http://127.0.0.1:")[1].split()[0])
    assert port > 0  # the port it bound, not the 0 it was given
    assert "0 API key(s) configured" in first
    assert (
        second.startswith("warning: no API key configured") and "(fix: export ENVIRONMENT_API_KEY" in second
    )
