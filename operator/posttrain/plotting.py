"""Reward and loss curves of a job as a PNG: one function for the trainer (reward_curve.png / loss_curve.png
beside the final model) and for `posttrain plot` (a local run's report.jsonl or a cluster job's
metrics.jsonl from S3). Both images ship this package.

Inputs are the lines a job writes, in any of their shapes:
- metrics.jsonl (the trainer's history): {"step", "mean_return", "loss", ...} per iteration or step,
  {"step", "eval_score"} or {"step", "eval_loss"} per evaluation;
- report.jsonl (the local runner's progress file): {"progress": {"step", "meanReturn", "loss", "evalScore"}}
  and {"event": "evaluation", "step", "eval_score" | "eval_loss"} lines.
`curve_points` turns them into one series per quantity; `plot_curves` draws them (matplotlib, Agg)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# series name -> (label in the figure, keys it is read from, panel)
SERIES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "mean_return": ("mean reward (training rollouts)", ("mean_return", "meanReturn"), "reward"),
    "eval_score": ("held-out eval score", ("eval_score", "evalScore"), "reward"),
    "loss": ("training loss", ("loss",), "loss"),
    "eval_loss": ("held-out loss", ("eval_loss", "evalLoss"), "loss"),
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def curve_points(lines: Iterable[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """{series: [(step, value), ...]} from metrics.jsonl or report.jsonl lines; a step's last value wins.

    Progress lines repeat the last evaluation score on every step (status.progress keeps it), so eval
    scores come from evaluation lines when the file has any, and from progress lines only otherwise."""
    points: dict[str, dict[int, float]] = {name: {} for name in SERIES}
    progress_evals: dict[str, dict[int, float]] = {"eval_score": {}, "eval_loss": {}}
    evaluation_seen = False
    for line in lines:
        if not isinstance(line, dict):
            continue
        from_progress = isinstance(line.get("progress"), dict)
        if from_progress:
            record = line["progress"]
        elif line.get("event") in (None, "evaluation"):
            record = line
        else:
            continue
        step = record.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            continue
        is_eval = not from_progress and (
            line.get("event") == "evaluation" or "eval_score" in record or "eval_loss" in record
        )
        evaluation_seen = evaluation_seen or is_eval
        for name, (_, keys, _) in SERIES.items():
            evaluation_series = name in progress_evals
            if is_eval != evaluation_series and not from_progress:
                continue
            value = next((v for v in (_number(record.get(k)) for k in keys) if v is not None), None)
            if value is None:
                continue
            if from_progress and evaluation_series:
                progress_evals[name][step] = value
            else:
                points[name][step] = value
    if not evaluation_seen:
        points.update(progress_evals)
    return {name: sorted(values.items()) for name, values in points.items() if values}


SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(lines: Iterable[dict[str, Any]], width: int = 40) -> str | None:
    """The training reward (else the loss) as one line of text: `reward ▁▃▅█ 0.12 -> 0.55 (4 steps)`,
    the last `width` steps; None when the lines hold neither."""
    series = curve_points(list(lines))
    name = "mean_return" if series.get("mean_return") else "loss" if series.get("loss") else None
    if name is None:
        return None
    values = [v for _, v in series[name]]
    shown = values[-width:]
    low, high = min(shown), max(shown)
    span = (high - low) or 1.0
    bars = "".join(SPARKS[min(len(SPARKS) - 1, int((v - low) / span * len(SPARKS)))] for v in shown)
    label = "reward" if name == "mean_return" else "loss"
    return f"{label} {bars} {values[0]:.3g} -> {values[-1]:.3g} ({len(values)} steps)"


def plot_curves(lines: Iterable[dict[str, Any]], path: str | Path, title: str | None = None) -> Path | None:
    """Draw the job's curves into `path` (PNG); None when the lines hold no point to draw."""
    series = curve_points(list(lines))
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in ("reward", "loss") if any(SERIES[n][2] == p for n in series)]
    fig, axes = plt.subplots(len(panels), 1, figsize=(6.4, 3.4 * len(panels)), dpi=100, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        for name, values in series.items():
            label, _, where = SERIES[name]
            if where != panel:
                continue
            steps, ys = zip(*values, strict=True)
            ax.plot(steps, ys, marker="o" if len(values) < 60 else None, label=label)
        ax.set_xlabel("step (iteration for RL and ReST-EM)")
        ax.set_ylabel(panel)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    if title:
        axes[0, 0].set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
