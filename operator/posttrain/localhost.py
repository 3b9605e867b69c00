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
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import NamedTuple

LOOPBACK = "127.0.0.1"
KILL_WAIT_SECONDS = 5.0
PICK_ATTEMPTS = 200
PICK_FLOOR = 20000  # above the well-known and registered ports most daemons use
_random = random.SystemRandom()
_handed_out: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now, below the kernel's ephemeral range (see free_ports)."""
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = LOOPBACK) -> list[int]:
    """`count` distinct free ports, each bound once to check it, none handed out before by this process.

    Picked below the kernel's ephemeral range: a port the kernel picks (bind to 0) is one it may also give
    to the next outgoing connection, and a control plane makes hundreds of them (API server to etcd, the
    scheduler's watches) between the pick and the server's own bind, which then fails with "address
    already in use"."""
    low, high = _pick_range()
    ports: list[int] = []
    for _ in range(count):
        for _attempt in range(PICK_ATTEMPTS):
            port = _random.randrange(low, high) if high > low else 0
            if port in _handed_out:
                continue
            found = _bindable(host, port)
            if found:
                break
        else:
            found = _bindable(host, 0)  # the range is full: fall back to the kernel's pick
        if not found:
            raise OSError(f"no free TCP port on {host}")
        _handed_out.add(found)
        ports.append(found)
    return ports


def _pick_range() -> tuple[int, int]:
    """[PICK_FLOOR, start of the ephemeral range): empty when the ephemeral range starts below the floor."""
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768  # Linux's default
    return PICK_FLOOR, ephemeral_low


def _bindable(host: str, port: int) -> int:
    """The port if a socket can bind it now (0: the kernel's pick), else 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return 0
        return int(sock.getsockname()[1])


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop `proc` (started with start_new_session=True) and its whole process group: SIGTERM, up to
    `grace` seconds for the leader to exit, then SIGKILL for what is left of the group, and for every
    descendant that had moved to a group of its own (see escaped_descendants). Safe to call on a process
    that has exited already."""
    deadline = time.monotonic() + grace
    escaped = escaped_descendants([proc.pid])
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)  # also when the leader is gone: its group may not be
    if proc.poll() is None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        escaped |= escaped_descendants([proc.pid])
    while escaped_alive(escaped) and time.monotonic() < deadline:  # the rest of the grace: the leader
        time.sleep(0.2)  # (torchrun) passed SIGTERM on; a worker may be saving a checkpoint
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    kill_escaped(escaped)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(KILL_WAIT_SECONDS)


def escaped_descendants(pgids: Collection[int]) -> set[tuple[int, int]]:
    """(pid, start time) of every descendant of the members of groups `pgids` that leads a group of its own.

    torchrun starts each worker in a new session, so a signal to torchrun's group never reaches a worker: a
    torchrun killed before it stopped its workers (grace over) would orphan them, still holding gigabytes.
    The start time tells a process from a later one that reuses its pid."""
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, row in table.items():
        children.setdefault(row.ppid, []).append(pid)
    wanted = set(pgids)
    todo = [pid for pid, row in table.items() if row.pgid in wanted]
    seen: set[int] = set()
    found: set[tuple[int, int]] = set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        if table[pid].pgid == pid and pid not in wanted:
            found.add((pid, table[pid].start))
        todo += children.get(pid, [])
    return found


def escaped_alive(escaped: Collection[tuple[int, int]]) -> bool:
    """Whether a group leader that escaped_descendants found still runs (not a zombie)."""
    if not escaped:
        return False
    table = _process_table()
    return any(_same(table, pid, start) and table[pid].state != "Z" for pid, start in escaped)


def kill_escaped(escaped: Collection[tuple[int, int]]) -> None:
    """SIGKILL the groups that escaped_descendants found, where their leader is still the same process."""
    table = _process_table()
    for pid, start in escaped:
        if _same(table, pid, start):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


class _Process(NamedTuple):
    ppid: int
    pgid: int
    start: int  # clock ticks since boot: tells a process from a later one with the same pid
    state: str


def _same(table: dict[int, _Process], pid: int, start: int) -> bool:
    """Whether `pid` still names the process that started at `start`."""
    return pid in table and table[pid].start == start


def _process_table() -> dict[int, _Process]:
    """pid -> its parent, group, start time and state, from /proc."""
    table: dict[int, _Process] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": comm may hold spaces
        table[int(entry)] = _Process(int(fields[1]), int(fields[2]), int(fields[19]), fields[0])
    return table


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
    `alive`, then SIGKILL: every group, or each pid that is still alive; with `group`, also the groups their
    members' descendants started for themselves (escaped_descendants)."""
    send = os.killpg if group else os.kill
    alive = alive or (group_signalable if group else signalable)
    escaped = escaped_descendants(ids) if group else set()
    for pid in ids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            send(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (any(alive(pid) for pid in ids) or escaped_alive(escaped)):
        time.sleep(0.2)
    for pid in ids:
        if group or alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                send(pid, signal.SIGKILL)
    kill_escaped(escaped)
