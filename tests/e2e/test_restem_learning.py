"""ReST-EM learns, as a real job: `posttrain train --local --config examples/restem_math.toml` on
SmolLM2-135M-Instruct against the math task app (one-digit + one-digit addition). Each of the 2 iterations
samples 6 answers (temperature 0.8) to each of 24 training problems through the vLLM rollout server, keeps
the right ones and fine-tunes the base model on them; the trainer evaluates 2 sampled answers (temperature 0.8) to each of 48 held-out problems (the task app's
eval split, disjoint from training) before training and after each iteration.

The test asserts that the held-out reward after the 2nd iteration exceeds the base model's by MARGIN, that
each iteration kept some samples and trained from the base model, and that the run left its reward curve,
its kept samples and nothing running. Measured numbers are in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.seeds import seed_from_env

# `make test-learning`: ~5 min a run on 2 AVX2-only cores (277-342 s over 10 seeds; docs/benchmarks.md)
pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.learning]

REPO = Path(__file__).resolve().parents[2]
# measured: ~50 min on this 2-core machine while shared (load average ~11); far beyond the default 900 s
RUN_TIMEOUT_S = 2 * 3600
MARGIN = 0.15  # held-out accuracy, iteration 2 minus the base model (48 problems: 0.15 is 7+ more right)


@pytest.mark.timeout(RUN_TIMEOUT_S + 300)
def test_restem_raises_held_out_reward_over_two_iterations(tmp_path):
    runs = tmp_path / "runs"
    env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
    runner = subprocess.Popen(
        [sys.executable, "-m", "posttrain.cli", "train", "--local", "--config", "examples/restem_math.toml",
         "--runs-dir", str(runs), "--set", f"training.seed={seed_from_env(0)}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
    )  # fmt: skip
    try:
        stdout, stderr = runner.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        runner.send_signal(signal.SIGTERM)  # the runner stops everything it started on SIGTERM
        stdout, stderr = runner.communicate(timeout=120)
        pytest.fail(f"the ReST-EM run took more than {RUN_TIMEOUT_S} s:\n{stdout[-4000:]}")
    done = subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    run_dir = Path(re.search(r"run folder (\S+)", done.stdout).group(1))
    lines = [json.loads(x) for x in (run_dir / "report.jsonl").read_text().splitlines()]
    evals = {x["step"]: x["eval_score"] for x in lines if x.get("event") == "evaluation"}
    iterations = [x for x in lines if x.get("event") == "restem_iteration"]
    print(f"held-out eval by iteration: {evals}; kept: {[x['kept'] for x in iterations]}")
    assert sorted(evals) == [0, 1, 2]
    assert len(iterations) == 2 and all(x["kept"] > 0 and x["sft_steps"] > 0 for x in iterations)
    assert evals[2] - evals[0] >= MARGIN, f"held-out reward {evals[0]:.3f} -> {evals[2]:.3f}, margin {MARGIN}"
    assert "phase: Succeeded" in done.stdout and re.search(
        r"^fine_tuned_model: rl:HuggingFaceTB/SmolLM2", done.stdout, re.M
    )
    work = run_dir / "work"
    assert (work / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    kept = [json.loads(x) for x in (work / "restem-iteration-1.jsonl").read_text().splitlines()]
    assert kept and all(k["reward"] >= 1.0 and "What is" in k["prompt"] for k in kept)
    pids = json.loads((run_dir / "pids.json").read_text())
    for pid in pids.values():
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
