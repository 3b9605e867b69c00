"""`[training] report_to` (posttrain.api.trackers, posttrain_trainer/trackers.py): accepted values, the
validate-time refusal of a tracker whose package or settings are missing, and TensorBoard event files
written per step and read back with TensorBoard's own reader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from fixtures.tiny_rl import tiny_rl_toml
from posttrain.api import trackers
from posttrain.cli import main


def test_normalize() -> None:
    assert trackers.normalize("tensorboard") == ["tensorboard"]
    assert trackers.normalize("TensorBoard, wandb") == ["tensorboard", "wandb"]
    assert trackers.normalize(["mlflow", "mlflow"]) == ["mlflow"]
    assert trackers.normalize("none") == [] and trackers.normalize(None) is None
    assert trackers.normalize("all") == list(trackers.TRACKERS)
    with pytest.raises(ValueError, match="'comet' is not one of"):
        trackers.normalize("comet")


def test_problems_name_the_missing_package_or_setting() -> None:
    def nothing(_module: str) -> bool:
        return False

    def everything(_module: str) -> bool:
        return True

    (missing,) = trackers.problems(["mlflow"], {}, nothing)
    assert "mlflow package is not installed" in missing[0] and "pip install mlflow" in missing[1]
    (unset,) = trackers.problems(["wandb"], {}, everything)
    assert "WANDB_API_KEY or WANDB_MODE is not set" in unset[0]
    assert trackers.problems(["wandb"], {"WANDB_MODE": "offline"}, everything) == []
    assert trackers.problems(["mlflow"], {"MLFLOW_TRACKING_URI": "http://m:5000"}, everything) == []
    assert trackers.problems(["tensorboard"], {}, everything) == []


def _config(tmp_path: Path, report_to: str) -> Path:
    path = tmp_path / "rl.toml"
    path.write_text(tiny_rl_toml(label="t", more=f"report_to = {report_to}\n"))
    return path


@pytest.mark.skipif(trackers.installed("mlflow"), reason="mlflow is installed here")
def test_validate_refuses_mlflow_without_its_package(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = _config(tmp_path, '["tensorboard", "mlflow"]')
    assert main(["validate", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.startswith("report_to"))
    assert f"{path}:{line}: training.report_to: report_to 'mlflow': the mlflow package is not installed" in err
    assert "tensorboard" not in err.split("training.report_to")[1].split("(fix")[0]  # tensorboard is fine


def test_validate_refuses_an_unknown_tracker(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", "--config", str(_config(tmp_path, '"tensorbord"'))]) == 2
    assert "'tensorbord' is not one of tensorboard, mlflow, wandb" in capsys.readouterr().err


def test_validate_accepts_tensorboard(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tensorboard")
    assert main(["validate", "--config", str(_config(tmp_path, '"tensorboard"'))]) == 0


def test_tensorboard_event_files_per_step(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from posttrain_trainer.trackers import Trackers, scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert scalars({"step": 1, "loss": 0.5, "ok": True, "judge_scores": {"outcome": 0.25}, "x": float("nan")}) == {
        "loss": 0.5, "judge_scores/outcome": 0.25,
    }  # fmt: skip
    job = SimpleNamespace(settings=SimpleNamespace(report_to=["tensorboard"]), workdir=str(tmp_path), storage=None,
                          kind="rl", base_model="m", job=SimpleNamespace(namespace="ns", name="j", uid="u"))  # fmt: skip
    tracker = Trackers(job, enabled=True, env={})
    for step, reward in ((1, 0.1), (2, 0.4), (3, 0.8)):
        tracker.log({"step": step, "mean_return": reward, "loss": 1.0 / step})
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, round(e.value, 3)) for e in events.Scalars("mean_return")] == [(1, 0.1), (2, 0.4), (3, 0.8)]
    assert Trackers(job, enabled=False, env={}).writers == {}  # other ranks write nothing


def test_a_cluster_trainer_gets_only_the_named_trackers_settings_from_the_namespace_secret() -> None:
    from fixtures.jobs import RL_SPEC
    from posttrain.controller import render
    from test_pod_security import SETTINGS, TARGET, rljob

    def trainer_env(**spec) -> dict:
        out = render.render_rljob(rljob(**spec), SETTINGS, TARGET)
        (job,) = [c for c in out.children if c["kind"] == "Job"]
        return {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}

    env = trainer_env(training={**RL_SPEC["training"], "reportTo": ["tensorboard", "wandb"]})
    assert env["WANDB_API_KEY"]["valueFrom"] == {
        "secretKeyRef": {"name": "posttrain-trackers", "key": "WANDB_API_KEY", "optional": True}
    }
    assert "WANDB_PROJECT" in env and not any(k.startswith("MLFLOW_") for k in env)
    assert not any(k.startswith(("WANDB_", "MLFLOW_")) for k in trainer_env())  # nothing when none is named
