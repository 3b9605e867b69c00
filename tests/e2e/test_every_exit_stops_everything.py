"""Every exit stops everything: a signal to `make demo`'s process group (what a terminal's Ctrl-C and `timeout`
send), SIGKILL of that whole group, and SIGTERM or SIGKILL of a pytest session leave no process behind: not
the embedded S3 (`weed mini`), the task app, the rollout server and vLLM's engine processes, torchrun and its
workers, the control plane, nor the reapers themselves.

How "no process behind" is checked: every run gets a unique environment variable that all its descendants
inherit (whatever process group or session they moved to); afterwards no live process may carry it.
The runs use the tiny random model (head_dim 32, which vLLM's CPU attention accepts)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from fixtures.tiny_rl import tiny_rl_toml

pytestmark = [pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
MARK = "POSTTRAIN_TEST_RUN_MARK"

RL_TOML = tiny_rl_toml(label="survivors", iterations=500)


def marked_processes(mark: str) -> list[str]:
    """Live (not zombie) processes whose environment carries MARK=mark: 'pid command'."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if needle not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
        except OSError:  # gone meanwhile, or not readable
            continue
        if state != "Z":
            found.append(f"{proc.name} {command}")
    return found


def wait_until_none_left(mark: str, timeout: float = 90.0) -> list[str]:
    """The reapers give each group a grace period (SIGTERM, then SIGKILL): poll until none is left."""
    deadline = time.monotonic() + timeout
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = marked_processes(mark)
    return left


@pytest.fixture
def mark():
    """This test's mark; whatever still carries it when the test ends (it failed) is killed."""
    value = uuid.uuid4().hex
    yield value
    for entry in marked_processes(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(entry.split()[0]), signal.SIGKILL)


def start_in_own_group(
    argv: list[str], mark: str, *, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """A child in its own session and process group, as `make demo` is under `timeout` or a terminal."""
    child_env = {k: v for k, v in os.environ.items() if k not in ("TASK_APP_URL", "KUBECONFIG")}
    child_env.update({MARK: mark, "PYTHONUNBUFFERED": "1", **(env or {})})
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            env=child_env, start_new_session=True)  # fmt: skip


def read_until(proc: subprocess.Popen, pattern: str, timeout: float) -> str:
    """Lines of proc's output until one contains pattern (fails on exit or timeout)."""
    import selectors

    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not selector.select(timeout=1.0):
            continue
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if pattern in line:
            return "".join(seen)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"{pattern!r} not seen (exit {proc.poll()}):\n{''.join(seen)[-4000:]}")


@pytest.fixture(scope="module")
def tiny_hd32() -> Path:
    from posttrain.modelzoo import build_tiny_model

    return build_tiny_model(REPO / ".models" / "tiny-random-qwen2-hd32", hidden_size=128)


def demo_argv(tmp_path: Path, model: Path) -> list[str]:
    """`make demo` itself (make -> bash hack/demo.sh -> python -m posttrain.local.demo), on the tiny model;
    `-o setup`: the venv this test runs in is the one `make setup` made."""
    config = tmp_path / "rl.toml"
    config.write_text(RL_TOML)
    demo_args = (f"--config {config} --model-path {model} --runs-dir {tmp_path / 'runs'} "
                 "--nproc-per-node 2")  # fmt: skip
    return ["make", "--no-print-directory", "-o", "setup", "demo", f"DEMO_ARGS={demo_args}"]


def test_sigterm_to_the_demos_process_group_mid_run(tmp_path, tiny_hd32, mark):
    """What `timeout` does (a terminal's Ctrl-C is the same with SIGINT, the same handler): the signal
    reaches every process in the group at once (make, the demo and its `posttrain train --local`), each
    stops what it started, the demo exits 130 and nothing is left."""
    proc = start_in_own_group(demo_argv(tmp_path, tiny_hd32), mark)
    before = read_until(proc, "step 1/500", timeout=900)
    assert "phase: Running" in before
    assert len(marked_processes(mark)) >= 8, marked_processes(
        mark
    )  # demo, runner, S3, app, vLLM, torchrun...
    os.killpg(proc.pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=180)
    # make waits for the demo (which exits 130 once it has stopped everything), then dies of the signal itself
    assert proc.returncode in (-signal.SIGTERM, 130), before[-2000:] + rest[-3000:]
    assert "phase: Failed" in rest and "interrupted" in rest, rest[-3000:]
    assert wait_until_none_left(mark) == []


def test_sigkill_of_the_demos_whole_group_mid_run(tmp_path, tiny_hd32, mark):
    """`timeout -s KILL`: make, the demo and the runner die at once and run no clean-up; the reapers (their own
    sessions, so the group signal misses them) stop S3, the task app, the rollout server (which stops vLLM)
    and torchrun."""
    proc = start_in_own_group(demo_argv(tmp_path, tiny_hd32), mark)
    read_until(proc, "step 1/500", timeout=900)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert wait_until_none_left(mark) == []


PYTEST_SESSION = """
import time


def test_hold_the_fixtures(cluster, s3_server, math_taskapp):
    print("FIXTURES-READY", flush=True)
    time.sleep(900)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_pytest_session_killed_leaves_no_fixture_behind(tmp_path, mark, sig):
    """A `make test` run stopped by SIGTERM (CI cancelling a job) tears its fixtures down like Ctrl-C; one
    killed outright leaves them to the reapers. Either way the control plane, S3 and the task app go."""
    (tmp_path / "test_hold.py").write_text(textwrap.dedent(PYTEST_SESSION))
    plugins = ["fixtures.models", "fixtures.taskapp", "fixtures.s3", "fixtures.cluster", "fixtures.signals"]
    argv = [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
            *(arg for plugin in plugins for arg in ("-p", plugin)), str(tmp_path / "test_hold.py")]  # fmt: skip
    # the fixtures, and hack/ for the control plane they start (hack/posttrain_dev): --rootdir is not ours
    python_path = os.pathsep.join([str(REPO / "tests"), str(REPO / "hack"), os.environ.get("PYTHONPATH", "")])
    proc = start_in_own_group(argv, mark, cwd=tmp_path, env={"PYTHONPATH": python_path})
    read_until(proc, "FIXTURES-READY", timeout=600)
    names = " ".join(marked_processes(mark))
    for expected in ("kube-apiserver", "etcd", "weed", "app.py", "posttrain.reaper"):
        assert expected in names, names
    os.kill(proc.pid, sig)  # the pytest process only, as a CI runner or `kill PID` does
    proc.communicate(timeout=180)
    assert wait_until_none_left(mark) == []
