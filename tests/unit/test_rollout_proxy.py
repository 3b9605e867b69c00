"""The proxy's wiring against a fake vLLM (an in-process ASGI app): what it forwards and injects, what it
captures, the order of the weight-sync calls, the version on every response, scoring. Real vLLM:
tests/integration/test_rollout_server.py."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse
from posttrain.api.rollout_settings import RolloutSettings
from posttrain.localhost import free_port
from posttrain_rollout.server import Proxy, create_app


def fake_vllm(calls: list, fail_reload: bool = False) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health():
        return {}

    @app.get("/v1/models")
    async def models():
        return {"data": [{"id": "m"}]}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse('vllm:num_requests_running{model_name="m"} 2.0\n',
                                 media_type="text/plain; version=0.0.4; charset=utf-8")  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        calls.append(("chat", body))
        return {
            "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "token_ids": [3], "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "t", "logprob": -0.5}]}}],
        }  # fmt: skip

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        calls.append(("completions", body))
        prompt = body["prompt"]
        return {
            "choices": [{"index": 0, "prompt_token_ids": prompt if isinstance(prompt, list) else [9],
                         "token_ids": [4], "finish_reason": "length",
                         "logprobs": {"token_logprobs": [-1.5]},
                         "prompt_logprobs": [None] + [{str(t): {"logprob": -0.1 * t}} for t in
                                                      (prompt[1:] if isinstance(prompt, list) else [])]}],
        }  # fmt: skip

    @app.post("/collective_rpc")
    async def rpc(request: Request):
        calls.append(("rpc", await request.json()))
        return {"results": [None]}

    @app.post("/reset_prefix_cache")
    async def reset():
        calls.append(("reset", None))
        return {}

    if fail_reload:
        app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/collective_rpc"]

    return app


def make(calls, fail=False, **kw):
    proxy = Proxy("http://vllm", served_model_name="m", **kw)
    proxy.client = httpx.AsyncClient(transport=httpx.ASGITransport(fake_vllm(calls, fail)),
                                     base_url="http://vllm")  # fmt: skip
    public = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(proxy)), base_url="http://proxy")
    return proxy, public


def run(coro):
    return asyncio.run(coro)


@contextlib.contextmanager
def served(app: FastAPI):
    """`app` over real HTTP on 127.0.0.1 (uvicorn in a thread) for the block; yields its base URL."""
    import threading

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_capture_inject_and_version_header(tmp_path):
    calls = []

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path)
        r = await http.post("/v1/chat/completions?cid=c1", json={"messages": [], "thinking_mode": "no_think"})
        assert r.status_code == 200 and r.headers["x-weight-version"] == "0"
        r2 = await http.post("/v1/completions?cid=c1", json={"prompt": "x"})
        plain = await http.post("/v1/chat/completions", json={"messages": []})
        caps = await http.get("/v1/captures/c1")
        popped = await http.get("/v1/captures/c1?pop=true")
        assert popped.json() == caps.json()
        assert (await http.get("/v1/captures/c1")).status_code == 404
        missing = await http.get("/v1/captures/nope")
        stream = await http.post("/v1/chat/completions?cid=c2", json={"messages": [], "stream": True})
        return r2, plain, caps, missing, stream

    r2, plain, caps, missing, stream = run(scenario())
    chat_body = calls[0][1]
    assert chat_body["return_token_ids"] is True and chat_body["logprobs"] is True
    assert (
        chat_body["chat_template_kwargs"] == {"enable_thinking": False} and "thinking_mode" not in chat_body
    )
    assert calls[1][1]["logprobs"] == 1
    assert "return_token_ids" not in calls[2][1]  # no cid: forwarded untouched
    assert caps.json() == [
        {"prompt_token_ids": [1, 2], "completion_token_ids": [3], "logprobs": [-0.5], "weight_version": 0,
         "finish_reason": "stop"},
        {"prompt_token_ids": [9], "completion_token_ids": [4], "logprobs": [-1.5], "weight_version": 0,
         "finish_reason": "length"},
    ]  # fmt: skip
    assert missing.status_code == 404 and "x-weight-version" in missing.headers
    assert stream.status_code == 400 and len(calls) == 3


def test_weight_sync_calls_and_version(tmp_path):
    calls = []
    model = tmp_path / "w"
    model.mkdir()

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path)
        r = await http.post("/v1/weights", json={"path": str(model), "format": "full", "version": 7})
        after = await http.post("/v1/chat/completions?cid=a", json={"messages": []})
        got = await http.get("/v1/weights")
        bad = await http.post("/v1/weights", json={"path": str(model), "format": "zip"})
        missing = await http.post("/v1/weights", json={"path": str(tmp_path / "absent"), "version": 8})
        caps = await http.get("/v1/captures/a")
        return r, after, got, bad, missing, caps

    r, after, got, bad, missing, caps = run(scenario())
    assert r.status_code == 200 and r.json()["weight_version"] == 7 and r.headers["x-weight-version"] == "7"
    assert [c[0] for c in calls[:2]] == ["rpc", "reset"]
    assert calls[0][1] == {"method": "reload_weights", "kwargs": {"weights_path": str(model)}}
    assert after.headers["x-weight-version"] == "7" and caps.json()[0]["weight_version"] == 7
    assert got.json()["weight_version"] == 7
    assert bad.status_code == 400 and missing.status_code == 400


def test_failed_reload_keeps_version_and_serving(tmp_path):
    calls = []
    model = tmp_path / "w"
    model.mkdir()

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path, fail=True)
        r = await http.post("/v1/weights", json={"path": str(model), "version": 3})
        ok = await http.post("/v1/chat/completions", json={"messages": []})
        return proxy, r, ok

    proxy, r, ok = run(scenario())
    assert r.status_code == 500 and "reload_weights" in r.json()["error"]["message"]
    assert proxy.gate.version == 0 and not proxy.gate.paused
    assert ok.status_code == 200 and ok.headers["x-weight-version"] == "0"


def test_score_and_health(tmp_path):
    calls = []
    alive = {"v": True}

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path, upstream_alive=lambda: alive["v"])
        r = await http.post("/v1/score", json={"sequences": [{"prompt_token_ids": [5, 6], "completion_token_ids": [7, 8]},
                                                             {"prompt_token_ids": [5], "completion_token_ids": []}]})  # fmt: skip
        bad = await http.post("/v1/score", json={"sequences": "x"})
        healthy = await http.get("/health")
        alive["v"] = False
        dead = await http.get("/health")
        return r, bad, healthy, dead

    r, bad, healthy, dead = run(scenario())
    assert r.status_code == 200
    assert r.json()["logprobs"] == [[-0.7000000000000001, -0.8], []]
    body = calls[0][1]
    assert body["prompt"] == [5, 6, 7, 8] and body["prompt_logprobs"] == 0 and body["max_tokens"] == 1
    assert bad.status_code == 400
    assert healthy.status_code == 200 and dead.status_code == 503


def test_weight_sync_and_captures_need_the_job_token(tmp_path):
    """With a token (the operator's per-job Secret), POST /v1/weights and every capture route answer only
    the bearer of that token; generation stays open for the task app."""
    calls = []

    from posttrain_rollout.captures import cid_mac

    c1 = f"trace_j-m{cid_mac('tok-123', 'trace_j-it0-s0-r0')}-it0-s0-r0"  # signed by the trainer (make_cid)

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path, token="tok-123")
        good = {"Authorization": "Bearer tok-123"}
        r = await http.post(
            f"/v1/chat/completions?cid={c1}", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 200  # the task app's call, no token
        for method, path in (
            ("GET", f"/v1/captures/{c1}"),
            ("DELETE", f"/v1/captures/{c1}"),
            ("GET", "/v1/captures"),
        ):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "tok-123"}):
                refused = await http.request(method, path, headers=headers)
                assert refused.status_code == 401, (method, path, headers)
                assert "tok-123" not in refused.text
        refused = await http.post("/v1/weights", json={"path": str(tmp_path), "format": "full", "version": 2})
        assert refused.status_code == 401 and not [c for c in calls if c[0] == "rpc"]
        assert (await http.get(f"/v1/captures/{c1}", headers=good)).status_code == 200
        assert (await http.delete(f"/v1/captures/{c1}", headers=good)).status_code == 200
        ok = await http.post(
            "/v1/weights", json={"path": str(tmp_path), "format": "full", "version": 2}, headers=good
        )
        assert ok.status_code == 200 and [c for c in calls if c[0] == "rpc"]
        await http.aclose()

    run(scenario())


def test_the_trainer_sends_the_token_the_server_demands(tmp_path, monkeypatch):
    """The trainer's two clients of the privileged routes (captures in capture_batches.py, weight sync in
    weightsync.py) against the proxy served over real HTTP on 127.0.0.1 with a token: they pass with the
    job's token from POSTTRAIN_ROLLOUT_TOKEN and are refused without it."""
    import threading

    from posttrain_trainer.capture_batches import take_one
    from posttrain_trainer.weightsync import WeightSyncer, WeightSyncError

    calls = []
    proxy = Proxy("http://vllm", served_model_name="m", run_dir=tmp_path, token="job-token-1")
    proxy.client = httpx.AsyncClient(transport=httpx.ASGITransport(fake_vllm(calls)), base_url="http://vllm")
    with served(create_app(proxy)) as base:
        from posttrain_trainer.rollouts import make_cid

        chat = {"messages": [{"role": "user", "content": "x"}]}
        monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "job-token-1")
        a, b = make_cid("run", 0, 1, 0), make_cid("run", 0, 1, 1)  # signed, as the trainer makes them
        for cid in (a, b):
            assert httpx.post(f"{base}/v1/chat/completions?cid={cid}", json=chat).status_code == 200

        async def captures(cid: str):
            async with httpx.AsyncClient() as http:
                return await take_one(http, base, cid)

        monkeypatch.delenv("POSTTRAIN_ROLLOUT_TOKEN", raising=False)
        try:
            asyncio.run(captures(a))
            raise AssertionError("captures were served without the token")
        except httpx.HTTPStatusError as err:
            assert err.response.status_code == 401
        monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "job-token-1")
        assert [e["completion_token_ids"] for e in asyncio.run(captures(b))] == [[3]]

        syncer = WeightSyncer.__new__(WeightSyncer)  # only its POST to the servers is under test
        syncer.endpoints, syncer.timeout_s, syncer.resolve = [base], 30.0, None
        syncer.served, syncer._served_lock = None, threading.Lock()
        assert syncer.post(str(tmp_path), "full", 7)[0]["weight_version"] == 7
        monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "someone-else")
        try:
            syncer.post(str(tmp_path), "full", 8)
            raise AssertionError("weights were swapped without the job's token")
        except WeightSyncError as err:
            assert "HTTP 401" in str(err) and "job-token-1" not in str(err)
        assert proxy.gate.version == 7


def test_vllm_metrics_pass_through(tmp_path):
    """Prometheus scrapes vLLM's own /metrics through the proxy's one public port."""

    async def scenario():
        _, public = make([], run_dir=tmp_path)
        r = await public.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'vllm:num_requests_running{model_name="m"} 2.0' in r.text

    run(scenario())


def test_a_call_vllm_refuses_leaves_its_reason_under_the_cid(tmp_path):
    """A captured call vLLM answers with an error makes no capture; GET /v1/captures/{cid} then says why in
    posttrain's words (the trainer's error names it instead of blaming the task app's ?cid=), never vLLM's
    text (which echoes the task app's request), and DELETE forgets it."""
    calls = []
    refusal = (
        '{"error":{"message":"tool_choice=function \\"interact_many\\" requires --tool-call-parser to be set '
        'SECRET-ECHO","type":"BadRequestError","code":400}}'
    )

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path)
        answers = iter([(400, refusal.encode()), (400, b'{"error": "boom SECRET-ECHO"}')])

        async def refused(path, fwd):
            status, content = next(answers)
            return status, [("content-type", "application/json")], content

        proxy._post = refused
        first = await http.post("/v1/chat/completions?cid=trace_a", json={"messages": []})
        await http.post("/v1/chat/completions?cid=trace_a", json={"messages": []})
        got = await http.get("/v1/captures/trace_a")
        deleted = await http.delete("/v1/captures/trace_a")
        after = await http.get("/v1/captures/trace_a")
        return first, got, deleted, after

    first, got, deleted, after = run(scenario())
    assert first.status_code == 400  # the task app still gets vLLM's answer
    assert got.status_code == 404
    refused = got.json()["error"]["refused"]
    assert refused["refused"] == 2 and refused["status"] == 400
    assert refused["reason"] == "vLLM answered HTTP 400 (the rollout server's log has its message)"  # the last
    assert "SECRET-ECHO" not in got.text
    assert deleted.status_code == 200 and after.status_code == 404 and "refused" not in after.text


def test_refusal_reasons_are_ours():
    from posttrain_rollout.captures import refusal_reason

    parser = refusal_reason(400, b'{"message": "tool_choice=function \\"x\\" requires --tool-call-parser to be set"}')
    assert "[vllm].tool_call_parser" in parser and '"x"' not in parser
    too_long = refusal_reason(400, "This model's maximum context length is 1024 tokens. However, you requested 2000")
    assert "[vllm].max_model_len" in too_long
    assert refusal_reason(500, b"\xff\xfe") == "vLLM answered HTTP 500 (the rollout server's log has its message)"


def test_post_captures_takes_several_cids_at_once(tmp_path):
    """POST /v1/captures {"cids": [...]}: every named cid's captures in one answer, removed as they are
    returned; a cid vLLM refused says why under "refusals"; a cid never seen is in neither; bad bodies 400."""
    calls = []

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path)
        for cid in ("a", "b", "b"):
            await http.post(f"/v1/chat/completions?cid={cid}", json={"messages": []})
        proxy.captures.refuse("r", 400, b"SECRET-ECHO")
        taken = await http.post("/v1/captures", json={"cids": ["a", "b", "r", "never", "a"]})
        again = await http.post("/v1/captures", json={"cids": ["a", "b", "r"]})
        single = await http.get("/v1/captures/a")
        bad = [
            await http.post("/v1/captures", json=body)
            for body in ({"cids": "a"}, {"cids": [1]}, {"cids": [""]}, ["a"], {"cids": ["x" * 513]},
                         {"cids": ["c"] * 4097})  # fmt: skip
        ]
        return taken, again, single, bad

    taken, again, single, bad = run(scenario())
    assert taken.status_code == 200 and taken.headers["x-weight-version"] == "0"
    body = taken.json()
    assert sorted(body["captures"]) == ["a", "b"]
    assert [e["completion_token_ids"] for e in body["captures"]["b"]] == [[3], [3]]
    assert body["refusals"]["r"]["refused"] == 1 and "SECRET-ECHO" not in taken.text
    assert again.json() == {"captures": {}, "refusals": {}}  # taken means gone
    assert single.status_code == 404
    assert [r.status_code for r in bad] == [400] * 6
    assert "4096" in bad[-1].json()["error"]["message"]


def test_the_trainer_takes_a_batch_of_captures_in_one_request(tmp_path, monkeypatch):
    """The trainer's CaptureBatches against the proxy app: one POST for a batch's cids (a failed rollout's
    captures go too), one per `batch` cids; a cid with none fails with the reason; without the job's token
    the whole batch fails with HTTP 401, naming no token; a server without the route is asked per cid."""
    from posttrain_trainer.capture_batches import CaptureBatches

    calls = []
    monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "job-token-1")

    async def scenario():
        proxy, http = make(calls, run_dir=tmp_path, token="job-token-1")
        for cid in ("c0", "c1", "c2"):
            await http.post(f"/v1/chat/completions?cid={cid}", json={"messages": []},
                            headers={"Authorization": "Bearer job-token-1"})  # fmt: skip
        batches = CaptureBatches(http, batch=3)
        for cid in ("c0", "c1", "c2", "gone"):
            await batches.add("http://proxy", cid)
        flushed_at_three = batches.requests  # c0-c2 went at three
        await batches.flush()
        left = len(proxy.captures)

        monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "someone-else")
        await http.post("/v1/chat/completions?cid=c9", json={"messages": []},
                        headers={"Authorization": "Bearer job-token-1"})  # fmt: skip
        refused = CaptureBatches(http)
        await refused.add("http://proxy", "c9")
        await refused.flush()
        return batches, flushed_at_three, left, refused, len(proxy.captures)

    batches, flushed_at_three, left, refused, still_there = run(scenario())
    assert flushed_at_three == 1 and batches.requests == 2 and left == 0
    assert [batches.taken(c).entries[0]["completion_token_ids"] for c in ("c0", "c1", "c2")] == [[3]] * 3
    assert batches.taken("gone").entries is None and "no capture for cid gone" in batches.taken("gone").error
    assert "401" in refused.taken("c9").error and "job-token" not in refused.taken("c9").error
    assert still_there == 1  # refused: nothing was taken

    # an older rollout server (no POST /v1/captures): per cid, GET ?pop=true
    seen = []

    def older_server(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.url.params.get("pop")))
        if request.method == "GET" and request.url.path == "/v1/captures/k1":
            return httpx.Response(200, json=[{"completion_token_ids": [5]}])
        if request.method == "GET":
            return httpx.Response(404, json={"error": {"refused": {"refused": 2, "reason": "too long"}}})
        return httpx.Response(405, json={"detail": "Method Not Allowed"})

    async def fallback():
        async with httpx.AsyncClient(transport=httpx.MockTransport(older_server)) as http:
            old = CaptureBatches(http)
            for cid in ("k1", "k2"):
                await old.add("http://old", cid)
            await old.flush()
            await old.add("http://old", "k1")
            await old.flush()
            return old

    old = run(fallback())
    assert old.taken("k1").entries == [{"completion_token_ids": [5]}]
    assert "vLLM refused 2 policy call(s): too long" in old.taken("k2").error
    assert [s for s in seen if s[0] == "POST"] == [("POST", "/v1/captures", None)]  # asked once, then known
    assert ("GET", "/v1/captures/k1", "true") in seen


def test_collect_spreads_rollouts_over_pools_and_takes_every_capture(tmp_path):
    """RolloutClient.collect at concurrency 48 over real HTTP (the proxy's app, plus a task-app /rollout
    that records its capture as the policy call would): rollouts in flight span several of its HTTP clients
    (16 each), every rollout gets its own capture back in spec order, and the server keeps none after."""
    from urllib.parse import parse_qs, urlsplit

    from posttrain_trainer.rollouts import RolloutClient, plan_rollouts

    proxy = Proxy("http://vllm", served_model_name="m", run_dir=tmp_path)
    app = create_app(proxy)
    state = {"in_flight": 0, "most": 0, "peers": set()}

    @app.post("/rollout")
    async def rollout(request: Request):
        body = await request.json()
        cid = parse_qs(urlsplit(body["policy"]["config"]["inference_url"]).query)["cid"][0]
        state["in_flight"] += 1
        state["most"] = max(state["most"], state["in_flight"])
        state["peers"].add(request.client.port)
        await asyncio.sleep(0.05)
        state["in_flight"] -= 1
        index = int(cid.rsplit("-r", 1)[1])
        proxy.captures.add(cid, [{"prompt_token_ids": [1, 2], "completion_token_ids": [100 + index],
                                  "logprobs": [-0.5], "finish_reason": "stop", "weight_version": 0}])  # fmt: skip
        return {"trajectories": [{"steps": [{"reward": 1.0, "done": True}]}], "metrics": {"mean_return": 1.0}}

    with served(app) as base:
        client = RolloutClient(task_url=base, settings=RolloutSettings(concurrency=48), model="m", api_key="k")
        specs = plan_rollouts("run", 0, range(12), 8, [base])
        results = asyncio.run(client.collect(specs))
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:2]
    assert [r.spec.cid for r in results] == [s.cid for s in specs]
    assert [r.sequences[0].completion_ids for r in results] == [[100 + s.index] for s in specs]
    assert 16 < state["most"] <= 48  # more in flight than one client of 16 connections carries
    assert len(state["peers"]) <= 48  # connections kept open and reused, not one per rollout
    assert len(proxy.captures) == 0
