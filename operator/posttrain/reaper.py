"""A watchdog that outlives the process that started it and stops that process's children when it dies.

Why: every server posttrain starts on one machine (the embedded S3, the task app, the rollout servers and
their vLLM engines, torchrun and its workers, the local control plane) runs in its own process group, so
that one killpg stops it with all its descendants, and so that a terminal's Ctrl-C or `timeout`'s signal to
the caller's group does not hit them half-way. The flip side: when the caller dies before its `finally`
blocks run (SIGKILL, an out-of-memory kill, a second signal during clean-up), nothing would stop them.
Parent-death signals (prctl PR_SET_PDEATHSIG) reach only a direct child, fire when the creating *thread*
exits, and cannot reach a child's own children; so instead each supervising process starts one reaper:

    python -m posttrain.reaper     (own session: the caller's group signal never reaches it)

It reads lines on stdin from its parent: `+PGID` watch a process group, `-PGID` forget it (the parent
stopped it itself). When stdin reaches end of file (the parent exited, however it exited: the kernel
closes the pipe), it sends SIGTERM to every group still watched, waits up to a grace period, SIGKILLs what is
left and exits. The pipe's write end is close-on-exec, so no other child holds it open.

`watch(pid)` / `unwatch(pid)` are the API: the first call starts this process's reaper."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

from posttrain.localhost import stop_pids

GRACE_SECONDS = 10.0

_lock = threading.Lock()
_reaper: subprocess.Popen | None = None
_reaper_owner: int | None = None  # the pid that started it (a forked child must start its own)


def _ensure_reaper() -> subprocess.Popen | None:
    global _reaper, _reaper_owner
    if _reaper is not None and _reaper_owner == os.getpid() and _reaper.poll() is None:
        return _reaper
    try:
        _reaper = subprocess.Popen(
            [sys.executable, "-m", "posttrain.reaper"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONPATH": _package_path()},
        )
    except OSError:
        _reaper = None
        return None
    _reaper_owner = os.getpid()
    return _reaper


def _package_path() -> str:
    """The folder holding this `posttrain` package first on the reaper's path (an editable checkout and an
    installed wheel both work)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rest = os.environ.get("PYTHONPATH", "")
    return here + (os.pathsep + rest if rest else "")


def _send(line: str) -> None:
    with _lock:
        reaper = _ensure_reaper()
        if reaper is None or reaper.stdin is None:
            return
        try:
            reaper.stdin.write(f"{line}\n".encode())
            reaper.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass


def watch(pgid: int) -> None:
    """Stop process group `pgid` when this process dies without having called unwatch(pgid)."""
    _send(f"+{int(pgid)}")


def unwatch(pgid: int) -> None:
    """This process stopped group `pgid` itself (or it ended): the reaper forgets it."""
    if _reaper is None or _reaper_owner != os.getpid():
        return
    _send(f"-{int(pgid)}")


def reap(groups: set[int], grace: float = GRACE_SECONDS) -> None:
    """SIGTERM every group, wait up to `grace` seconds for them to go, SIGKILL the rest."""
    stop_pids(groups, group=True, grace=grace)


def main() -> int:
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # only the end of the pipe ends the reaper
    groups: set[int] = set()
    for raw in sys.stdin.buffer:
        line = raw.strip().decode(errors="replace")
        if len(line) < 2 or not line[1:].isdigit():
            continue
        pgid = int(line[1:])
        if pgid <= 1:
            continue
        if line[0] == "+":
            groups.add(pgid)
        elif line[0] == "-":
            groups.discard(pgid)
    reap(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
