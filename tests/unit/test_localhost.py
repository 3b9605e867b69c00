"""posttrain.localhost: free ports, and stopping a server with its whole process group (real processes)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from posttrain import localhost
from posttrain.localhost import PICK_FLOOR, free_port, free_ports, stop_group, stop_pids


def _gone(pid: int) -> bool:
    """No such process, or a zombie (exited, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _start(script: str, log: Path) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-c", script], stdout=out, start_new_session=True)


def _first_line(log: Path, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text()
        if "\n" in text:
            return text.split("\n", 1)[0]
        time.sleep(0.05)
    raise AssertionError(f"nothing printed to {log}")


def test_free_ports_are_distinct_and_bindable():
    ports = free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_free_ports_stay_out_of_the_ephemeral_range_and_never_repeat():
    # the kernel gives ephemeral ports to outgoing connections: a server's port picked there can be taken
    # by one before the server binds it
    ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = free_ports(50) + [free_port() for _ in range(50)]
    assert len(set(picked)) == 100
    assert all(PICK_FLOOR <= port < ephemeral_low for port in picked), picked


def test_a_port_someone_listens_on_is_never_picked(monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        monkeypatch.setattr(localhost, "_pick_range", lambda: (taken, taken + 1))
        port = free_port()  # the only candidate is taken: the kernel's pick instead
        assert port != taken and port > 0


def test_a_leader_that_ignores_sigterm_is_killed_after_the_grace(tmp_path):
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    proc = _start(script, tmp_path / "stubborn.log")
    _first_line(tmp_path / "stubborn.log")
    started = time.monotonic()
    stop_group(proc, grace=0.5)
    assert proc.returncode == -9 and time.monotonic() - started < 10


def test_what_outlives_its_leader_goes_with_the_group(tmp_path):
    """A group member left behind by a leader that exited on SIGTERM (vLLM's engine core does that), and
    one left by a leader that had exited before stop_group was called."""
    script = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(float(sys.argv[1]))\n"
    )
    for leader_seconds in ("60", "0"):
        log = tmp_path / f"leader-{leader_seconds}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", script, leader_seconds], stdout=out, start_new_session=True
            )
        survivor = int(_first_line(log))
        if leader_seconds == "0":
            proc.wait(20)
        assert not _gone(survivor)
        stop_group(proc, grace=2.0)
        deadline = time.monotonic() + 5
        while not _gone(survivor) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(survivor), f"pid {survivor} outlived stop_group (leader ran {leader_seconds} s)"


def test_stop_pids_terms_then_kills_what_ignores_sigterm(tmp_path):
    """By pid (a pid file's processes): one exits on SIGTERM at once, the other ignores it and is killed
    after the grace; by group (the reaper's way): the same for a whole group."""
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(60)\n"
    polite = "import time\nprint('up', flush=True)\ntime.sleep(60)\n"
    procs = [_start(stubborn, tmp_path / "a.log"), _start(polite, tmp_path / "b.log")]
    for name in ("a.log", "b.log"):
        _first_line(tmp_path / name)
    started = time.monotonic()
    stop_pids([p.pid for p in procs], grace=0.5, alive=lambda pid: not _gone(pid))
    assert [p.wait(10) for p in procs] == [-9, -15] and time.monotonic() - started < 10
    group = _start(stubborn, tmp_path / "c.log")
    _first_line(tmp_path / "c.log")
    stop_pids([group.pid], group=True, grace=0.5)
    assert group.wait(10) == -9


def test_a_worker_in_its_own_session_goes_with_its_launcher(tmp_path):
    """torchrun starts each worker in a new session: a signal to torchrun's group never reaches it. Whether
    the launcher exits on SIGTERM at once or is killed after the grace, and whether it is stopped directly
    (stop_group) or by the reaper's way (stop_pids by group), the worker must not outlive it."""
    script = (
        "import signal, subprocess, sys, time\n"
        "worker = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'], "
        "start_new_session=True)\n"
        "if sys.argv[1] == 'stubborn':\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print(worker.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    for launcher in ("polite", "stubborn"):
        for way in ("stop_group", "stop_pids"):
            log = tmp_path / f"{launcher}-{way}.log"
            with log.open("wb") as out:
                proc = subprocess.Popen([sys.executable, "-c", script, launcher], stdout=out, start_new_session=True)
            worker = int(_first_line(log))
            assert os.getpgid(worker) == worker != proc.pid  # its own group, as torchrun's workers
            started = time.monotonic()
            if way == "stop_group":
                stop_group(proc, grace=1.0)
            else:
                stop_pids([proc.pid], group=True, grace=1.0)
                proc.wait(10)
            deadline = time.monotonic() + 5
            while not _gone(worker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _gone(worker), f"the worker outlived its {launcher} launcher ({way})"
            assert time.monotonic() - started < 8
