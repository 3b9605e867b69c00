"""Weight versions and the admission gate that makes a weight sync atomic for requests.

A sync closes the gate (new requests wait on an asyncio condition), waits for requests in flight to finish
(they complete on the old weights and are captured with the old version: none is dropped), swaps the weights,
sets the new version and reopens the gate: every request runs on exactly one version. The gate also keeps the
server's busy time (a request in flight, or weights loading) for the trainer's idle share, and per sync how
long the old weights kept serving after the new ones arrived (stale seconds) and how long admission waited for
the requests in flight (drain seconds).
Also: s3:// model folders (download) and LoRA adapters merged into full weights (CPU serving)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any


class BusyClock:
    """Seconds during which at least one unit of work ran (pure bookkeeping; `now` is injectable)."""

    def __init__(self, now: Any = time.monotonic):
        self._now = now
        self._active = 0
        self._since = 0.0
        self._total = 0.0

    def start(self) -> None:
        if self._active == 0:
            self._since = self._now()
        self._active += 1

    def stop(self) -> None:
        self._active = max(0, self._active - 1)
        if self._active == 0:
            self._total += self._now() - self._since

    def seconds(self) -> float:
        """Busy seconds so far, the running stretch included."""
        return self._total + (self._now() - self._since if self._active else 0.0)


class WeightGate:
    def __init__(self, version: Any = 0):
        self.version = version
        self._cond = asyncio.Condition()
        self._paused = False
        self._inflight = 0
        self._sync_lock = asyncio.Lock()
        self.busy = BusyClock()  # requests in flight or weights loading
        self.stale_seconds_total = 0.0  # summed over syncs: old weights serving after new ones arrived
        self.last_sync: dict[str, float] = {}

    @property
    def inflight(self) -> int:
        return self._inflight

    @property
    def paused(self) -> bool:
        return self._paused

    async def enter(self) -> Any:
        """Admit one request (waits while a sync runs); returns the version it will run on."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self._paused)
            self._inflight += 1
            self.busy.start()
            return self.version

    async def leave(self) -> None:
        async with self._cond:
            self._inflight -= 1
            self.busy.stop()
            self._cond.notify_all()

    async def pause(self) -> float:
        """Close admission and wait for the requests in flight to finish; the seconds waited (the loading
        that follows counts as busy until resume)."""
        started = time.monotonic()
        async with self._cond:
            self._paused = True
            await self._cond.wait_for(lambda: self._inflight == 0)
            self.busy.start()
        return time.monotonic() - started

    async def resume(self, version: Any = None) -> None:
        async with self._cond:
            if version is not None:
                self.version = version
            if self._paused:
                self.busy.stop()
            self._paused = False
            self._cond.notify_all()

    def record_sync(self, stale_seconds: float, drain_seconds: float) -> dict[str, float]:
        """One sync's timing: stale (the POST's arrival to the new version serving), drain (admission closed,
        waiting for the requests in flight)."""
        self.stale_seconds_total += stale_seconds
        self.last_sync = {"stale_seconds": stale_seconds, "drain_seconds": drain_seconds}
        return self.last_sync

    def stats(self) -> dict[str, Any]:
        """What GET /v1/weights reports beside the version: busy seconds since start, stale seconds summed
        over syncs, the last sync's timing."""
        return {
            "busy_seconds": self.busy.seconds(),
            "stale_seconds_total": self.stale_seconds_total,
            "last_sync": dict(self.last_sync),
        }

    def sync_lock(self) -> asyncio.Lock:
        """Held for the whole of one sync: syncs never interleave."""
        return self._sync_lock


# -- s3 ------------------------------------------------------------------------------------------------


def parse_s3_uri(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key


def s3_client():
    """minio client from S3_ENDPOINT (host:port or http(s)://host:port), S3_ACCESS_KEY_ID,
    S3_SECRET_ACCESS_KEY, optional S3_REGION."""
    from urllib.parse import urlparse

    from minio import Minio

    endpoint = os.environ.get("S3_ENDPOINT") or ""
    access = os.environ.get("S3_ACCESS_KEY_ID")
    secret = os.environ.get("S3_SECRET_ACCESS_KEY")
    if not endpoint or not access or not secret:
        raise RuntimeError("s3:// paths need S3_ENDPOINT, S3_ACCESS_KEY_ID and S3_SECRET_ACCESS_KEY")
    secure = os.environ.get("S3_SECURE", "").lower() in ("1", "true", "yes")
    if "://" in endpoint:
        parsed = urlparse(endpoint)
        endpoint, secure = parsed.netloc, parsed.scheme == "https"
    return Minio(
        endpoint, access_key=access, secret_key=secret, secure=secure, region=os.environ.get("S3_REGION")
    )


def download_s3_dir(uri: str, dest: str | Path, client=None) -> Path:
    """Mirror an s3:// prefix into dest (written to a temp folder, then renamed: never half a model)."""
    client = client or s3_client()
    bucket, prefix = parse_s3_uri(uri)
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    dest = Path(dest)
    objects = [o for o in client.list_objects(bucket, prefix=prefix, recursive=True) if not o.is_dir]
    if not objects:
        raise FileNotFoundError(f"nothing stored under {uri}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".dl-", dir=dest.parent))
    try:
        for obj in objects:
            rel = obj.object_name[len(prefix) :]
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            client.fget_object(bucket, obj.object_name, str(target))
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def local_path(path: str, cache_dir: str | Path, name: str) -> Path:
    """A local folder for `path` (downloaded first when it is s3://)."""
    if path.startswith("s3://"):
        return download_s3_dir(path, Path(cache_dir) / name)
    p = Path(path).resolve()
    if not p.is_dir():
        raise FileNotFoundError(f"no such model folder: {path}")
    return p


def merge_lora(
    base_dir: str | Path, adapter_dir: str | Path, out_dir: str | Path, dtype: str | None = None
) -> Path:
    """Merge a PEFT adapter into the base weights (safetensors + config + tokenizer) for reload_weights: the
    CPU path (vLLM's LoRA serving switches compilation off on CPU). dtype defaults to the one vLLM serves in
    on this machine (posttrain.hardware: bf16 where native, else fp32 on a CPU)."""
    from peft import PeftModel
    from posttrain import hardware
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir = Path(out_dir)
    torch_dtype = hardware.torch_dtype(dtype or hardware.vllm_dtype(hardware.probe()))
    base = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch_dtype, use_safetensors=True)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    merged.save_pretrained(str(tmp), safe_serialization=True)
    with contextlib.suppress(Exception):  # weights are what reload_weights needs
        AutoTokenizer.from_pretrained(str(base_dir)).save_pretrained(str(tmp))
    if out_dir.exists():
        shutil.rmtree(out_dir)
    tmp.rename(out_dir)
    return out_dir
