"""The registry of local runs: every `posttrain train --local` run keeps `run.json` in its run folder
(`.runs/<name>-<uid8>/run.json`), so `posttrain status`, `logs` and `plot` find local runs next to the
cluster's jobs. No shared index: the registry is the set of run folders, and a run folder is never written by
two processes.

run.json: name, kind, uid, namespace ("local"), model, config, pid (the runner), phase, message,
started_at / updated_at (RFC 3339), progress (the trainer's last progress: step, total, meanReturn, loss,
evalScore, ...), fine_tuned_model, s3_uri. A run whose runner is gone while its phase is not terminal shows
as Failed ("the runner (pid N) is gone"): a killed runner cannot say so itself."""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posttrain.localhost import signalable

RUN_FILE = "run.json"
TERMINAL = ("Succeeded", "Failed")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _alive(pid: int | None) -> bool:
    return bool(pid) and signalable(pid)


@dataclass
class LocalRun:
    run_dir: Path
    name: str
    kind: str
    uid: str
    phase: str = "Pending"
    message: str = ""
    model: str | None = None
    started_at: str | None = None
    updated_at: str | None = None
    pid: int | None = None
    progress: dict[str, Any] = field(default_factory=dict)
    fine_tuned_model: str | None = None
    s3_uri: str | None = None

    @property
    def id(self) -> str:
        """`<name>-<uid8>`: the run folder's name, unique on this machine."""
        return self.run_dir.name

    @classmethod
    def load(cls, run_dir: Path) -> LocalRun | None:
        try:
            data = json.loads((run_dir / RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("name"):
            return None
        run = cls(run_dir=run_dir, name=str(data["name"]), kind=str(data.get("kind") or "?"),
                  uid=str(data.get("uid") or ""))  # fmt: skip
        for key in (
            "phase",
            "message",
            "model",
            "started_at",
            "updated_at",
            "pid",
            "fine_tuned_model",
            "s3_uri",
        ):
            if data.get(key) is not None:
                setattr(run, key, data[key])
        run.progress = data.get("progress") if isinstance(data.get("progress"), dict) else {}
        if run.phase not in TERMINAL and not _alive(run.pid):
            run.message = f"the runner (pid {run.pid}) is gone" + (
                f"; last: {run.message}" if run.message else ""
            )
            run.phase = "Failed"
        return run


class RunRecord:
    """The runner's handle on its run.json: `update(phase=..., progress=...)` merges and rewrites it."""

    def __init__(self, run_dir: Path, **fields: Any):
        self.path = Path(run_dir) / RUN_FILE
        self.data: dict[str, Any] = {"namespace": "local", "pid": os.getpid(), "phase": "Pending",
                                     "started_at": now(), **fields}  # fmt: skip
        self._write()

    def update(self, **fields: Any) -> None:
        """Merge `fields` in (progress key by key, as a merge patch on a job's status.progress does)."""
        if isinstance(fields.get("progress"), dict):
            fields["progress"] = {**(self.data.get("progress") or {}), **fields["progress"]}
        self.data.update({k: v for k, v in fields.items() if v is not None})
        self._write()

    def _write(self) -> None:
        self.data["updated_at"] = now()
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str))
        tmp.replace(self.path)  # readers never see half a file


def list_runs(runs_dir: Path) -> list[LocalRun]:
    """Every local run under runs_dir, oldest first."""
    if not runs_dir.is_dir():
        return []
    runs = [LocalRun.load(d) for d in runs_dir.iterdir() if (d / RUN_FILE).is_file()]
    return sorted((r for r in runs if r is not None), key=lambda r: (r.started_at or "", r.id))


def find_run(runs_dir: Path, name: str) -> LocalRun | None:
    """A run by its folder name (`<name>-<uid8>`), its uid (or a prefix of 8+), or its job name (the
    newest run of that name)."""
    runs = list_runs(runs_dir)
    for run in runs:
        if name in (run.id, run.uid) or (len(name) >= 8 and run.uid.replace("-", "").startswith(name)):
            return run
    named = [r for r in runs if r.name == name]
    return named[-1] if named else None
