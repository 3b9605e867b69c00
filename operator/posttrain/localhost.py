"""Servers that posttrain starts on this machine (the embedded S3, task apps, rollout servers and their vLLM
engines, torchrun, the local control plane): a free port on 127.0.0.1 to bind one to, and the one way each
is stopped.

Every such server runs in its own process group (`start_new_session=True`), so that one signal reaches it
with all its descendants (torchrun's workers, vLLM's engine core) and a terminal's Ctrl-C to the caller's
group does not hit it half-way. `stop_group` sends SIGTERM to the group, waits a grace period for the
leader, then SIGKILLs whatever is left of the group: a group may outlive its leader (vLLM's engine core
does), and a leader that ignores SIGTERM must not hold the caller up. `stop_pids` is the same rule for
processes known only by pid or group id (pid files, the reaper's groups)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection

LOOPBACK = "127.0.0.1"
KILL_WAIT_SECONDS = 5.0


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct free ports: every socket stays bound until all are picked, so none repeats."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop `proc` (started with start_new_session=True) and its whole process group: SIGTERM, up to
    `grace` seconds for the leader to exit, then SIGKILL for what is left of the group. Safe to call on a
    process that has exited already."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)  # also when the leader is gone: its group may not be
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_WAIT_SECONDS)


def signalable(pid: int) -> bool:
    """Whether signal 0 reaches `pid` (a zombie still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_signalable(pgid: int) -> bool:
    """Whether signal 0 reaches any process of group `pgid`."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pids(
    ids: Collection[int],
    *,
    group: bool = False,
    grace: float = 10.0,
    alive: Callable[[int], bool] | None = None,
) -> None:
    """SIGTERM every pid (every process group, when `group`), wait up to `grace` seconds while any is
    `alive`, then SIGKILL: every group, or each pid that is still alive."""
    send = os.killpg if group else os.kill
    alive = alive or (group_signalable if group else signalable)
    for pid in ids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(alive(pid) for pid in ids):
        time.sleep(0.2)
    for pid in ids:
        if group or alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(pid, signal.SIGKILL)
