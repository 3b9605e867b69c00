"""A vision task app on the synth task-app contract (GET /, /health, /info, /task_info; POST /rollout, /done).

Each seed draws one picture with Pillow: a coloured shape (circle, square or triangle) on a white ground,
sent to the policy as an OpenAI image part (a data: URI of a PNG) with the question "What colour is the
shape?". The policy answers through `policy.config.inference_url` (an OpenAI-compatible endpoint, its `?cid=`
query kept).

env.config (all optional):
  - `size`: picture side in pixels (default 56, 28..448);
  - `frames`: pictures per request (default 1): the earlier ones come as earlier user turns ("Frame k"), as
    an agent's past observations would; the question is about the last one (max_images_per_step trims the
    oldest);
  - `images`: "data" (default, data: URIs) or "url": http URLs of this app's GET /images/{seed}/{frame}.png
    (built from `public_url`, default the address the rollout request reached), as a task app serving its
    frames would send them;
  - `reward`: "exact" (default): 1.0 when the first colour named in the answer is the shape's colour;
    "partial": difflib's similarity of the answer's first word to the colour name, a dense signal that a
    tiny random model can climb.
policy.config `image_only_mode = true` sends the picture without the question text.

Auth as the math app: ENVIRONMENT_API_KEY (+ ENVIRONMENT_API_KEY_ALIASES), sent as X-API-Key, X-API-Keys or
Authorization: Bearer; none configured -> 503, missing or wrong -> 400. GET / needs no key.

Run: `python examples/taskapps/shapes/app.py --port 8000` (binds 127.0.0.1). Needs fastapi, uvicorn, httpx,
pydantic and Pillow."""

from __future__ import annotations

import argparse
import base64
import difflib
import hmac
import io
import os
import random
import re
import socket
import sys
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit, urlunsplit

import httpx
from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

APP_ID = "shapes"
VERSION = "1.0.0"
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 30),
    "black": (15, 15, 15),
    "purple": (140, 40, 170),
    "orange": (245, 140, 20),
}
SHAPES = ("circle", "square", "triangle")
QUESTION = "What colour is the shape?"
DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 8}
FORWARDED_POLICY_KEYS = ("temperature", "top_p", "top_k", "max_tokens", "n", "seed", "stop", "logprobs")
LIMITS = {"max_turns": 1, "max_response_tokens": 64, "timeout_seconds": 120}
RUBRIC = {
    "outcome": {
        "name": "colour_named",
        "criteria": [{"id": "colour", "description": "The answer names the shape's colour.", "weight": 1.0}],
    },
    "events": None,
}


class SettingsError(ValueError):
    pass


def settings(env_config: dict[str, Any] | None) -> dict[str, Any]:
    config = dict(env_config or {})
    try:
        size, frames = int(config.get("size", 56)), int(config.get("frames", 1))
    except (TypeError, ValueError) as err:
        raise SettingsError("size and frames must be integers") from err
    if not 28 <= size <= 448 or not 1 <= frames <= 8:
        raise SettingsError("size must be in 28..448 and frames in 1..8")
    reward = str(config.get("reward", "exact"))
    if reward not in ("exact", "partial"):
        raise SettingsError(f"reward must be 'exact' or 'partial', got {reward!r}")
    images = str(config.get("images", "data"))
    if images not in ("data", "url"):
        raise SettingsError(f"images must be 'data' or 'url', got {images!r}")
    return {"size": size, "frames": frames, "reward": reward, "images": images,
            "public_url": str(config.get("public_url") or "")}  # fmt: skip


def picture(seed: int, frame: int, size: int) -> tuple[str, str, str]:
    """(colour, shape, PNG data: URI) for a seed's frame: deterministic."""
    colour, shape, png = picture_png(seed, frame, size)
    return colour, shape, "data:image/png;base64," + base64.b64encode(png).decode()


def picture_png(seed: int, frame: int, size: int) -> tuple[str, str, bytes]:
    from PIL import Image, ImageDraw

    rng = random.Random(f"{APP_ID}:{seed}:{frame}")
    colour, shape = rng.choice(sorted(COLOURS)), rng.choice(SHAPES)
    image = Image.new("RGB", (size, size), (245, 245, 245))
    draw = ImageDraw.Draw(image)
    m = rng.randint(size // 10, size // 5)
    box = (m, m, size - m, size - m)
    fill = COLOURS[colour]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(size // 2, m), (size - m, size - m), (m, size - m)], fill=fill)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return colour, shape, buffer.getvalue()


def messages_for(
    seed: int, cfg: dict[str, Any], image_only: bool, base_url: str = ""
) -> tuple[list[dict[str, Any]], str, str]:
    """(chat messages, colour, shape) of a seed: one user turn per frame, the question on the last."""
    messages: list[dict[str, Any]] = []
    colour = shape = ""
    for frame in range(cfg["frames"]):
        colour, shape, url = picture(seed, frame, cfg["size"])
        if cfg["images"] == "url":
            url = (
                f"{(cfg['public_url'] or base_url).rstrip('/')}/images/{seed}/{frame}.png?size={cfg['size']}"
            )
        last = frame == cfg["frames"] - 1
        text = QUESTION if last else f"Frame {frame + 1}."
        parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}}]
        if not image_only:
            parts.append({"type": "text", "text": text})
        messages.append({"role": "user", "content": parts})
        if not last:
            messages.append({"role": "assistant", "content": "Next."})
    return messages, colour, shape


def score(colour: str, text: str, reward: str) -> float:
    words = re.findall(r"[a-z]+", (text or "").lower())
    if reward == "partial":
        return round(difflib.SequenceMatcher(None, words[0] if words else "", colour).ratio(), 4)
    named = [w for w in words if w in COLOURS]
    return 1.0 if named and named[0] == colour else 0.0


# ------------------------------------------------------------------------------------------------- auth


def allowed_keys() -> list[str]:
    primary = (
        os.environ.get("ENVIRONMENT_API_KEY") or os.environ.get("DEV_ENVIRONMENT_API_KEY") or ""
    ).strip()
    aliases = [a.strip() for a in os.environ.get("ENVIRONMENT_API_KEY_ALIASES", "").split(",") if a.strip()]
    return ([primary] if primary else []) + aliases


def descriptor() -> dict[str, Any]:
    return {"id": APP_ID, "name": "Coloured shapes (vision)", "version": VERSION,
            "description": "Name the colour of a shape drawn with Pillow."}  # fmt: skip


def seed_info(seed: int) -> dict[str, Any]:
    colour, shape, _ = picture(seed, 0, 56)
    return {"task": descriptor(), "environment": APP_ID, "rubric": RUBRIC, "limits": LIMITS,
            "task_metadata": {"seed": seed, "colour": colour, "shape": shape},
            "observation": {"type": "image", "prompt": QUESTION}}  # fmt: skip


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": {"error": {"code": code, "message": message}}})


def auth_failure(request: Request) -> JSONResponse | None:
    keys = allowed_keys()
    if not keys:
        return _error(
            503, "missing_environment_api_key", "the task app has no ENVIRONMENT_API_KEY configured"
        )
    got = []
    for header in ("x-api-key", "x-api-keys"):
        got += [v.strip() for v in (request.headers.get(header) or "").split(",") if v.strip()]
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        got += [v.strip() for v in auth[7:].split(",") if v.strip()]
    if any(hmac.compare_digest(c.encode(), k.encode()) for c in got for k in keys):
        return None
    return _error(400, "unauthorised", "API key missing or invalid")


# ---------------------------------------------------------------------------------------------- rollout


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class EnvSpec(_Open):
    env_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    seed: int | None = None


class PolicySpec(_Open):
    policy_id: str | None = None
    policy_name: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)


class RolloutRequest(_Open):
    run_id: str
    mode: str
    env: EnvSpec
    policy: PolicySpec


def chat_url(inference_url: str) -> str:
    parts = urlsplit(inference_url)
    path = parts.path.rstrip("/")
    if not path.endswith("/chat/completions"):
        path += "/chat/completions" if path.endswith("/v1") else "/v1/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


async def run_rollout(body: RolloutRequest, http: httpx.AsyncClient, base_url: str = "") -> Any:
    if body.mode not in ("rl", "eval"):
        return _error(422, "invalid_request", f"mode must be 'rl' or 'eval', got {body.mode!r}")
    seed = body.env.seed or 0
    try:
        cfg = settings(body.env.config)
    except SettingsError as err:
        return _error(422, "invalid_env_config", str(err))
    policy = dict(body.policy.config or {})
    url = policy.get("inference_url")
    if not isinstance(url, str) or not url:
        return _error(400, "missing_inference_url", "policy.config.inference_url is required")
    cid = (parse_qs(urlsplit(url).query).get("cid") or [None])[0]
    if body.mode == "rl" and not cid:
        return _error(
            400, "missing_correlation_id", "mode 'rl' needs ?cid=<id> in policy.config.inference_url"
        )
    messages, colour, shape = messages_for(seed, cfg, bool(policy.get("image_only_mode")), base_url)
    payload: dict[str, Any] = {
        "model": policy.get("model") or "policy",
        "messages": messages,
        **DEFAULT_SAMPLING,
    }
    payload.update({k: policy[k] for k in FORWARDED_POLICY_KEYS if policy.get(k) is not None})
    if body.mode == "eval" and "temperature" not in policy:
        payload["temperature"] = 0.0
    try:
        response = await http.post(chat_url(url), json=payload, timeout=float(policy.get("timeout_s", 300.0)))
    except httpx.HTTPError as err:
        return _error(502, "inference_unreachable", f"policy inference call failed: {type(err).__name__}")
    if response.status_code >= 400:
        return _error(502, "inference_failed", f"policy inference returned HTTP {response.status_code}: "
                      f"{response.text[:300]}")  # fmt: skip
    choices = (response.json() or {}).get("choices") or []
    if not choices:
        return _error(502, "inference_bad_response", "policy inference returned no choices")
    trajectories, returns = [], []
    for choice in choices:
        text = (choice.get("message") or {}).get("content") or ""
        reward = score(colour, text, cfg["reward"])
        returns.append(reward)
        step = {"obs": {"question": QUESTION, "frames": cfg["frames"]}, "reward": reward, "done": True,
                "truncated": choice.get("finish_reason") == "length",
                "info": {"expected": colour, "shape": shape, "response": text,
                         "finish_reason": choice.get("finish_reason")}}  # fmt: skip
        trajectories.append({"env_id": f"{APP_ID}::{seed}", "policy_id": body.policy.policy_name or "policy",
                             "steps": [step], "final": {"reward": reward}, "length": 1})  # fmt: skip
    mean = sum(returns) / len(returns)
    return {
        "run_id": body.run_id,
        "trajectories": trajectories,
        "metrics": {
            "episode_returns": returns,
            "mean_return": mean,
            "num_steps": len(returns),
            "num_episodes": len(returns),
            "outcome_score": mean,
            "events_score": None,
            "details": {"seed": seed, "expected": colour, "shape": shape},
        },  # fmt: skip
        "aborted": False,
        "trace_correlation_id": cid,
        "pipeline_metadata": {
            "inference_url": url,
            "trace_correlation_id": cid,
            "task_id": APP_ID,
            "seed": seed,
        },
    }


def create_app() -> FastAPI:
    app = FastAPI(title="posttrain shapes task app", version=VERSION)
    app.state.http = None

    def http() -> httpx.AsyncClient:
        if app.state.http is None:
            app.state.http = httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=10.0))
        return app.state.http

    @app.api_route("/", methods=["GET", "HEAD"])
    async def root() -> dict[str, Any]:
        return {"status": "ok", "service": APP_ID}

    @app.get("/health")
    async def health(request: Request) -> Any:
        return auth_failure(request) or {"healthy": True, "service": APP_ID, "auth": {"required": True}}

    @app.get("/info")
    async def info(request: Request) -> Any:
        return auth_failure(request) or {
            "service": {"task": descriptor(), "version": VERSION},
            "dataset": {
                "id": "shapes",
                "splits": ["train"],
                "colours": sorted(COLOURS),
                "shapes": list(SHAPES),
            },
            "rubrics": RUBRIC,
            "limits": LIMITS,
        }

    @app.get("/task_info")
    async def task_info(request: Request, seed: Annotated[list[int] | None, Query()] = None) -> Any:
        failure = auth_failure(request)
        if failure is not None:
            return failure
        if not seed:
            return {"taskset": {**descriptor(), "rubric": RUBRIC}}
        infos = [seed_info(s) for s in seed]
        # the contract: one seed -> its object, several (?seed=1&seed=2, as posttrain verifies) -> a list
        return infos[0] if len(infos) == 1 else infos

    @app.post("/rollout")
    async def rollout(request: Request, body: RolloutRequest) -> Any:
        return auth_failure(request) or await run_rollout(body, http(), str(request.base_url))

    @app.get("/images/{seed}/{frame}.png")
    async def image(seed: int, frame: int, size: int = 56) -> Response:
        # no key: the rollout server fetches the frames the policy is shown (they carry no secret)
        if not 0 <= frame < 8 or not 28 <= size <= 448:
            return _error(404, "not_found", "no such frame")
        return Response(picture_png(seed, frame, size)[2], media_type="image/png")

    @app.post("/done")
    async def done(request: Request) -> Any:
        return auth_failure(request) or {"ok": True, "service": APP_ID}

    return app


app = create_app()


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    parser = argparse.ArgumentParser(
        description="posttrain shapes task app (vision, synth task-app contract)"
    )
    parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    print(f"posttrain shapes task app {VERSION}: listening on http://{args.host}:{sock.getsockname()[1]} "
          f"({len(allowed_keys())} API key(s) configured)", file=sys.stderr, flush=True)  # fmt: skip
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
