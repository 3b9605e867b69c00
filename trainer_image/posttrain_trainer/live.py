"""Live curves: rank 0 uploads metrics.jsonl and reward_curve.png to the job's S3 folder after its first step
and every POSTTRAIN_LIVE_EVERY steps (default 5), so `posttrain plot` and `posttrain status` show a running
cluster job's curve; the job's status.progress.metrics names the file. The end (artifacts.finalize) writes
the same keys once more. An upload that fails is reported and skipped: curves never stop training."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posttrain.api.jobfile import JobFile

EVERY_ENV = "POSTTRAIN_LIVE_EVERY"
DEFAULT_EVERY = 5
METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "reward_curve.png"


def due(count: int, every: int) -> bool:
    """After the first record, then every `every` records (every <= 0: never)."""
    return every > 0 and (count == 1 or count % every == 0)


class LiveCurves:
    def __init__(self, job: JobFile, *, enabled: bool, env: dict[str, str] | None = None, client: Any = None):
        env = os.environ if env is None else env
        self.job = job
        self.enabled = enabled and job.storage is not None
        self.every = int(env.get(EVERY_ENV) or DEFAULT_EVERY)
        self.client = client
        self.count = 0
        self.uri: str | None = None  # metrics.jsonl in S3, once uploaded
        self.workdir = Path(job.workdir) / "live"
        self.extra_uploads: list[Callable[[Any], Any]] = []  # more files to upload with the curve (trackers)

    def update(self, history: list[dict[str, Any]], *, force: bool = False) -> str | None:
        """Count one record; upload the history and its curve when due. Returns metrics.jsonl's URI."""
        if not self.enabled:
            return None
        self.count += 1
        if not (force or due(self.count, self.every)):
            return self.uri
        try:
            self.uri = self._upload(history)
        except Exception as err:  # noqa: BLE001 - an S3 hiccup must not end a training run
            print(f"[posttrain] live curve upload failed: {type(err).__name__}: {err}"[:300], file=sys.stderr, flush=True)
        self.upload_extra()
        return self.uri

    def upload_extra(self) -> None:
        """The extra uploads (TensorBoard event files), now; failures are reported and skipped."""
        if not self.enabled or not self.extra_uploads:
            return
        from posttrain import storage as s3

        try:
            if self.client is None:
                assert self.job.storage is not None
                self.client = s3.client_from_env(self.job.storage)
            for upload in self.extra_uploads:
                upload(self.client)
        except Exception as err:  # noqa: BLE001
            print(f"[posttrain] live upload failed: {type(err).__name__}: {err}"[:300], file=sys.stderr, flush=True)

    def _upload(self, history: list[dict[str, Any]]) -> str:
        from posttrain import storage as s3
        from posttrain.plotting import plot_curves

        assert self.job.storage is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        metrics = self.workdir / METRICS_FILE
        metrics.write_text("".join(json.dumps(line, default=str) + "\n" for line in history))
        curve = plot_curves(history, self.workdir / CURVE_FILE, title=f"{self.job.kind}: {self.job.job.name}")
        if self.client is None:
            self.client = s3.client_from_env(self.job.storage)
        bucket, prefix = self.job.storage.bucket, self.job.storage.prefix
        if curve is not None:
            s3.upload_file(self.client, curve, bucket, prefix + CURVE_FILE)
        return s3.upload_file(self.client, metrics, bucket, prefix + METRICS_FILE)
