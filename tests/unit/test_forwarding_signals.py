"""posttrain.local.processes.forwarding_signals, with real processes and real signals: a signal to the relaying
process is passed on to its child, nothing is raised mid-read, and every line the child writes while it
stops reaches the relay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from posttrain.local.processes import forwarding_signals

CHILD = """
import signal, sys, time
def stop(signum, frame):
    for i in range(200):  # more than one pipe read's worth, written while it stops
        print(f"stopping {i}", flush=True)
    print("phase: Failed       interrupted", flush=True)
    sys.exit(130)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def test_the_relay_reads_the_childs_last_lines_after_a_signal():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    lines = []
    with forwarding_signals(child) as received:
        for line in child.stdout:
            lines.append(line.strip())
            if line.strip() == "ready":
                os.kill(os.getpid(), signal.SIGTERM)  # what a group signal does to the relay
                os.kill(os.getpid(), signal.SIGINT)  # a second one is noted, not passed on again
        code = child.wait(10)
    assert received == [signal.SIGTERM, signal.SIGINT]
    assert code == 130
    assert lines[-1] == "phase: Failed       interrupted"
    assert [line for line in lines if line.startswith("stopping")] == [f"stopping {i}" for i in range(200)]


def test_a_child_that_ignores_the_signal_is_killed_after_the_grace():
    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdout is not None
    with forwarding_signals(child, grace=1.0) as received:
        for line in child.stdout:
            if line.strip() == "ready":
                os.kill(os.getpid(), signal.SIGTERM)
        code = child.wait(10)
    assert received == [signal.SIGTERM] and code == -signal.SIGKILL  # killed, not waited for 60 s


def test_the_handlers_before_it_are_back_afterwards():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    with forwarding_signals(child):
        assert signal.getsignal(signal.SIGTERM) not in before
    child.wait(10)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
