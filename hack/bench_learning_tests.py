"""The false-failure rate of the learning tests (the tests that assert a model learned) on this machine.

Each chosen test runs --runs N times, one pytest process per (test, seed), one after the other, with
POSTTRAIN_TEST_SEED = --seed-base, --seed-base + 1, ... (tests/fixtures/seeds.py: each learning test takes its
seed from there when it is set; unset, `make test` keeps the tests' own seeds, 0/1 for RL and 42 for SFT, which
is why the default base is 1000). A run is `.venv/bin/python -m pytest <id> -q -p no:cacheprovider -rA` from
the repository root with bin/ first on PATH, as `make test` runs it. Printed per run: the test, the seed,
PASS/FAIL (or SKIP, ERROR, TIMEOUT), the wall seconds (pytest start-up included) and what the test printed
about its numbers (reward curve, held-out loss or return; on a failure also pytest's one-line reason, the
assertion with its values). Then per test: runs, failures, failure share, median wall time; the last line is one
JSON object {"tests": {id: {"runs", "seeds", "failed_seeds", "failures", "wall_s_median", ...}}, "cpu": ...}.
Every run's whole output is kept in bench-results/learning_runs/, the records in --json-out.

The 9 learning tests (default: all of them) and their wall time per run, pytest's start-up included (the
medians on an AMD EPYC Zen 4, AVX-512 with avx512_bf16, 2 cores: docs/benchmarks.md; the two e2e tests from single runs):
  tests/integration/test_rl_learning.py::test_gspo_lifts_mean_reward_on_toy_task                  ~14 s
  tests/integration/test_dapo_learning.py::test_dapo_lifts_mean_reward_on_toy_task                 ~14 s
  tests/integration/test_restem_toy_learning.py::test_restem_lifts_held_out_reward_on_toy_task      ~22 s (Zen 3, AVX2 only)
  tests/integration/test_trainer_sft.py::test_sft_lowers_heldout_loss_and_uploads_artifacts        ~30 s
  tests/integration/test_trainer_sft.py::test_torchrun_two_processes_match_one                     ~33 s
  tests/integration/test_trainer_sft_vision.py::test_vision_sft_lowers_heldout_loss                ~25 s
  tests/integration/test_trainer_qlora.py::test_qlora_sft_learns_like_lora                         ~22 s
  tests/e2e/test_craftworld_learning.py::test_held_out_return_rises_on_craftworld                  ~7.5-10 min
  tests/e2e/test_restem_learning.py::test_restem_raises_held_out_reward_over_two_iterations        ~11 min (AVX512-BF16),
                                                                                                    ~5 min on a Zen 3 (AVX2 only)
One seed of all 9 is about 20 min on a quiet fast CPU, so the default 20 runs take about 7 hours; the two
e2e tests are nearly all of it. The 7 integration tests alone: about 3 min a seed, under an hour for 20.
(The DAPO test is parametrized [0, 1] in `make test`; with POSTTRAIN_TEST_SEED set it runs that one seed, so
its id is given without the [param] suffix.)

Not a test, and not part of `make bench` (hack/bench.sh skips it: hours, not minutes). `make bench-learning`, or
`.venv/bin/python hack/bench_learning_tests.py [--runs 20] [--seed-base 1000] [--test ID ...]
[--timeout-s S] [--json-out PATH]`, e.g. `--runs 5 --test tests/integration/test_rl_learning.py::test_gspo_lifts_mean_reward_on_toy_task`."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from abtiming import uptime

REPO = Path(__file__).resolve().parents[1]
SEED_ENV = "POSTTRAIN_TEST_SEED"  # tests/fixtures/seeds.py
LEARNING_TESTS = [
    "tests/integration/test_rl_learning.py::test_gspo_lifts_mean_reward_on_toy_task",
    "tests/integration/test_dapo_learning.py::test_dapo_lifts_mean_reward_on_toy_task",
    "tests/integration/test_restem_toy_learning.py::test_restem_lifts_held_out_reward_on_toy_task",
    "tests/integration/test_trainer_sft.py::test_sft_lowers_heldout_loss_and_uploads_artifacts",
    "tests/integration/test_trainer_sft.py::test_torchrun_two_processes_match_one",
    "tests/integration/test_trainer_sft_vision.py::test_vision_sft_lowers_heldout_loss",
    "tests/integration/test_trainer_qlora.py::test_qlora_sft_learns_like_lora",
    "tests/e2e/test_craftworld_learning.py::test_held_out_return_rises_on_craftworld",
    "tests/e2e/test_restem_learning.py::test_restem_raises_held_out_reward_over_two_iterations",
]
# the start of each line the learning tests print about their numbers
NUMBERS_LINE = re.compile(
    r"^(toy GSPO seed|toy DAPO seed|held-out loss|vision held-out loss|held-out mean return by evaluation"
    r"|best fixed action sequence|held-out eval by iteration)"
)
BEFORE_AFTER = re.compile(r"before ([-\d.]+) after ([-\d.]+)")
COUNTS = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)")


def cpu_description() -> str:
    """The CPU, as hack/bench_demo_curve.py names it: model with family/model, torch's capability, cores."""
    from posttrain import hardware

    return f"{hardware.cpu_label()}; {hardware.probe().describe()}; {os.cpu_count()} cores"


def pytest_argv(test_id: str) -> list[str]:
    python = REPO / ".venv" / "bin" / "python"
    return [str(python if python.exists() else Path(sys.executable)), "-m", "pytest", test_id, "-q",
            "-p", "no:cacheprovider", "-rA"]  # fmt: skip


def outcome_of(exit_code: int | None, output: str) -> str:
    """pass, fail, skip, error (collection error, crash, no such test) or timeout (exit_code None)."""
    if exit_code is None:
        return "timeout"
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    counts = {("error" if kind.startswith("error") else kind): int(n) for n, kind in COUNTS.findall(tail)}
    if counts.get("failed"):
        return "fail"
    if counts.get("error") or exit_code not in (0, 1):
        return "error"
    if counts.get("passed"):
        return "pass"
    if counts.get("skipped"):
        return "skip"
    return "error"


def numbers_of(output: str) -> str:
    """What the test printed about its numbers, the lift where it printed before/after, and on a failure
    pytest's one-line reason (`-rA`: `FAILED id - AssertionError: ...`)."""
    parts: list[str] = []
    for line in output.splitlines():
        line = line.strip()
        if NUMBERS_LINE.match(line) and line not in parts:
            parts.append(line)
            if found := BEFORE_AFTER.search(line):
                parts.append(f"lift {float(found.group(2)) - float(found.group(1)):+.3f}")
        elif line.startswith(("FAILED ", "ERROR ")) and " - " in line:
            parts.append(line.split(" - ", 1)[1][:300])
    return "; ".join(parts)


def run_once(test_id: str, seed: int, timeout_s: float | None, log_dir: Path) -> dict[str, Any]:
    env = {**os.environ, SEED_ENV: str(seed), "PATH": f"{REPO / 'bin'}:{os.environ.get('PATH', '')}"}
    started = time.monotonic()
    proc = subprocess.Popen(pytest_argv(test_id), cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout_s)
        exit_code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # pytest and what it started in its session
        try:
            output, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
        exit_code = None
    wall = time.monotonic() - started
    log_dir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", test_id.removeprefix("tests/"))
    (log_dir / f"{slug}-seed-{seed}.log").write_text(output)
    return {"test": test_id, "seed": seed, "outcome": outcome_of(exit_code, output), "exit_code": exit_code,
            "wall_s": round(wall, 1), "numbers": numbers_of(output)}  # fmt: skip


def per_test(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One test's runs: the JSON line's entry."""
    walls = [r["wall_s"] for r in records]
    failed = [r["seed"] for r in records if r["outcome"] == "fail"]
    return {
        "runs": len(records),
        "seeds": [r["seed"] for r in records],
        "failed_seeds": failed,
        "failures": len(failed),
        "failure_share": len(failed) / len(records) if records else None,
        "wall_s_median": statistics.median(walls) if walls else None,
        # runs that neither passed nor failed (skipped, errored, timed out): not counted as failures
        "other": {r["seed"]: r["outcome"] for r in records if r["outcome"] not in ("pass", "fail")},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=20, help="seeds per test (default 20)")
    parser.add_argument("--seed-base", type=int, default=1000,
                        help="the first seed (default 1000: not the seeds `make test` uses)")  # fmt: skip
    parser.add_argument("--test", action="append", default=None, metavar="ID",
                        help="a pytest node id (repeatable; default: the 8 learning tests)")  # fmt: skip
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="kill a run after this many seconds (default: none beyond the tests' own pytest "
                             "timeouts: 900 s, 300 s for the toy tests, 7,500 s for ReST-EM)")  # fmt: skip
    parser.add_argument("--json-out", type=Path, default=REPO / "bench-results" / "learning_tests.json")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.seed_base < 0:
        parser.error("--runs must be >= 1 and --seed-base >= 0")
    tests = list(dict.fromkeys(args.test or LEARNING_TESTS))
    seeds = [args.seed_base + i for i in range(args.runs)]
    log_dir = args.json_out.parent / "learning_runs"
    cpu = cpu_description()
    print(f"machine: {cpu}; {uptime()}", flush=True)
    print(f"{len(tests)} test(s) x seeds {seeds[0]}-{seeds[-1]}; logs in {log_dir}", flush=True)
    records: list[dict[str, Any]] = []
    for test_id in tests:
        for seed in seeds:
            record = run_once(test_id, seed, args.timeout_s, log_dir)
            records.append(record)
            print(f"{test_id} seed {seed}: {record['outcome'].upper()} {record['wall_s']:.1f} s"
                  + (f"  {record['numbers']}" if record["numbers"] else ""), flush=True)  # fmt: skip
    summary = {t: per_test([r for r in records if r["test"] == t]) for t in tests}
    print(f"\n== per test ({uptime()})")
    print(f"{'runs':>5} {'failures':>9} {'share':>6} {'median wall s':>14}  test")
    for test_id, s in summary.items():
        other = f"  (not pass/fail: {s['other']})" if s["other"] else ""
        print(f"{s['runs']:>5} {s['failures']:>9} {s['failure_share']:>6.2f} {s['wall_s_median']:>14.1f}  "
              f"{test_id}{other}")  # fmt: skip
    result = {"tests": summary, "cpu": cpu}
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"records": records, **result}, indent=2))
    print(f"written: {args.json_out}")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
