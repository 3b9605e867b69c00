"""Large blocks go back to the system when freed (controller/heap.py): a process that allocates and drops
256 KiB strings between live medium-sized objects, as the operator does with every job's body, keeps their
pages with glibc's default (dynamic) mmap threshold and returns them with the operator's fixed one."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OPERATOR = Path(__file__).resolve().parents[2] / "operator"

SCRIPT = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[2])
    from posttrain.controller.heap import release_large_blocks
    if sys.argv[1] == "fixed":
        assert release_large_blocks()

    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS"):
                return int(line.split()[1]) // 1024

    base = rss_mib()
    for _ in range(3):
        bodies, kept = [], []
        for i in range(400):
            bodies.append("x" * (256 * 1024 - 100) + str(i))  # a job's body, dropped once read
            kept.append("y" * 2000 + str(i))  # what the loops keep, allocated in between
        del bodies
    print(rss_mib() - base)
    """
)


def retained_mib(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(OPERATOR)], capture_output=True, text=True,
                         check=True, timeout=60)  # fmt: skip
    return int(out.stdout.strip())


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_freed_bodies_leave_the_process_with_the_fixed_threshold() -> None:
    default, fixed = retained_mib("default"), retained_mib("fixed")
    assert fixed < 8, f"{fixed} MiB of 300 MiB of freed bodies stayed resident with the fixed threshold"
    assert default > fixed + 20, f"default {default} MiB, fixed {fixed} MiB: the test no longer shows the effect"
