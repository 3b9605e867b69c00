"""Child processes of the local runner: each in its own process group (so that torchrun's workers and vLLM's
engine processes go with it), its output in a log file, stopped in reverse start order on exit, failure or
Ctrl-C (posttrain.localhost.stop_group: SIGTERM to the group, then SIGKILL after a grace period). Every
group is also handed to this process's reaper (posttrain.reaper), which stops it if this process dies
before it could (SIGKILL, OOM)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from posttrain import reaper
from posttrain.localhost import stop_group


class ProcessFailed(RuntimeError):
    """A child exited early or never became ready; the message names its log file."""


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


class ManagedProcess:
    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log: IO[bytes] = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
        self.popen = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,  # own process group: killpg reaches its children
        )
        reaper.watch(self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def check_alive(self) -> None:
        code = self.popen.poll()
        if code is not None:
            raise ProcessFailed(
                f"{self.name} exited with code {code}; log {self.log_path}:\n{tail(self.log_path)}"
            )

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def stop(self, grace: float = 10.0) -> None:
        stop_group(self.popen, grace)
        reaper.unwatch(self.popen.pid)
        self._log.close()


class ProcessSet:
    """Starts processes and stops all of them, newest first, when the `with` block ends (any way)."""

    def __init__(self, pid_file: Path | None = None) -> None:
        self.processes: list[ManagedProcess] = []
        self.pid_file = pid_file
        self._pids: dict[str, int] = {}

    def record(self, name: str, pid: int) -> None:
        """Note a pid in pid_file (JSON {name: pid}): what was started, for people and tests."""
        self._pids[name] = pid
        if self.pid_file is not None:
            self.pid_file.parent.mkdir(parents=True, exist_ok=True)
            self.pid_file.write_text(json.dumps(self._pids, indent=2))

    def start(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> ManagedProcess:
        proc = ManagedProcess(name, argv, log_path, env=env, cwd=cwd)
        self.processes.append(proc)
        self.record(name, proc.pid)
        return proc

    def check_alive(self) -> None:
        for proc in self.processes:
            proc.check_alive()

    def stop_all(self) -> None:
        while self.processes:
            self.processes.pop().stop()

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def wait_http(
    url: str,
    *,
    timeout: float,
    proc: ManagedProcess | None = None,
    headers: dict[str, str] | None = None,
    ok: Callable[[httpx.Response], bool] | None = None,
    interval: float = 0.5,
) -> None:
    """Poll `url` until it answers (200 by default); fail early if `proc` exits."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None:
            proc.check_alive()
        try:
            response = httpx.get(url, headers=headers, timeout=5.0)
            if (ok or (lambda r: r.status_code == 200))(response):
                return
            last = f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(interval)
    where = f"; log {proc.log_path}:\n{tail(proc.log_path)}" if proc else ""
    raise ProcessFailed(f"{url} not ready after {timeout:.0f} s ({last}){where}")


@contextlib.contextmanager
def sigterm_as_keyboard_interrupt():
    """SIGTERM and SIGINT raise KeyboardInterrupt (also where SIGINT was inherited as ignored, e.g. a
    background job of a script), so that `finally` blocks stop the children. Only the first signal does: the
    ones after it (a terminal's Ctrl-C reaches the whole group, then a parent forwards it) are ignored until
    the block ends, so that they cannot break off the clean-up half-way."""

    def handler(signum: int, frame: object) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextlib.contextmanager
def forwarding_signals(child: subprocess.Popen, grace: float = 120.0) -> Iterator[list[int]]:
    """For a process that relays a child's output: SIGTERM and SIGINT are noted (in the yielded list) and
    passed on to `child` as one SIGTERM, and nothing is raised, so the relay reads on to the child's last
    line; the caller raises KeyboardInterrupt once the child is gone. A child still running `grace` seconds
    after the signal is killed (it would otherwise hold the relay forever)."""
    received: list[int] = []
    killer = threading.Timer(grace, child.kill)
    killer.daemon = True

    def handler(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) == 1:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
            killer.start()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield received
    finally:
        killer.cancel()
        for sig, old in previous.items():
            signal.signal(sig, old)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent exits (Linux prctl PR_SET_PDEATHSIG).
    Used as a child's preexec hook where the child must not outlive the one process that reads its output
    (the demo's `posttrain train --local`); a no-op where prctl is unavailable."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
