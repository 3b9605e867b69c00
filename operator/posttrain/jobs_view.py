"""What `posttrain status` shows, as pure functions: one row per job (an RLJob / SFTJob object from the API
server, or a local run from .runs/), the table, the --watch line and the ETA."""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from typing import Any

KIND_NAMES = {"rl": "RLJob", "sft": "SFTJob"}
TERMINAL = ("Succeeded", "Failed")


@dataclass
class JobRow:
    namespace: str
    name: str
    kind: str  # RLJob | SFTJob
    phase: str
    step: int | None = None
    total: int | None = None
    reward: float | None = None
    eval_score: float | None = None
    loss: float | None = None
    model: str | None = None
    fine_tuned_model: str | None = None
    started: datetime.datetime | None = None
    message: str = ""
    where: str = "cluster"  # cluster | local

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["started"] = self.started.strftime("%Y-%m-%dT%H:%M:%SZ") if self.started else None
        return data


def parse_time(value: Any) -> datetime.datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def row_from_object(obj: dict[str, Any]) -> JobRow:
    """A row from an RLJob / SFTJob object as the API server returns it."""
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    progress = status.get("progress") or {}
    spec_model = (obj.get("spec") or {}).get("model") or {}
    return JobRow(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        kind=str(obj.get("kind") or "?"),
        phase=str(status.get("phase") or "Pending"),
        step=_int(progress.get("step")),
        total=_int(progress.get("total")),
        reward=_num(progress.get("meanReturn")),
        eval_score=_num(progress.get("evalScore")),
        loss=_num(progress.get("loss")),
        model=status.get("model") or spec_model.get("source") or spec_model.get("base"),
        fine_tuned_model=status.get("fineTunedModel"),
        started=parse_time(status.get("startTime") or meta.get("creationTimestamp")),
        message=str(status.get("message") or ""),
    )


def row_from_local(run: Any) -> JobRow:
    """A row from a local run (posttrain.local.registry.LocalRun)."""
    progress = run.progress or {}
    return JobRow(
        namespace="local",
        name=run.id,
        kind=KIND_NAMES.get(run.kind, run.kind),
        phase=run.phase,
        step=_int(progress.get("step")),
        total=_int(progress.get("total")),
        reward=_num(progress.get("meanReturn")),
        eval_score=_num(progress.get("evalScore")),
        loss=_num(progress.get("loss")),
        model=run.model,
        fine_tuned_model=run.fine_tuned_model,
        started=parse_time(run.started_at),
        message=run.message,
        where="local",
    )


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d{seconds % 86400 // 3600}h"


def _fmt(value: float | None, digits: str = ".3g") -> str:
    return "-" if value is None else format(value + 0.0, digits)


def table(rows: list[JobRow], *, now: datetime.datetime, namespaces: bool = True, wide: bool = False) -> str:
    """`kubectl get`-style columns: NAMESPACE NAME KIND PHASE STEP REWARD EVAL LOSS MODEL AGE; `wide` adds
    FINE-TUNED-MODEL (ids are ~70 characters: out of the default view, as in `kubectl get rljobs -o wide`)."""
    head = (["NAMESPACE"] if namespaces else []) + ["NAME", "KIND", "PHASE", "STEP", "REWARD", "EVAL", "LOSS",
                                                     "MODEL", "AGE"] + (["FINE-TUNED-MODEL"] if wide else [])  # fmt: skip
    lines = [head]
    for r in rows:
        step = "-" if r.step is None else (f"{r.step}/{r.total}" if r.total else str(r.step))
        age = format_duration((now - r.started).total_seconds()) if r.started else "-"
        model = r.model or "-"
        cells = ([r.namespace] if namespaces else []) + [r.name, r.kind, r.phase, step, _fmt(r.reward),
                                                          _fmt(r.eval_score), _fmt(r.loss), model, age]  # fmt: skip
        if wide:
            cells.append(r.fine_tuned_model or "-")
        lines.append(cells)
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def eta_seconds(
    step: int | None,
    total: int | None,
    *,
    samples: list[tuple[float, int]] | None = None,
    started: datetime.datetime | None = None,
    now: datetime.datetime | None = None,
) -> float | None:
    """Seconds left: the rate of the steps seen while watching ((time, step) samples) when two steps were
    seen, else the average since the job started (which includes start-up, so it overestimates early)."""
    if step is None or not total or step >= total:
        return 0.0 if step is not None and total and step >= total else None
    if samples and len(samples) >= 2:
        (t0, s0), (t1, s1) = samples[0], samples[-1]
        if s1 > s0 and t1 > t0:
            return (t1 - t0) / (s1 - s0) * (total - step)
    if started is not None and now is not None and step > 0:
        elapsed = (now - started).total_seconds()
        return elapsed / step * (total - step)
    return None


def watch_line(row: JobRow, eta: float | None) -> str:
    """One --watch line: phase, step, reward, eval, loss, ETA."""
    parts = [f"{row.phase:<12}"]
    if row.step is not None:
        parts.append(f"step {row.step}/{row.total}" if row.total else f"step {row.step}")
    if row.reward is not None:
        parts.append(f"reward {_fmt(row.reward, '.4g')}")
    if row.eval_score is not None:
        parts.append(f"eval {_fmt(row.eval_score, '.4g')}")
    if row.loss is not None:
        parts.append(f"loss {_fmt(row.loss, '.4g')}")
    if row.phase not in TERMINAL and eta is not None:
        parts.append(f"ETA {format_duration(eta)}")
    if row.phase == "Succeeded" and row.fine_tuned_model:
        parts.append(f"fine_tuned_model {row.fine_tuned_model}")
    if row.message and row.phase not in ("Running", "Succeeded"):
        parts.append(f"({row.message})")
    return "  ".join(parts).rstrip()
