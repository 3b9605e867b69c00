"""A job's loop holds nothing of the event that started it but kopf's indexes (controller/loop.py): kopf's
handler kwargs carry views of the whole body (spec, meta, the raw event), and 5,000 loops each holding its
first event's 256 KiB originalToml held 2.5 GiB (hack/bench_operator.py --memory-jobs 5000). Nor does the
body the loops cache carry the TOML."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from posttrain.controller import loop
from posttrain.controller.job_loops import JobLoops


def test_the_loop_gets_the_indexes_only_and_a_body_without_the_toml(monkeypatch) -> None:
    seen: dict[str, Any] = {}

    async def fake_run_loop(reconcile, new_state, *, rt, key, uid, logger, indexes):
        seen["indexes"] = indexes
        seen["body"] = rt.loops.body(key, uid)

    monkeypatch.setattr(loop, "run_loop", fake_run_loop)
    toml = "x" * 262144
    body = {"apiVersion": "posttrain.dev/v1alpha1", "kind": "SFTJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": {"suspend": True, "originalToml": toml}}  # fmt: skip
    rt = SimpleNamespace(children=None, loops=JobLoops(), wake=lambda key: None)
    kwargs = {"spec": body["spec"], "meta": body["metadata"], "raw_event": {"object": body}, "event": "ADDED",
              "posttrain_taskapps": {"index": 1}, "posttrain_roles": {}}  # fmt: skip

    async def scenario() -> None:
        loop.on_event(None, None, "ADDED", body, SimpleNamespace(runtime=rt), None, kwargs)  # type: ignore[arg-type]
        await asyncio.sleep(0)

    asyncio.run(scenario())
    assert set(seen["indexes"]) == {"posttrain_taskapps", "posttrain_roles"}
    assert "originalToml" not in seen["body"]["spec"] and body["spec"]["originalToml"] is toml
