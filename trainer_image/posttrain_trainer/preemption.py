"""SIGTERM ends a run at the next safe point with a checkpoint, so a preempted job resumes instead of
starting over.

Kubernetes sends SIGTERM when the trainer's pod is deleted: Kueue preempted the job for a higher-priority one
(the operator suspends the trainer Job, whose pods go), a node is drained, a person deleted the pod. The
kubelet waits the pod's terminationGracePeriodSeconds (the operator's setting
trainer_termination_grace_seconds) before SIGKILL. In that window:

- the launcher (torchrun, launch.py) forwards SIGTERM to every worker and waits for them
  (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, a little under the grace period);
- each worker's handler only sets a flag: a step is never cut in half;
- after the current step the ranks agree on the flag (one all-reduce: a signal reaches the ranks at different
  moments), save a checkpoint at this step (collective, the usual format: checkpoint.py) unless one was just
  saved, report it (status.progress.lastCheckpoint, event "preempted") and raise Preempted;
- __main__ turns Preempted into exit code 75 (posttrain.api.exitcodes.EXIT_PREEMPTED), which the trainer
  Job's podFailurePolicy ignores: the pod does not count as a failure.

The next pod resumes from the newest complete checkpoint (resume.py), at the step after the saved one. A
SIGKILL while saving leaves an incomplete checkpoint that a resume ignores (its trainer_state.json is written
last): the previous one is used."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from posttrain_trainer import distributed as D

_asked = threading.Event()


class Preempted(Exception):
    """The run stopped at `step` for a SIGTERM; `checkpoint` is what the next run resumes from."""

    def __init__(self, step: int, checkpoint: str | None):
        super().__init__(
            f"stopped by SIGTERM after step {step}; checkpoint {checkpoint or 'none (no storage)'}"
        )
        self.step = step
        self.checkpoint = checkpoint


def _handler(signum: int, frame: Any) -> None:
    _asked.set()  # nothing else here: the training loop acts at its next safe point


def install() -> None:
    """SIGTERM sets the flag instead of ending the process (main thread only, as signal requires)."""
    signal.signal(signal.SIGTERM, _handler)


def asked() -> bool:
    """Whether any rank got SIGTERM (collective: every rank calls it at the same point of the loop)."""
    return D.all_reduce_sum(1.0 if _asked.is_set() else 0.0) > 0


def stop_if_asked(store: Any, step: int, save: Callable[[], None]) -> None:
    """At a safe point (a step finished, its progress reported): when SIGTERM came, save a checkpoint of
    `step` with `save` (the trainer's own, collective) unless `store` (resume.CheckpointStore) has one at this
    step already, report it and raise Preempted. Without storage nothing can be saved: the run still stops."""
    if not asked():
        return
    if store.client is not None and store.saved_step != step:
        save()
    if D.is_main():
        store.reporter.event("preempted", step=step, checkpoint=store.last_uri)
        store.reporter.progress_now(step=step, last_checkpoint=store.last_uri)
    raise Preempted(step, store.last_uri)
