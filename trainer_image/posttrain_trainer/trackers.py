"""Rank 0 writes each metrics.jsonl line to the trackers of `[training] report_to` (posttrain.api.trackers):
TensorBoard event files under workdir/tensorboard, uploaded to the job's S3 folder (tensorboard/) with the live
curves and at the end, so `tensorboard --logdir s3://bucket/<prefix>tensorboard` reads them; MLflow
(MLFLOW_TRACKING_URI) and Weights & Biases (WANDB_API_KEY or WANDB_MODE=offline, WANDB_PROJECT). A tracker
that cannot work here stops the job before training (TrackerError, a configuration error); a tracker that
fails while logging is reported once and dropped: it never stops training."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from posttrain.api import trackers as spec
from posttrain.api.jobfile import JobFile

TB_DIR = "tensorboard"


class TrackerError(Exception):
    """report_to names a tracker whose package or settings are missing (exit code: configuration error)."""


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of one metrics.jsonl line, by key (nested judge_scores as judge_scores/<name>)."""
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "total"):
            continue
        if isinstance(value, dict):
            for sub, v in scalars(value).items():
                out[f"{key}/{sub}"] = v
        elif isinstance(value, int | float) and not isinstance(value, bool) and value == value and abs(value) != float("inf"):
            out[key] = float(value)
    return out


class Trackers:
    def __init__(self, job: JobFile, *, enabled: bool, env: dict[str, str] | None = None):
        env = dict(os.environ if env is None else env)
        self.job = job
        self.names = list(job.settings.report_to or []) if enabled else []
        self.writers: dict[str, Any] = {}
        self.tb_dir = Path(job.workdir) / TB_DIR
        problems = spec.problems(self.names, env)
        if problems:
            raise TrackerError("; ".join(f"{m} (fix: {f})" for m, f in problems))
        run_name = f"{job.job.namespace}.{job.job.name}"
        for name in self.names:
            if name == "tensorboard":
                from torch.utils.tensorboard import SummaryWriter

                self.writers[name] = SummaryWriter(log_dir=str(self.tb_dir), flush_secs=5)
            elif name == "mlflow":
                import mlflow

                mlflow.start_run(run_name=run_name, tags={"posttrain.job": run_name, "posttrain.uid": job.job.uid})
                self.writers[name] = mlflow
            elif name == "wandb":
                import wandb

                self.writers[name] = wandb.init(project=env.get("WANDB_PROJECT") or "posttrain", name=run_name,
                                                config={"kind": job.kind, "base_model": job.base_model})  # fmt: skip

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not self.writers or not isinstance(step, int):
            return
        values = scalars(record)
        for name, writer in list(self.writers.items()):
            try:
                if name == "tensorboard":
                    for key, value in values.items():
                        writer.add_scalar(key, value, step)
                    writer.flush()
                elif name == "mlflow":
                    writer.log_metrics(values, step=step)
                elif name == "wandb":
                    writer.log(values, step=step)
            except Exception as err:  # noqa: BLE001 - a tracker's outage must not end a training run
                print(f"[posttrain] report_to {name} failed ({type(err).__name__}: {err}); dropped",
                      file=sys.stderr, flush=True)  # fmt: skip
                self.writers.pop(name, None)

    def upload(self, client: Any) -> str | None:
        """The TensorBoard event files to the job's S3 folder; returns their prefix URI."""
        if "tensorboard" not in self.writers or self.job.storage is None or not self.tb_dir.is_dir():
            return None
        from posttrain import storage as s3

        return s3.upload_dir(client, self.tb_dir, self.job.storage.bucket, self.job.storage.prefix + TB_DIR + "/")

    def close(self) -> None:
        for name, writer in self.writers.items():
            try:
                if name == "tensorboard":
                    writer.close()
                elif name == "mlflow":
                    writer.end_run()
                elif name == "wandb":
                    writer.finish()
            except Exception as err:  # noqa: BLE001
                print(f"[posttrain] report_to {name}: closing failed: {err}", file=sys.stderr, flush=True)
        self.writers = {}
