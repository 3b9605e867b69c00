"""controller/child_watch.py against a scripted API (the real API server runs it in the integration tests):
the first list fills the indexes, events update them and wake a job only when its decision may change, a
410 Gone lists again and drops what went meanwhile."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from posttrain.controller.child_watch import DEPLOYMENTS, ChildWatches
from posttrain.controller.children import CHILD_SELECTOR, parent_key
from posttrain.controller.kube import KubeError
from posttrain.controller.status import DeploymentObs

KEY = ("team", "rljob", "j")


def deployment(name: str, ready: int, uid: str | None = None, job: str = "j", owner: str | None = None) -> dict[str, Any]:
    labels = {"posttrain.dev/job": job, "posttrain.dev/kind": "rljob", "posttrain.dev/role": "rollout"}
    refs = [{"kind": "RLJob", "name": job if owner is None else owner, "uid": "job-uid", "controller": True}]
    return {"metadata": {"name": name, "namespace": "team", "uid": uid or name, "labels": labels,
                         "resourceVersion": "1", "ownerReferences": refs},
            "spec": {"replicas": 1}, "status": {"readyReplicas": ready}}  # fmt: skip


class ScriptedApi:
    """LIST answers in turn; each watch replays its events, then (like a closed connection) ends."""

    def __init__(self, lists: list[list[dict[str, Any]]], watches: list[list[dict[str, Any]]]) -> None:
        self.lists, self.watches = lists, watches
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.done = asyncio.Event()

    async def request(self, method: str, path: str, *, params: dict[str, str], **_: Any) -> dict[str, Any]:
        self.calls.append(("list", params))
        return {"metadata": {"resourceVersion": str(len(self.calls))}, "items": self.lists.pop(0)}

    async def watch(self, path: str, params: dict[str, str]) -> Any:
        self.calls.append(("watch", params))
        if not self.watches:
            self.done.set()
            await asyncio.Event().wait()  # a quiet watch
        for event in self.watches.pop(0):
            yield event


def test_lists_then_follows_the_watch_and_relists_after_gone() -> None:
    woken: list[tuple[str, str, str]] = []
    api = ScriptedApi(
        lists=[[deployment("j-rollout", 0)], [deployment("j-rollout", 1)]],
        watches=[
            [
                {"type": "MODIFIED", "object": deployment("j-rollout", 0)},  # nothing the job acts on changed
                {"type": "MODIFIED", "object": deployment("j-rollout", 1)},  # ready: wake the job
                {"type": "ADDED", "object": deployment("x", 0, job="")},  # not a child: ignored
                {"type": "ADDED", "object": deployment("y", 0, owner="other")},  # our labels only: ignored
                {"type": "DELETED", "object": deployment("j-rollout", 1)},
                {"type": "ADDED", "object": deployment("j-rollout", 0, uid="again")},
                {"type": "ERROR", "object": {"code": 410}},
            ],  # fmt: skip
        ],
    )

    async def scenario() -> tuple[list[Any], list[Any]]:
        watches = ChildWatches(api, kinds=(DEPLOYMENTS,), namespaces=[], selector=CHILD_SELECTOR,  # type: ignore[arg-type]
                               parent_key=parent_key, wake=woken.append)  # fmt: skip
        await watches.start()
        first = list(watches.indexes["posttrain_deployments"][KEY])
        await asyncio.wait_for(api.done.wait(), 5)
        last = list(watches.indexes["posttrain_deployments"][KEY])
        await watches.stop()
        return first, last

    first, last = asyncio.run(scenario())
    assert first == [DeploymentObs("j-rollout", "rollout", 1, 0, owner="job-uid")]  # complete before start() returns
    # after the 410 the list is the truth: the object made again ("again") is gone, the first one is back
    assert last == [DeploymentObs("j-rollout", "rollout", 1, 1, owner="job-uid")]
    # woken four times: the child became ready (watch), it was deleted (its job makes it again), a ready
    # child is new to the index after the 410, and the one made again is gone from that list; neither an
    # unchanged readiness nor a new child that is not ready yet wakes the job
    assert woken == [KEY, KEY, KEY, KEY]
    assert [c for c, _ in api.calls] == ["list", "watch", "list", "watch"]
    assert (
        api.calls[0][1]["labelSelector"]
        == "app.kubernetes.io/managed-by=posttrain-operator,posttrain.dev/job"
    )
    assert api.calls[1][1]["resourceVersion"] == "1" and api.calls[1][1]["allowWatchBookmarks"] == "true"


@pytest.mark.parametrize(
    "failure",
    [
        KubeError(500, "boom"),
        aiohttp.ServerDisconnectedError(),
        aiohttp.ClientPayloadError("cut"),
        RuntimeError("anything else"),
    ],  # fmt: skip
    ids=["http-500", "api-server-gone", "cut-mid-event", "unexpected"],
)
def test_a_failing_watch_lists_again(failure: Exception) -> None:
    """Whatever ends a watch (the API server restarting drops its connections), the kind is listed again and
    watched on: a watch that died would leave its jobs blind to their children."""

    class Failing(ScriptedApi):
        async def watch(self, path: str, params: dict[str, str]) -> Any:
            self.calls.append(("watch", params))
            if len(self.calls) > 3:
                self.done.set()
                await asyncio.Event().wait()
            raise failure
            yield {}  # an async generator

    api = Failing(lists=[[deployment("j-rollout", 0)], [], []], watches=[])

    async def scenario() -> Any:
        watches = ChildWatches(api, kinds=(DEPLOYMENTS,), namespaces=["team"], selector=CHILD_SELECTOR,  # type: ignore[arg-type]
                               parent_key=parent_key, wake=lambda key: None)  # fmt: skip
        await watches.start()
        await asyncio.wait_for(api.done.wait(), 10)
        await watches.stop()
        return watches.indexes["posttrain_deployments"]

    index = asyncio.run(scenario())
    assert KEY not in index  # the second list no longer has it
    assert [c for c, _ in api.calls][:3] == ["list", "watch", "list"]
