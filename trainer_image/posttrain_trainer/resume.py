"""A job's life across restarts, shared by the GSPO, SFT and ReST-EM trainers: is the job already complete
(a restarted pod after success), where does it resume, and when does it save a checkpoint.

The checkpoint format and retention rule live in checkpoint.py; this module is the policy around them:
a checkpoint every job.checkpoint_every steps (never at the last step: the final model follows), the
newest [training] keep_checkpoints kept, and the "already_complete", "checkpoint" events."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posttrain import storage as s3
from posttrain.api.jobfile import JobFile

from posttrain_trainer import checkpoint as ckpt
from posttrain_trainer import distributed as D
from posttrain_trainer.artifacts import reported_artifacts
from posttrain_trainer.report import Reporter

MANIFEST = "manifest.json"


class CheckpointStore:
    """The job's checkpoints in S3 (job.storage); without storage nothing is saved or resumed."""

    def __init__(self, job: JobFile, reporter: Reporter):
        self.job = job
        self.reporter = reporter
        self.client = s3.client_from_env(job.storage) if job.storage is not None else None
        self.workdir = Path(job.workdir)
        self.keep = job.settings.keep_checkpoints
        self.last_uri: str | None = None  # the newest checkpoint this run saved or resumed from
        self.saved_step: int | None = None  # the step of the last checkpoint this run saved

    @property
    def bucket(self) -> str:
        return self.job.storage.bucket

    @property
    def prefix(self) -> str:
        return self.job.storage.prefix

    def completed_result(self) -> dict[str, Any] | None:
        """The metrics of a job that already finished, after reporting its stored result again (collective);
        None when the job has not finished."""
        if self.client is None or not s3.exists(self.client, self.bucket, self.prefix + MANIFEST):
            return None
        manifest = s3.get_json(self.client, self.bucket, self.prefix + MANIFEST)
        self.reporter.event("already_complete", steps=manifest.get("steps"))
        self.reporter.result(manifest["fine_tuned_model"], reported_artifacts(manifest["artifacts"]))
        D.barrier()
        return dict(manifest.get("metrics", {}), fine_tuned_model=manifest["fine_tuned_model"])

    def latest(self) -> int | None:
        """The step of the newest complete checkpoint, or None."""
        if self.client is None:
            return None
        return ckpt.find_latest(self.client, self.bucket, self.prefix)

    def restore(self, engine: D.TrainEngine, step: int) -> dict[str, Any]:
        """Load checkpoint `step` into the engine (collective); returns its trainer_state.json."""
        state = ckpt.load_checkpoint(
            engine,
            client=self.client,
            bucket=self.bucket,
            prefix=self.prefix,
            step=step,
            workdir=self.workdir,
        )
        self.last_uri = s3.s3_uri(self.bucket, ckpt.step_prefix(self.prefix, step))
        return state

    def resume(self, engine: D.TrainEngine) -> dict[str, Any] | None:
        """Restore the newest checkpoint, if any (collective); returns its state or None."""
        latest = self.latest()
        return None if latest is None else self.restore(engine, latest)

    def report_resumed(self, step: int, state: dict[str, Any]) -> None:
        self.reporter.event(
            "resumed",
            step=step,
            checkpoint=self.last_uri,
            optimizer_fingerprint=state["resumed_optimizer_fingerprint"],
            saved_optimizer_fingerprint=state.get("optimizer_fingerprint"),
        )

    def due(self, step: int, total: int) -> bool:
        every = self.job.checkpoint_every
        return self.client is not None and bool(every) and step % every == 0 and step < total

    def save(
        self, engine: D.TrainEngine, step: int, *, data_state: dict[str, Any], extra: dict[str, Any]
    ) -> str:
        """Save checkpoint `step` and prune the old ones (collective); returns its URI."""
        self.last_uri = ckpt.save_checkpoint(
            engine,
            client=self.client,
            bucket=self.bucket,
            prefix=self.prefix,
            step=step,
            workdir=self.workdir,
            data_state=data_state,
            extra=extra,
            keep=self.keep,
        )
        self.saved_step = step
        self.reporter.event("checkpoint", step=step, uri=self.last_uri)
        return self.last_uri
