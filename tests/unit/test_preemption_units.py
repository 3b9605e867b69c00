"""posttrain_trainer/preemption.py: what a SIGTERM does at the trainer's next safe point (single process).
The real signal through the real launcher and trainer: tests/integration/test_trainer_preemption.py."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
from posttrain_trainer import preemption


class Reporter:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def event(self, name: str, **fields: Any) -> None:
        self.lines.append((name, fields))

    def progress_now(self, **fields: Any) -> None:
        self.lines.append(("progress", fields))


class Store:
    """resume.CheckpointStore's surface that preemption reads."""

    def __init__(self, client: object | None = object(), saved_step: int | None = None) -> None:
        self.client, self.saved_step, self.last_uri = client, saved_step, None
        self.reporter = Reporter()
        self.saves: list[int] = []

    def saver(self, step: int):
        def save() -> None:
            self.saves.append(step)
            self.saved_step, self.last_uri = step, f"s3://b/p/checkpoints/step-{step}/"

        return save


@pytest.fixture
def handler() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    preemption._asked.clear()
    preemption.install()
    yield
    signal.signal(signal.SIGTERM, previous)
    preemption._asked.clear()


def test_no_sigterm_no_stop(handler: None) -> None:
    store = Store()
    preemption.stop_if_asked(store, 3, store.saver(3))
    assert store.saves == [] and store.reporter.lines == []


def test_sigterm_only_sets_a_flag_then_the_safe_point_saves_reports_and_stops(handler: None) -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # the process lives on: the handler only notes it
    store = Store()
    with pytest.raises(preemption.Preempted) as stopped:
        preemption.stop_if_asked(store, 5, store.saver(5))
    assert store.saves == [5]
    assert (stopped.value.step, stopped.value.checkpoint) == (5, "s3://b/p/checkpoints/step-5/")
    assert store.reporter.lines == [
        ("preempted", {"step": 5, "checkpoint": "s3://b/p/checkpoints/step-5/"}),
        ("progress", {"step": 5, "last_checkpoint": "s3://b/p/checkpoints/step-5/"}),
    ]


def test_a_checkpoint_of_this_step_is_not_saved_twice_and_without_storage_it_still_stops(handler: None) -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    periodic = Store(saved_step=10)  # the periodic checkpoint of step 10 was just written
    with pytest.raises(preemption.Preempted):
        preemption.stop_if_asked(periodic, 10, periodic.saver(10))
    assert periodic.saves == []
    nowhere = Store(client=None)
    with pytest.raises(preemption.Preempted, match="no storage"):
        preemption.stop_if_asked(nowhere, 2, nowhere.saver(2))
    assert nowhere.saves == []
