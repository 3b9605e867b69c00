"""What `make demo` prints and draws at its end (pure functions; posttrain.local.demo calls them).

- phase_rows / phase_table: where the time went, from the demo's own clock (model conversion, and the moments
  it saw the job's lines: rollout server starting and ready, first and last held-out evaluation, the job's
  end) and from the job's report (each iteration's rollout / update / weight-sync seconds, each
  evaluation's seconds). Start-up is everything before the first held-out evaluation: the model
  conversion, the job's own start (embedded S3, task app), vLLM's start and what remains of the trainer's
  (it loads its model while vLLM starts).
- plot: the reward curve, the sampled training mean per iteration beside the held-out greedy evaluation
  points (before the first iteration at x = 0, after the last), which are the figures the demo promises."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# The job lines whose arrival time the demo notes (substring -> mark name); the first arrival counts,
# except for the evaluation line, whose last arrival is the final evaluation.
LINE_MARKS = {
    "starting policy rollout server": "vllm_begin",
    "ready    policy rollout server": "vllm_ready",
}
EVALUATION_LINE = '"event": "evaluation"'
HELD_OUT_COLOR = "tab:red"  # the held-out points' colour (tests look for it in the PNG)


def note_line(marks: dict[str, float], line: str, at: float) -> None:
    """Record when a job line of interest arrived (seconds since the job started)."""
    for text, name in LINE_MARKS.items():
        if text in line:
            marks.setdefault(name, at)
    if EVALUATION_LINE in line:
        marks.setdefault("first_eval_seen", at)
        marks["last_eval_seen"] = at


def _f(value: Any) -> float:
    try:
        return float(value or 0.0)
    except (TypeError, ValueError):
        return 0.0


def phase_rows(
    timings: dict[str, float],
    marks: dict[str, float],
    detail: list[dict[str, Any]],
    evaluations: list[dict[str, Any]],
) -> list[tuple[str, float | None]]:
    """[(phase, seconds)] in the order they happened; None where a phase was not seen.

    timings: the demo's (model_s, rl_s = the whole job, sft_s, independent_eval_s); marks: note_line's,
    seconds since the job started; detail: the job's iteration events; evaluations: its evaluation events."""
    rows: list[tuple[str, float | None]] = []
    if "model_s" in timings:
        rows.append(("start-up: model conversion (once per machine)", timings["model_s"]))
    if "sft_s" in timings:
        rows.append(("SFT warm-up job", timings["sft_s"]))
    begin, ready = marks.get("vllm_begin"), marks.get("vllm_ready")
    first_seen, last_seen = marks.get("first_eval_seen"), marks.get("last_eval_seen")
    # by step: the base model's evaluation is at step 0, the final model's after the last iteration (a run
    # that stopped early has only the first)
    base = [e for e in evaluations if e.get("step") == 0]
    final = [e for e in evaluations if e.get("step") != 0]
    before = _f(base[0].get("eval_seconds")) if base else None
    after = _f(final[-1].get("eval_seconds")) if final else None
    rows.append(("start-up: job (embedded S3, task app)", begin))
    rows.append(
        ("start-up: vLLM (policy rollout server)", ready - begin if None not in (begin, ready) else None)
    )
    trainer = None
    if ready is not None and first_seen is not None and before is not None:
        trainer = max(0.0, first_seen - ready - before)
    rows.append(("start-up: trainer (its model load after vLLM is ready)", trainer))
    rows.append(("held-out evaluation, base model", before))
    for d in detail:
        rows.append((f"iteration {d.get('step')}", _f(d.get("iteration_seconds"))))
    rows.append(("held-out evaluation, final model", after))
    rl = timings.get("rl_s")
    rows.append(("final save and stop", max(0.0, rl - last_seen) if None not in (rl, last_seen) else None))
    if "independent_eval_s" in timings:
        rows.append(("independent evaluation", timings["independent_eval_s"]))
    return rows


def phase_table(
    timings: dict[str, float],
    marks: dict[str, float],
    detail: list[dict[str, Any]],
    evaluations: list[dict[str, Any]],
    total_s: float,
) -> str:
    """The phase table printed at the demo's end: one line per phase, each iteration split into rollout /
    update / weight sync, then the start-up, iteration and evaluation totals."""

    def sec(value: float | None) -> str:
        return f"{value:8.1f}" if value is not None else f"{'-':>8}"

    lines = [f"  {'phase':48} {'seconds':>8}   {'rollout':>8} {'update':>8} {'sync':>6}  mean_return  mixed"]
    iterations = {f"iteration {d.get('step')}": d for d in detail}
    for name, seconds in phase_rows(timings, marks, detail, evaluations):
        line = f"  {name:48} {sec(seconds)}"
        d = iterations.get(name)
        if d is not None:
            mean = d.get("mean_return")
            mixed = d.get("mixed_groups")
            line += (
                f"   {_f(d.get('rollout_seconds')):8.1f} {_f(d.get('update_seconds')):8.1f}"
                f" {_f(d.get('weight_sync_seconds')):6.1f}"
                f"  {format(mean, '11.3f') if isinstance(mean, int | float) else '-':>11}"
                f"  {(str(mixed) + '/' + str(d.get('groups'))) if mixed is not None and d.get('groups') else '-':>5}"
            )
        lines.append(line)
    rows = dict(phase_rows(timings, marks, detail, evaluations))
    startup = [v for k, v in rows.items() if k.startswith("start-up") and v is not None]
    evals = [rows.get("held-out evaluation, base model"), rows.get("held-out evaluation, final model")]
    lines.append(f"  {'-' * 48}")
    lines.append(f"  {'start-up, in all':48} {sec(sum(startup) if startup else None)}")
    lines.append(
        f"  {f'iterations ({len(detail)}), in all':48} {sec(sum(_f(d.get('iteration_seconds')) for d in detail))}"
        f"   {sum(_f(d.get('rollout_seconds')) for d in detail):8.1f}"
        f" {sum(_f(d.get('update_seconds')) for d in detail):8.1f}"
        f" {sum(_f(d.get('weight_sync_seconds')) for d in detail):6.1f}"
    )
    seen = [v for v in evals if v is not None]
    lines.append(f"  {'held-out evaluations, in all':48} {sec(sum(seen) if seen else None)}")
    lines.append(f"  {'total':48} {sec(total_s)}")
    return "\n".join(lines)


def curve_series(
    progress: list[dict[str, Any]], evaluations: list[dict[str, Any]] | None = None
) -> dict[str, list[tuple[float, float]]]:
    """{"train": [(iteration, sampled mean_return)], "held_out": [(step, greedy eval score)]}: the evaluation
    at step 0 is the base model's, the last one the final model's."""
    train = [(float(p.get("step", i + 1)), float(p["meanReturn"])) for i, p in enumerate(progress)]
    held_out = [
        (float(e.get("step", 0)), float(e["eval_score"]))
        for e in evaluations or []
        if isinstance(e.get("eval_score"), int | float)
    ]
    return {"train": train, "held_out": held_out}


def plot(
    progress: list[dict[str, Any]],
    path: Path,
    title: str,
    evaluations: list[dict[str, Any]] | None = None,
    eval_label: str = "held-out greedy accuracy",
) -> Path:
    """The reward curve PNG: sampled training mean per iteration (line), held-out greedy points (squares,
    labelled with their values)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = curve_series(progress, evaluations)
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=120)
    if series["train"]:
        xs, ys = zip(*series["train"], strict=True)
        ax.plot(xs, ys, marker="o", color="tab:blue", label="mean reward, sampled training rollouts (T = 1)")
    if series["held_out"]:
        xs, ys = zip(*series["held_out"], strict=True)
        ax.plot(xs, ys, linestyle="none", marker="s", markersize=9, color=HELD_OUT_COLOR, label=eval_label)
        for x, y in series["held_out"]:
            ax.annotate(f"{y:.2f}", (x, y), textcoords="offset points", xytext=(0, 8), ha="center",
                        color=HELD_OUT_COLOR, fontsize=8)  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("iteration (0: the base model)")
    ax.set_ylabel("reward / accuracy")
    values = [y for _, y in series["train"]] + [y for _, y in series["held_out"]]
    ax.set_ylim(-0.02, max([1.1, *(v * 1.1 for v in values)]))  # craftworld's return can pass 1
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def first_at_least(values: list[Any], target: float) -> int | None:
    """1-based index of the first number >= target, or None."""
    for index, value in enumerate(values, 1):
        if isinstance(value, int | float) and value >= target:
            return index
    return None


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5"."""
    spans: list[list[int]] = []
    for n in numbers:
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def missed_bar(eval_final: float | None, bar: float) -> bool:
    """A demo misses its bar when its final held-out score is below it, or when there is none."""
    return eval_final is None or eval_final < bar


# How many of a run's last iterations tell whether its training reward reached the bar.
LATE_ITERATIONS = 6


def diagnosis(
    detail: list[dict[str, Any]], eval_base: float | None, eval_final: float | None, bar: float,
    measure: str = "accuracy",
) -> str:  # fmt: skip
    """Why a demo missed its bar, in one line, from the run's own metrics: its held-out score against the bar,
    the iterations whose groups were all uniform (every rollout of a group rewarded alike: advantage 0, no
    gradient), how far the sampled training mean_return rose, and whether it stayed at the bar over the last
    iterations (it learned; the greedy held-out answers fell short)."""
    if eval_final is None:
        return "the job ended without a final held-out evaluation"
    head = f"held-out {measure} {eval_final:.3f} < {bar}"
    if eval_base is not None:
        head += f" (base model {eval_base:.3f})"
    parts: list[str] = []
    steps = [int(d.get("step") or i) for i, d in enumerate(detail, 1)]
    uniform = [s for s, d in zip(steps, detail, strict=True) if d.get("mixed_groups") == 0]
    leading = 0
    for d in detail:
        if d.get("mixed_groups") != 0:
            break
        leading += 1
    if detail and leading == len(detail):
        parts.append("no iteration had a mixed group (every group all-0 or all-1): no gradient at all")
    elif leading:
        first = steps[0]
        span = f"iteration {first}" if leading == 1 else f"iterations {first}-{steps[leading - 1]}"
        parts.append(f"{span} had no mixed groups (every group all-0 or all-1), so no gradient until "
                     f"iteration {steps[leading]}")  # fmt: skip
        later = uniform[leading:]
        if later:
            parts.append(f"nor had iteration(s) {_ranges(later)}")
    elif uniform:
        parts.append(f"iteration(s) {_ranges(uniform)} had no mixed groups (no gradient)")
    returns = [d.get("mean_return") for d in detail]
    numbers = [r for r in returns if isinstance(r, int | float)]
    if numbers:
        reached = first_at_least(returns, 0.5)
        if reached is None:
            best = max(numbers)
            parts.append(f"training mean_return rose only to {best:.2f} (iteration {steps[returns.index(best)]})")
        else:
            parts.append(f"training mean_return first reached 0.5 at iteration {steps[reached - 1]} of "
                         f"{len(detail)}, ending at {numbers[-1]:.2f}")  # fmt: skip
            late = numbers[-LATE_ITERATIONS:]
            above = sum(r >= bar for r in late)
            if bar > 0 and 2 * above >= len(late):
                # the run learned and its last updates left the greedy answers just under the bar: a margin miss,
                # which a user should not read as "it does not learn"
                parts.append(f"it learned (sampled training mean_return >= {bar} in {above} of the last "
                             f"{len(late)} iterations), but its greedy held-out answers fell "
                             f"{bar - eval_final:.3f} short")  # fmt: skip
    return head + (": " + "; ".join(parts) if parts else "")


def rerun_command(seed: int, task: str = "math", sft_warmup: bool = False, config: str | None = None) -> str:
    """The command that reruns a demo with its seed (same machine: the same run); config: a --config other
    than the task's own."""
    import shlex

    args = [*(["--task", task] if task != "math" else []), *(["--sft-warmup"] if sft_warmup else []),
            *(["--config", config] if config else []), "--seed", str(seed)]  # fmt: skip
    return f'make demo DEMO_ARGS="{shlex.join(args)}"'
