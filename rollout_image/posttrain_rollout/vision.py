"""Image parts of chat requests (pure functions): the job's image limits applied before vLLM sees a request,
and the images a captured call was given, in prompt order, so the trainer can rebuild the same pixel values.

An image part is OpenAI's {"type": "image_url", "image_url": {"url": ...}} (also "image" / "input_image" with
the URL in "image_url", "image" or "url"). Limits (synth's policy settings, applied by the rollout server so
that every task app gets them, and so that the capture holds exactly the images vLLM was given):
  - max_images_per_message: each message keeps its first N images (the SFT rule);
  - max_images_per_step: the request keeps its newest N images, the oldest are dropped first;
  - image_only_mode: a user message that holds an image keeps only its images (no text observation).

http(s) image URLs are fetched once by the rollout server and sent on as data: URIs (inline_remote_images):
vLLM and the trainer then see the same bytes (a URL may answer differently on a second fetch), and the
trainer never fetches anything a task app names."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

IMAGE_PART_TYPES = ("image_url", "image", "input_image")
MAX_IMAGE_BYTES = 20 * 2**20


class ImageFetchError(ValueError):
    pass


@dataclass(frozen=True)
class ImageLimits:
    max_images_per_message: int | None = None
    max_images_per_step: int | None = None
    image_only_mode: bool = False

    @property
    def active(self) -> bool:
        return bool(self.max_images_per_message or self.max_images_per_step or self.image_only_mode)


def is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES


def image_url(part: dict[str, Any]) -> str:
    value = part.get("image_url") or part.get("image") or part.get("url")
    if isinstance(value, dict):
        value = value.get("url")
    return str(value or "")


def _parts(message: Any) -> list[Any] | None:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, dict):
        return [content]
    return content if isinstance(content, list) else None


def apply_limits(messages: list[Any], limits: ImageLimits) -> tuple[list[Any], int]:
    """(messages with the limits applied, image parts dropped). Input is not modified."""
    if not limits.active or not isinstance(messages, list):
        return messages, 0
    out: list[Any] = []
    dropped = 0
    for message in messages:
        parts = _parts(message)
        if parts is None:
            out.append(message)
            continue
        kept: list[Any] = []
        images = 0
        for part in parts:
            if is_image_part(part):
                if limits.max_images_per_message and images >= limits.max_images_per_message:
                    dropped += 1
                    continue
                images += 1
            kept.append(part)
        if limits.image_only_mode and images and message.get("role") == "user":
            kept = [part for part in kept if is_image_part(part)]
        out.append({**message, "content": kept})
    if limits.max_images_per_step:
        positions = [
            (m, p)
            for m, msg in enumerate(out)
            for p, part in enumerate(_parts(msg) or [])
            if is_image_part(part)
        ]
        excess = positions[: max(0, len(positions) - limits.max_images_per_step)]  # the oldest first
        for m, p in reversed(excess):
            content = list(out[m]["content"])
            del content[p]
            out[m] = {**out[m], "content": content}
        dropped += len(excess)
    return out, dropped


def request_images(body: dict[str, Any]) -> list[str]:
    """The image URLs of a chat request, in prompt order (vLLM expands them into placeholders in this order)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [
        image_url(part) for message in messages for part in (_parts(message) or []) if is_image_part(part)
    ]


async def inline_remote_images(
    messages: list[Any], fetch: Callable[[str], Awaitable[tuple[str, bytes]]]
) -> list[Any]:
    """Messages whose http(s) image URLs are replaced by data: URIs of what `fetch(url)` returned
    ((content type, bytes)); other parts and the caller's messages are left as they are."""
    if not isinstance(messages, list):
        return messages
    out: list[Any] = []
    for message in messages:
        parts = _parts(message)
        if parts is None or not any(
            is_image_part(p) and image_url(p).startswith(("http://", "https://")) for p in parts
        ):
            out.append(message)
            continue
        content = []
        for part in parts:
            url = image_url(part) if is_image_part(part) else ""
            if url.startswith(("http://", "https://")):
                kind, data = await fetch(url)
                if not kind.startswith("image/"):
                    raise ImageFetchError(
                        f"image URL {url[:80]!r} answered {kind or 'no content type'}, not an image"
                    )
                inline = f"data:{kind};base64,{base64.b64encode(data).decode()}"
                part = {"type": "image_url", "image_url": {"url": inline}}
            content.append(part)
        out.append({**message, "content": content})
    return out
