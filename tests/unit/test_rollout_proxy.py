"""The proxy's wiring against a fake vLLM (an in-process ASGI app): what it forwards and injects, what it
captures, the order of the weight-sync calls, the version on every response, scoring. Real vLLM:
tests/integration/test_rollout_server.py."""

from __future__ import annotations

import asyncio

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
    """The trainer's two clients of the privileged routes (captures in rollouts.py, weight sync in
    weightsync.py) against the proxy served over real HTTP on 127.0.0.1 with a token: they pass with the
    job's token from POSTTRAIN_ROLLOUT_TOKEN and are refused without it."""
    import threading
    import time as _time

    import uvicorn
    from posttrain_trainer.rollouts import RolloutClient, RolloutSpec
    from posttrain_trainer.weightsync import WeightSyncer, WeightSyncError

    calls = []
    proxy = Proxy("http://vllm", served_model_name="m", run_dir=tmp_path, token="job-token-1")
    proxy.client = httpx.AsyncClient(transport=httpx.ASGITransport(fake_vllm(calls)), base_url="http://vllm")
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(create_app(proxy), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    while not server.started:
        _time.sleep(0.05)
    try:
        from posttrain_trainer.rollouts import make_cid

        chat = {"messages": [{"role": "user", "content": "x"}]}
        monkeypatch.setenv("POSTTRAIN_ROLLOUT_TOKEN", "job-token-1")
        a, b = make_cid("run", 0, 1, 0), make_cid("run", 0, 1, 1)  # signed, as the trainer makes them
        for cid in (a, b):
            assert httpx.post(f"{base}/v1/chat/completions?cid={cid}", json=chat).status_code == 200
        client = RolloutClient(task_url="http://task", settings=RolloutSettings(), model="m", api_key="k")

        async def captures(cid: str):
            async with httpx.AsyncClient() as http:
                return await client._captures(
                    http, RolloutSpec(seed=0, group=0, index=0, cid=cid, endpoint=base)
                )

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
    finally:
        server.should_exit = True
        thread.join(10)


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
