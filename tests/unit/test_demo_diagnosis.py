"""A demo that misses its bar says why in one line, from the run's own metrics, and how to rerun it with its
seed (posttrain.local.demo_report.diagnosis / rerun_command; pure, on plain metric rows)."""

from __future__ import annotations

import shlex

import pytest
from posttrain.local.demo import parse_args
from posttrain.local.demo_report import diagnosis, first_at_least, missed_bar, rerun_command


def rows(returns: list[float], mixed: list[int]) -> list[dict]:
    return [{"step": i, "mean_return": r, "mixed_groups": m, "groups": 8}
            for i, (r, m) in enumerate(zip(returns, mixed, strict=True), 1)]  # fmt: skip


def test_leading_iterations_without_mixed_groups_are_named():
    detail = rows([0.0, 0.02, 0.0, 0.06, 0.03, 0.05, 0.3, 0.5], [0, 0, 0, 0, 0, 0, 3, 6])
    line = diagnosis(detail, 0.086, 0.633, 0.8)
    assert line == ("held-out accuracy 0.633 < 0.8 (base model 0.086): iterations 1-6 had no mixed groups "
                    "(every group all-0 or all-1), so no gradient until iteration 7; training mean_return "
                    "first reached 0.5 at iteration 8 of 8, ending at 0.50")  # fmt: skip
    assert "\n" not in line


def test_a_slow_rise_is_named_with_its_peak():
    detail = rows([0.05, 0.2, 0.45, 0.38], [2, 4, 6, 5])
    assert diagnosis(detail, 0.1, 0.63, 0.8) == (
        "held-out accuracy 0.630 < 0.8 (base model 0.100): training mean_return rose only to 0.45 (iteration 3)"
    )


def test_a_run_that_learned_and_fell_short_greedily_says_so():
    # seed 4 of make demo on an AVX2 CPU: sampled reward 0.83-0.95 over the last six iterations, greedy 0.773
    returns = [0.03, 0.12, 0.28, 0.64, 0.60, 0.73, 0.61, 0.72, 0.85, 0.84, 0.90, 0.86, 0.95, 0.83]
    line = diagnosis(rows(returns, [8] * 14), 0.086, 0.773, 0.8)
    assert line == ("held-out accuracy 0.773 < 0.8 (base model 0.086): training mean_return first reached 0.5 "
                    "at iteration 4 of 14, ending at 0.83; it learned (sampled training mean_return >= 0.8 in "
                    "6 of the last 6 iterations), but its greedy held-out answers fell 0.027 short")  # fmt: skip
    # fewer than half of the last six at the bar: no such claim
    short = diagnosis(rows(returns[:-5] + [0.7, 0.75, 0.6, 0.79, 0.83], [8] * 14), 0.086, 0.773, 0.8)
    assert "it learned" not in short and short.endswith("ending at 0.83")
    # a bar of 0 (the agent demo) is never missed by a score, so never explained this way
    assert "it learned" not in diagnosis(rows(returns, [8] * 14), 0.0, -0.1, 0.0)


def test_uniform_iterations_later_in_the_run_and_all_uniform():
    later = diagnosis(rows([0.1, 1.0, 0.2, 1.0, 1.0], [1, 0, 2, 0, 0]), None, 0.7, 0.8)
    assert "iteration(s) 2, 4-5 had no mixed groups" in later and "base model" not in later
    after_leading = diagnosis(rows([0.0, 0.2, 0.0], [0, 3, 0]), 0.1, 0.2, 0.8)
    assert "iteration 1 had no mixed groups" in after_leading and "nor had iteration(s) 3" in after_leading
    none = diagnosis(rows([0.0, 0.0], [0, 0]), 0.05, 0.05, 0.8)
    assert "no iteration had a mixed group" in none and "rose only to 0.00 (iteration 1)" in none
    assert diagnosis([], 0.1, None, 0.8) == "the job ended without a final held-out evaluation"
    assert diagnosis([], 0.4, 0.44, 0.5, "mean return") == "held-out mean return 0.440 < 0.5 (base model 0.400)"


def test_only_a_run_below_its_bar_or_without_a_final_score_misses_it():
    # summary.json's diagnosis is written only for a miss: a passing run's line would read "0.836 < 0.8"
    assert missed_bar(0.633, 0.8) and missed_bar(None, 0.8) and missed_bar(0.0, 0.5)
    assert not missed_bar(0.8, 0.8) and not missed_bar(0.836, 0.8) and not missed_bar(0.0, 0.0)


def test_first_at_least_skips_missing_values():
    assert first_at_least([None, 0.4, 0.5, 0.9], 0.5) == 3
    assert first_at_least([0.1, None], 0.5) is None


@pytest.mark.parametrize(
    "task,warmup,expected",
    [("math", False, 'make demo DEMO_ARGS="--seed 7"'),
     ("agent", False, 'make demo DEMO_ARGS="--task agent --seed 7"'),
     ("math", True, 'make demo DEMO_ARGS="--sft-warmup --seed 7"')],
)  # fmt: skip
def test_the_rerun_command_is_one_the_demo_accepts(task, warmup, expected):
    command = rerun_command(7, task, warmup)
    assert command == expected
    demo_args = shlex.split(command)[2].split("=", 1)[1]
    args = parse_args(shlex.split(demo_args))
    assert (args.seed, args.task, args.sft_warmup) == (7, task, warmup)


def test_a_config_of_ones_own_is_part_of_the_rerun_command():
    command = rerun_command(3, "math", False, "my configs/rl.toml")
    assert command == 'make demo DEMO_ARGS="--config \'my configs/rl.toml\' --seed 3"'
    args = parse_args(shlex.split(shlex.split(command)[2].split("=", 1)[1]))
    assert str(args.config) == "my configs/rl.toml" and args.seed == 3


def test_the_demo_seed_defaults_to_the_configs():
    assert parse_args([]).seed is None  # Demo then reads the config's [training] seed, else draws one
    with pytest.raises(SystemExit):
        parse_args(["--seed", "-3"])


def test_the_demo_draws_a_seed_unless_told(tmp_path):
    from posttrain.local.demo import TASKS, Demo, _config_seed

    assert {task: _config_seed(entry[0]) for task, entry in TASKS.items()} == {"math": None, "agent": None}
    drawn = {Demo(parse_args(["--runs-dir", str(tmp_path)])).seed for _ in range(5)}
    assert all(isinstance(s, int) and 0 <= s < 1_000_000 for s in drawn) and len(drawn) > 1
    assert Demo(parse_args(["--runs-dir", str(tmp_path), "--seed", "9"])).seed == 9
    seeded = tmp_path / "rl.toml"
    seeded.write_text(TASKS["math"][0].read_text().replace("group_size = 8", "group_size = 8\nseed = 4", 1))
    assert Demo(parse_args(["--runs-dir", str(tmp_path), "--config", str(seeded)])).seed == 4
