"""`python -m posttrain_trainer.launch` is torchrun whose exit code keeps a worker's configuration-error code
(real torchrun, two worker processes): the trainer Job's podFailurePolicy fails such a job at once."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "posttrain_trainer.launch", "--standalone", "--nproc-per-node=2", *args],
        capture_output=True, text=True, timeout=180, cwd=cwd, env=env,
    )  # fmt: skip


def test_a_config_error_in_the_workers_is_the_launchers_exit_code(tmp_path: Path) -> None:
    missing = launch("-m", "posttrain_trainer", "rl", "--config", str(tmp_path / "nope.json"), cwd=tmp_path)
    assert missing.returncode == 78, missing.stderr[-2000:]
    assert "FileNotFoundError" in missing.stderr  # what the worker said, and torchrun's 1 turned into 78


def test_any_other_worker_failure_is_worth_retrying(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("import sys\nsys.exit(3)\n")
    crashed = launch(str(script), cwd=tmp_path)
    assert crashed.returncode == 1, crashed.stderr[-2000:]
    # the other worker may be stopped by torchrun (-15) before it exits by itself
    assert re.search(r"workers exited with \[(-15, )?3\]", crashed.stderr), crashed.stderr[-2000:]
