"""The public proxy in front of vLLM's OpenAI server (which listens on an internal 127.0.0.1 port).

Routes: /health, /v1/models, /v1/chat/completions, /v1/completions (captured per `cid` query parameter),
GET|DELETE /v1/captures/{cid}, POST /v1/captures (several cids' at once, taken), GET|POST /v1/weights,
POST /v1/score. Every response carries X-Weight-Version. vLLM's development endpoints (collective_rpc,
reset_prefix_cache, ...) are never routed: vLLM listens on 127.0.0.1 only and the proxy is the sole way in.

With a token (the operator's per-job Secret, POSTTRAIN_ROLLOUT_TOKEN), POST /v1/weights and the capture
routes answer only `Authorization: Bearer <token>`, i.e. the job's trainer: nobody else can swap the
policy's weights or read its rollouts. Generation stays open (the task app calls it), but a call is captured
only under a cid the trainer signed with the token (posttrain_rollout.captures.signed_cid): nobody else
writes into the job's captures.

With a job seed (--seed), every captured generation request (a `cid`) that names no `seed` of its own is
sent to vLLM with one derived from the job seed, the cid and the call's index within it
(posttrain_rollout.seeding): a rerun with the same seed samples the same tokens."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from posttrain.api.urls import IDLE_CONNECTION_EXPIRY_S

from posttrain_rollout import reference, seeding, vision, weights
from posttrain_rollout.captures import CaptureStore, body_text, entries_from_response, signed_cid
from posttrain_rollout.weights import WeightGate

log = logging.getLogger("posttrain_rollout")

VERSION_HEADER = "X-Weight-Version"
# hop-by-hop and length headers are recomputed by the proxy
_DROP_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "content-encoding",
    "keep-alive",
    "date",
    "server",
}
_THINK_ON = {"think", "thinking", "on", "true", "1", "enabled", "yes"}


def _aiohttp_available() -> bool:
    try:
        import aiohttp  # noqa: F401 - vLLM depends on it
    except ImportError:
        return False
    return True


def _err(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


def apply_thinking(body: dict[str, Any]) -> dict[str, Any]:
    """thinking_mode ("think"/"no_think"/bool) -> chat_template_kwargs.enable_thinking; thinking_budget caps
    max_tokens (the whole completion, thinking included, never exceeds the budget when thinking is on)."""
    mode = body.pop("thinking_mode", None)
    budget = body.pop("thinking_budget", None)
    if mode is None and budget is None:
        return body
    enabled = None
    if isinstance(mode, bool):
        enabled = mode
    elif mode is not None:
        enabled = str(mode).strip().lower() in _THINK_ON
    if enabled is not None:
        kwargs = dict(body.get("chat_template_kwargs") or {})
        kwargs.setdefault("enable_thinking", enabled)
        body["chat_template_kwargs"] = kwargs
    if budget is not None and enabled is not False:
        try:
            cap = int(budget)
        except (TypeError, ValueError):
            cap = 0
        if cap > 0:
            for key in ("max_tokens", "max_completion_tokens"):
                if body.get(key) is not None:
                    body[key] = min(int(body[key]), cap)
            if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
                body["max_tokens"] = cap
    return body


def prepare_request(body: dict[str, Any], *, chat: bool, capture: bool) -> dict[str, Any]:
    """Forwarded body: thinking fields mapped; when captured, exact token ids and sampling logprobs asked
    for (return_token_ids; chat logprobs=true, completions logprobs=1) unless the caller asked already."""
    body = apply_thinking(dict(body))
    if capture:
        body["return_token_ids"] = True
        if chat:
            if not body.get("logprobs"):
                body["logprobs"] = True
        elif body.get("logprobs") is None:
            body["logprobs"] = 1
    return body


class Proxy:
    def __init__(
        self,
        upstream: str,
        *,
        role: str = "policy",
        served_model_name: str | None = None,
        model_dir: str | Path | None = None,
        run_dir: str | Path | None = None,
        enable_lora: bool = False,
        captures: CaptureStore | None = None,
        gate: WeightGate | None = None,
        upstream_alive: Callable[[], bool] = lambda: True,
        timeout_s: float = 3600.0,
        max_connections: int = 1024,
        token: str | None = None,
        image_limits: vision.ImageLimits | None = None,
        seed: int | None = None,
    ):
        self.image_limits = image_limits or vision.ImageLimits()
        self.upstream = upstream.rstrip("/")
        self.role = role
        self.served_model_name = served_model_name
        self.model_dir = str(model_dir) if model_dir else None
        self.run_dir = Path(run_dir) if run_dir else Path(".")
        self.enable_lora = enable_lora
        self.captures = captures or CaptureStore()
        self.gate = gate or WeightGate()
        self.upstream_alive = upstream_alive
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.token = token or None
        self.unsigned_cids = 0  # captured calls refused a capture: a cid not signed with the token
        self.seed = seed  # the job's: seeds captured sampling requests (posttrain_rollout.seeding); None: not
        self.calls = seeding.CallCounter(captures.max_cids if captures else 20_000)
        self.client: httpx.AsyncClient | None = None
        self._session = None  # aiohttp.ClientSession for the generation hot path
        self._use_aiohttp: bool | None = None
        self.lora_name: str | None = None
        self.syncs = 0
        self._made: list[list[Path]] = []

    # -- plumbing ----------------------------------------------------------------------------------
    def authorized(self, request: Request) -> bool:
        """Whether `request` may use a privileged route (always, when the server has no token)."""
        if self.token is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), self.token.encode())

    def may_capture(self, request: Request, cid: str) -> bool:
        """Whether a call under `cid` is captured: always without a token; with one, for a cid the job's
        trainer signed (captures.signed_cid) or a caller holding the token. Any other call is served but
        not captured (counted in unsigned_cids)."""
        if self.token is None or signed_cid(self.token, cid) or self.authorized(request):
            return True
        self.unsigned_cids += 1
        return False

    def http(self) -> httpx.AsyncClient:
        if self.client is None:
            limits = httpx.Limits(
                max_connections=self.max_connections,
                max_keepalive_connections=256,
                keepalive_expiry=IDLE_CONNECTION_EXPIRY_S,
            )
            self.client = httpx.AsyncClient(
                base_url=self.upstream, timeout=httpx.Timeout(self.timeout_s, connect=10.0), limits=limits
            )
        return self.client

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()
            self.client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _post(self, path: str, body: dict[str, Any]) -> tuple[int, list[tuple[str, str]], bytes]:
        """The generation hot path: aiohttp (markedly cheaper per request than httpx under concurrency) when
        installed and no httpx client was injected (tests inject one over an ASGI fake of vLLM)."""
        if self._use_aiohttp is None:
            self._use_aiohttp = self.client is None and _aiohttp_available()
        if not self._use_aiohttp:
            r = await self.http().post(path, json=body)
            return r.status_code, list(r.headers.items()), r.content
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, ttl_dns_cache=None),
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=10.0),
                auto_decompress=False,
            )
        data = json.dumps(body).encode()
        async with self._session.post(
            self.upstream + path, data=data, headers={"Content-Type": "application/json"}
        ) as r:
            content = await r.read()
            return r.status, list(r.headers.items()), content

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        out = {VERSION_HEADER: str(self.gate.version)}
        out.update(extra or {})
        return out

    async def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        r = await self.http().get("/v1/models")
        self.served_model_name = r.json()["data"][0]["id"]
        return self.served_model_name

    # -- generation ----------------------------------------------------------------------------------
    async def generate(self, request: Request, path: str, chat: bool) -> Response:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            return _err(400, "request body must be JSON")
        if not isinstance(body, dict):
            return _err(400, "request body must be a JSON object")
        cid = request.query_params.get("cid")
        stream = bool(body.get("stream"))
        if cid and stream:
            return _err(
                400,
                "streaming is not supported for captured calls (a `cid` query parameter): "
                "send stream=false so the exact token ids and logprobs can be recorded",
            )
        if self.lora_name and body.get("model") in (None, self.served_model_name):
            body["model"] = self.lora_name  # the hot-loaded adapter is the policy
        capture = cid if cid and self.may_capture(request, cid) else None  # a write: the job's cids only
        fwd = prepare_request(body, chat=chat, capture=bool(capture))
        if cid and self.seed is not None and fwd.get("seed") is None:
            fwd["seed"] = seeding.request_seed(self.seed, cid, self.calls.next(cid))
        images: list[str] = []
        if chat:
            fwd["messages"], _ = vision.apply_limits(fwd.get("messages"), self.image_limits)
            try:
                fwd["messages"] = await vision.inline_remote_images(fwd.get("messages"), self.fetch_image)
            except (vision.ImageFetchError, httpx.HTTPError) as err:
                return _err(400, f"cannot fetch an image of the request: {type(err).__name__}: {err}")
            images = vision.request_images(fwd)
        version = await self.gate.enter()
        handed_over = False
        try:
            if stream:
                response = await self._stream(path, fwd, version)
                handed_over = True  # the stream's generator leaves the gate when it ends
                return response
            status, headers, content = await self._post(path, fwd)
            if capture and status == 200:
                data = json.loads(content)
                self.captures.add(
                    capture,
                    entries_from_response(
                        data,
                        chat=chat,
                        weight_version=version,
                        images=images,
                        request_messages=body.get("messages"),
                    ),
                )
            elif capture:
                self.captures.refuse(capture, status, content)
                log.warning(
                    "vLLM refused a captured call (cid %s): HTTP %s %s", cid, status, body_text(content, 500)
                )
            hdrs = {k: v for k, v in headers if k.lower() not in _DROP_HEADERS}
            hdrs[VERSION_HEADER] = str(version)
            return Response(content, status_code=status, headers=hdrs)
        except (TimeoutError, httpx.HTTPError, OSError) as err:
            return _err(502, f"vLLM upstream error: {type(err).__name__}: {err}", "upstream_error")
        except Exception as err:  # aiohttp.ClientError and friends
            if type(err).__module__.startswith("aiohttp"):
                return _err(502, f"vLLM upstream error: {type(err).__name__}: {err}", "upstream_error")
            raise
        finally:
            if not handed_over:
                await self.gate.leave()

    async def _stream(self, path: str, fwd: dict[str, Any], version: Any) -> Response:
        # the gate slot is held until the stream ends: a sync never swaps weights under a live stream
        req = self.http().build_request("POST", path, json=fwd)
        r = await self.http().send(req, stream=True)

        async def body():
            try:
                async for chunk in r.aiter_raw():
                    yield chunk
            finally:
                await r.aclose()
                await self.gate.leave()

        hdrs = {k: v for k, v in r.headers.items() if k.lower() not in _DROP_HEADERS}
        hdrs[VERSION_HEADER] = str(version)
        return StreamingResponse(body(), status_code=r.status_code, headers=hdrs)

    async def fetch_image(self, url: str) -> tuple[str, bytes]:
        """(content type, bytes) of an image URL a request names, at most vision.MAX_IMAGE_BYTES."""
        async with self.http().stream("GET", url, timeout=30.0, follow_redirects=False) as r:
            if r.status_code != 200:
                raise vision.ImageFetchError(f"image URL {url[:80]!r} answered HTTP {r.status_code}")
            data = bytearray()
            async for chunk in r.aiter_bytes():
                data += chunk
                if len(data) > vision.MAX_IMAGE_BYTES:
                    raise vision.ImageFetchError(
                        f"image URL {url[:80]!r} is larger than {vision.MAX_IMAGE_BYTES} bytes"
                    )
            return r.headers.get("content-type", "").split(";")[0].strip().lower(), bytes(data)

    # -- weights ---------------------------------------------------------------------------------------
    async def sync_weights(self, path: str, fmt: str, version: Any) -> dict[str, Any]:
        started = time.perf_counter()
        async with self.gate.sync_lock():
            local = await asyncio.to_thread(weights.local_path, path, self.run_dir / "weights", f"v{version}")
            made = [local] if path.startswith("s3://") else []
            if fmt == "lora" and not self.enable_lora:
                if not self.model_dir:
                    raise RuntimeError("format lora without --enable-lora needs the base model folder")
                local = await asyncio.to_thread(
                    weights.merge_lora, self.model_dir, local, self.run_dir / "weights" / f"merged-v{version}"
                )
                made.append(local)
                fmt = "full"
            drain_seconds = await self.gate.pause()
            try:
                if fmt == "full":
                    r = await self.http().post(
                        "/collective_rpc",
                        json={"method": "reload_weights", "kwargs": {"weights_path": str(local)}},
                    )
                    if r.status_code >= 400:
                        raise RuntimeError(f"reload_weights -> HTTP {r.status_code}: {r.text[:300]}")
                    self.lora_name = None  # new full weights are the policy; no adapter on top
                else:
                    name = self.lora_name or f"{await self.model_name()}-lora"
                    r = await self.http().post(
                        "/v1/load_lora_adapter",
                        json={"lora_name": name, "lora_path": str(local), "load_inplace": True},
                    )
                    if r.status_code >= 400:
                        raise RuntimeError(f"load_lora_adapter -> HTTP {r.status_code}: {r.text[:300]}")
                    self.lora_name = name
                r = await self.http().post("/reset_prefix_cache")
                if r.status_code >= 400:
                    raise RuntimeError(f"reset_prefix_cache -> HTTP {r.status_code}: {r.text[:300]}")
                # vLLM 0.32's reload_weights clears the worker's encoder cache (image embeddings) but not the
                # scheduler's record of it: the next request with an image seen before the sync then kills
                # the engine ("Encoder cache miss for <hash>"). This clears both, and no stale embedding stays.
                r = await self.http().post("/reset_encoder_cache")
                if r.status_code >= 400 and r.status_code != 404:
                    raise RuntimeError(f"reset_encoder_cache -> HTTP {r.status_code}: {r.text[:300]}")
                new_version = version
            except BaseException:
                await self.gate.resume()  # keep serving the old weights, old version
                raise
            await self.gate.resume(new_version)
            timing = self.gate.record_sync(time.perf_counter() - started, drain_seconds)
            self.syncs += 1
            self._forget_old_folders(made)
        return {"weight_version": new_version, "seconds": time.perf_counter() - started, "format": fmt, **timing}

    def _forget_old_folders(self, made: list[Path], keep: int = 2) -> None:
        """Folders this server wrote (s3 downloads, merged adapters): only those of the last `keep` syncs
        stay on disk (vLLM holds the loaded weights in memory)."""
        self._made.append(made)
        while len(self._made) > keep:
            for folder in self._made.pop(0):
                if Path(folder) not in {Path(f) for group in self._made for f in group}:
                    shutil.rmtree(folder, ignore_errors=True)

    # -- scoring -----------------------------------------------------------------------------------------
    async def score(
        self,
        seqs: list[tuple[list[int], list[int]]],
        temperature: float = 1.0,
        vocab: int = reference.DEFAULT_VOCAB,
    ) -> list[list[float]]:
        model = await self.model_name()

        async def one(prompt: list[int], completion: list[int]) -> list[float]:
            if not completion:
                return []
            r = await self.http().post(
                "/v1/completions", json=reference.score_request(model, prompt, completion, temperature)
            )
            if r.status_code != 200:
                raise reference.ScoreError(f"vLLM /v1/completions -> HTTP {r.status_code}: {r.text[:300]}")
            return reference.completion_logprobs(r.json(), prompt, completion, temperature, vocab)

        version = await self.gate.enter()
        try:
            del version
            return list(await asyncio.gather(*(one(p, c) for p, c in seqs)))
        finally:
            await self.gate.leave()


class VersionHeaderMiddleware:
    """Pure ASGI (Starlette's BaseHTTPMiddleware costs a task and a queue per request): adds
    X-Weight-Version (the current version) to every response that does not carry one already."""

    _NAME = VERSION_HEADER.lower().encode()

    def __init__(self, app, proxy: Proxy):
        self.app = app
        self.proxy = proxy

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_version(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers") or [])
                if not any(k.lower() == self._NAME for k, _ in headers):
                    headers.append((self._NAME, str(self.proxy.gate.version).encode()))
                message = {**message, "headers": headers}
            await send(message)

        return await self.app(scope, receive, send_with_version)


# -- routes: each handler finds the server's Proxy on the app (create_app puts it there) --------------------


def _proxy(request: Request) -> Proxy:
    return request.app.state.proxy


def _refused() -> JSONResponse:
    return _err(401, "this route needs the job's rollout token (Authorization: Bearer)", "unauthorized")


async def _privileged_json(request: Request, usage: str) -> tuple[Proxy, Any, Response | None]:
    """A token-guarded route's proxy and JSON body, or the answer that refuses it (401; 400 saying `usage`)."""
    proxy = _proxy(request)
    if not proxy.authorized(request):
        return proxy, None, _refused()
    try:
        return proxy, await request.json(), None
    except (ValueError, UnicodeDecodeError):
        return proxy, None, _err(400, usage)


async def health(request: Request) -> Response:
    proxy = _proxy(request)
    if not proxy.upstream_alive():
        return JSONResponse({"status": "vllm exited"}, status_code=503)
    try:
        r = await proxy.http().get("/health", timeout=5.0)
    except httpx.HTTPError:
        return JSONResponse({"status": "starting"}, status_code=503)
    if r.status_code != 200:
        return JSONResponse({"status": "starting"}, status_code=503)
    return JSONResponse({"status": "ok", "role": proxy.role, "weight_version": proxy.gate.version})


async def models(request: Request) -> Response:
    try:
        r = await _proxy(request).http().get("/v1/models")
    except httpx.HTTPError as err:
        return _err(502, f"vLLM upstream error: {err}", "upstream_error")
    return Response(r.content, status_code=r.status_code, media_type="application/json")


async def metrics(request: Request) -> Response:
    """vLLM's own Prometheus metrics (vllm:num_requests_running, vllm:generation_tokens_total, KV cache
    usage, ...), passed through as they are: Prometheus scrapes the server's one public port."""
    try:
        r = await _proxy(request).http().get("/metrics", timeout=10.0)
    except httpx.HTTPError as err:
        return _err(502, f"vLLM upstream error: {err}", "upstream_error")
    media = r.headers.get("content-type", "text/plain; version=0.0.4; charset=utf-8")
    return Response(r.content, status_code=r.status_code, media_type=media)


async def chat(request: Request) -> Response:
    return await _proxy(request).generate(request, "/v1/chat/completions", chat=True)


async def completions(request: Request) -> Response:
    return await _proxy(request).generate(request, "/v1/completions", chat=False)


async def get_captures(cid: str, request: Request, pop: bool = False) -> Response:
    """?pop=true also removes them (one call instead of GET + DELETE)."""
    proxy = _proxy(request)
    if not proxy.authorized(request):
        return _refused()
    entries = proxy.captures.pop(cid) if pop else proxy.captures.get(cid)
    if entries is None:
        refused = proxy.captures.refusal(cid, pop=pop)
        if refused is not None:
            return JSONResponse(
                {"error": {"message": f"no captures for cid {cid!r}: vLLM refused {refused['refused']} call(s)",
                           "type": "not_found", "refused": refused}},
                status_code=404,
            )  # fmt: skip
        return _err(404, f"no captures for cid {cid!r} (never seen, deleted or expired)", "not_found")
    return JSONResponse(entries)


async def delete_captures(cid: str, request: Request) -> Response:
    proxy = _proxy(request)
    if not proxy.authorized(request):
        return _refused()
    entries = proxy.captures.pop(cid)
    refused = proxy.captures.refusal(cid, pop=True)
    if entries is None and refused is None:
        return _err(404, f"no captures for cid {cid!r}", "not_found")
    return JSONResponse({"deleted": cid, "entries": len(entries or [])})


# one POST /v1/captures names at most this many cids (a trainer asks one batch of rollouts' worth)
MAX_CIDS_PER_TAKE = 4096


async def take_captures(request: Request) -> Response:
    """Body {"cids": [...]}: the captures of every named cid at once, removed as they are returned (a
    batch's worth in one call: per-cid GET + DELETE made two requests per episode, whose connection-pool
    bookkeeping cost the trainer more CPU than the task app's episodes). Answers {"captures": {cid:
    entries}, "refusals": {cid: why vLLM refused its calls}}; a cid in neither has none (never seen,
    deleted or expired)."""
    proxy, body, refused = await _privileged_json(request, 'body must be JSON {"cids": [...]}')
    if refused is not None:
        return refused
    cids = body.get("cids") if isinstance(body, dict) else None
    if not isinstance(cids, list) or not all(isinstance(c, str) and 0 < len(c) <= 512 for c in cids):
        return _err(
            400, 'body must be {"cids": [...]}, each cid a non-empty string of at most 512 characters'
        )
    if len(cids) > MAX_CIDS_PER_TAKE:
        return _err(400, f"at most {MAX_CIDS_PER_TAKE} cids per call, not {len(cids)}: split the batch")
    captures: dict[str, list[dict[str, Any]]] = {}
    refusals: dict[str, dict[str, Any]] = {}
    for cid in dict.fromkeys(cids):
        entries = proxy.captures.pop(cid)
        refused = proxy.captures.refusal(cid, pop=True)
        if entries is not None:
            captures[cid] = entries
        elif refused is not None:
            refusals[cid] = refused
    return JSONResponse({"captures": captures, "refusals": refusals})


async def capture_stats(request: Request) -> Response:
    proxy = _proxy(request)
    if not proxy.authorized(request):
        return _refused()
    return JSONResponse(proxy.captures.stats())


async def get_weights(request: Request) -> Response:
    proxy = _proxy(request)
    return JSONResponse(
        {"weight_version": proxy.gate.version, "syncing": proxy.gate.paused, "lora": proxy.lora_name,
         **proxy.gate.stats()}  # fmt: skip
    )


async def post_weights(request: Request) -> Response:
    proxy, body, refused = await _privileged_json(request, "body must be JSON {path, format, version}")
    if refused is not None:
        return refused
    if not isinstance(body, dict) or not body.get("path"):
        return _err(400, "body must be {path, format: full|lora, version}")
    fmt = str(body.get("format") or "full").lower()
    if fmt not in ("full", "lora"):
        return _err(400, f"format must be full or lora, not {fmt!r}")
    version = body.get("version")
    if version is None:
        version = (proxy.gate.version + 1) if isinstance(proxy.gate.version, int) else proxy.syncs + 1
    try:
        result = await proxy.sync_weights(str(body["path"]), fmt, version)
    except FileNotFoundError as err:
        return _err(400, str(err))
    except Exception as err:  # noqa: BLE001 - reported to the trainer, old weights keep serving
        log.exception("weight sync failed")
        return _err(500, f"weight sync failed: {type(err).__name__}: {err}", "weight_sync_error")
    log.info("weights v%s (%s) loaded in %.3f s", result["weight_version"], fmt, result["seconds"])
    return JSONResponse(result, headers={VERSION_HEADER: str(result["weight_version"])})


async def score(request: Request) -> Response:
    try:
        body = await request.json()
        seqs = reference.parse_sequences(body)
        temperature = reference.parse_temperature(body)
        vocab = reference.parse_vocab_size(body)
    except (ValueError, UnicodeDecodeError) as err:
        return _err(400, str(err))
    try:
        values = await _proxy(request).score(seqs, temperature, vocab)
    except reference.ScoreError as err:
        return _err(502, str(err), "upstream_error")
    except httpx.HTTPError as err:
        return _err(502, f"vLLM upstream error: {err}", "upstream_error")
    return JSONResponse({"logprobs": values})


ROUTES = (
    ("GET", "/health", health),
    ("GET", "/v1/models", models),
    ("GET", "/metrics", metrics),
    ("POST", "/v1/chat/completions", chat),
    ("POST", "/v1/completions", completions),
    ("GET", "/v1/captures/{cid}", get_captures),
    ("DELETE", "/v1/captures/{cid}", delete_captures),
    ("GET", "/v1/captures", capture_stats),
    ("POST", "/v1/captures", take_captures),
    ("GET", "/v1/weights", get_weights),
    ("POST", "/v1/weights", post_weights),
    ("POST", "/v1/score", score),
)


def create_app(proxy: Proxy) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        await proxy.close()

    app = FastAPI(
        title=f"posttrain rollout server ({proxy.role})", docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.state.proxy = proxy
    app.add_middleware(VersionHeaderMiddleware, proxy=proxy)
    for method, path, endpoint in ROUTES:
        app.add_api_route(path, endpoint, methods=[method])
    return app


def dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))
