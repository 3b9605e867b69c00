"""Weight sync from the trainer to the policy rollout servers after an update.

Rank 0 only. Full weights (LoRA merged out of place, safetensors in the sync dtype that posttrain.hardware
decides (bf16 where bf16 is native, fp32 elsewhere) + config + tokenizer: a folder vLLM's
reload_weights reads) or the LoRA adapter alone (format "lora", for GPU servers that hot-load adapters; on
CPU the rollout server merges it itself or refuses). The folder goes to the shared dir (weight_sync.via =
"path": a volume both sides mount) or to S3 under <prefix>weights/v<N>/ (via = "s3"); then POST /v1/weights
{path, format, version} to every replica of every policy endpoint (replicas.py: each Service name
resolved again at every sync; a sync fails when one replica fails). Timed: save, upload and server seconds
are returned.

Retention: [training] keep_weight_versions (job.settings.keep_weight_versions, default 2; 0 keeps every one). After
every policy server has loaded version N, the versions older than the newest `keep` are deleted from the
local folder and from S3 (<prefix>weights/v<M>/). The version just loaded, the one being served, is never
deleted. The rollout server keeps its own downloads of the last two syncs only."""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from posttrain.api.jobfile import JobFile

from posttrain_trainer import replicas
from posttrain_trainer.server_auth import rollout_auth_headers

_VERSION_DIR = re.compile(r"^v(\d+)$")
_VERSION_KEY = re.compile(r"weights/v(\d+)/")


class WeightSyncError(RuntimeError):
    pass


def versions_to_delete(versions: list[int], keep: int, served: int) -> list[int]:
    """Versions older than the newest `keep`, never the served one; keep <= 0 deletes nothing."""
    if keep <= 0:
        return []
    kept = set(sorted(set(versions))[-keep:]) | {served}
    return sorted(v for v in set(versions) if v not in kept)


@dataclass
class SyncResult:
    version: int
    path: str
    format: str
    save_seconds: float
    upload_seconds: float
    post_seconds: float
    total_seconds: float
    server: list[dict[str, Any]] = field(default_factory=list)
    pruned: list[int] = field(default_factory=list)  # versions deleted after this sync

    def as_metrics(self) -> dict[str, Any]:
        return {
            "weight_version": self.version,
            "weight_sync_seconds": self.total_seconds,
            "weight_sync_save_seconds": self.save_seconds,
            "weight_sync_post_seconds": self.post_seconds,
            # the longest any server kept serving the old weights after the new ones reached it (waiting for
            # its requests in flight, then loading), and of that the wait for the requests in flight
            "weight_sync_stale_seconds": _longest(self.server, "stale_seconds"),
            "weight_sync_drain_seconds": _longest(self.server, "drain_seconds"),
        }


def _longest(answers: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [float(a[key]) for a in answers if isinstance(a.get(key), int | float)]
    return max(values) if values else None


def sync_format(wanted: str, is_lora: bool) -> str:
    """ "full" unless the settings' weight_sync_format ([training.weight_sync] format) asks for "lora" and the
    model is a LoRA."""
    return "lora" if wanted == "lora" and is_lora else "full"


class WeightSyncer:
    resolve: replicas.Resolver | None = None  # how post() finds a policy endpoint's replicas (replicas.py)

    def __init__(
        self,
        job: JobFile,
        endpoints: Sequence[str] | None = None,
        *,
        client=None,
        keep: int | None = None,
        timeout_s: float = 600.0,
        dtype: torch.dtype = torch.bfloat16,
        resolve: replicas.Resolver | None = None,
    ):
        self.job = job
        self.endpoints = list(endpoints if endpoints is not None else job.endpoints.policy)
        self.via = job.weight_sync.via
        base = job.weight_sync.shared_dir or str(Path(job.workdir) / "weights")
        self.shared_dir = Path(base)
        self.client = client
        self.keep = job.settings.keep_weight_versions if keep is None else int(keep)
        self.timeout_s = timeout_s
        self.dtype = dtype
        self.resolve = resolve  # replicas.py's resolver (None: socket.getaddrinfo)
        # the last weights every replica was given (bring_up_to_date); the background sampler (async_depth)
        # brings replicas up to date while the main thread syncs
        self.served: dict[str, Any] | None = None
        self._served_lock = threading.Lock()

    def save(self, model: torch.nn.Module, tokenizer, version: int, fmt: str, state=None) -> Path:
        """The weights of `version` in a folder the servers can read; `state`: a sharded model's gathered
        full weights (distributed.full_weights), written instead of the module's."""
        from posttrain_trainer.distributed import unwrap
        from posttrain_trainer.modeling import save_merged

        out = self.shared_dir / f"v{version}"
        if out.exists():
            shutil.rmtree(out)
        tmp = self.shared_dir / f".v{version}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        if fmt == "lora":
            unwrap(model).save_pretrained(tmp)
            if tokenizer is not None:
                tokenizer.save_pretrained(tmp)
        else:
            save_merged(model, tokenizer, tmp, dtype=self.dtype, state=state)
        tmp.rename(out)  # the server never sees a half-written folder
        return out

    def prune(self, served: int) -> list[int]:
        """Delete the versions versions_to_delete names, locally and in S3; returns them."""
        from posttrain import storage as s3

        local = {}
        if self.shared_dir.is_dir():
            for child in self.shared_dir.iterdir():
                match = _VERSION_DIR.match(child.name)
                if match and child.is_dir():
                    local[int(match.group(1))] = child
        remote: set[int] = set()
        prefix = f"{self.job.storage.prefix}weights/" if self.job.storage is not None else ""
        if self.via == "s3" and self.job.storage is not None and self.client is not None:
            for key in s3.list_prefix(self.client, self.job.storage.bucket, prefix):
                match = _VERSION_KEY.search(key[len(self.job.storage.prefix) :])
                if match:
                    remote.add(int(match.group(1)))
        doomed = versions_to_delete(sorted(set(local) | remote), self.keep, served)
        for version in doomed:
            if version in local:
                shutil.rmtree(local[version], ignore_errors=True)
            if version in remote:
                s3.delete_prefix(self.client, self.job.storage.bucket, f"{prefix}v{version}/")
        return doomed

    def upload(self, local: Path, version: int) -> str:
        if self.via != "s3":
            return str(local)
        from posttrain import storage as s3

        if self.job.storage is None:
            raise WeightSyncError("weight_sync.via = s3 needs the job file's storage section")
        client = self.client or s3.client_from_env(self.job.storage)
        self.client = client
        return s3.upload_dir(
            client, local, self.job.storage.bucket, f"{self.job.storage.prefix}weights/v{version}/"
        )

    def post(self, path: str, fmt: str, version: int) -> list[dict[str, Any]]:
        with self._served_lock:  # never interleaved with a catch-up (bring_up_to_date) of another thread
            replica_urls = replicas.expand(self.endpoints, self.resolve)  # every replica, resolved now
            answers = [self._post_one(url, path, fmt, version) for url in replica_urls]
            self.served = {"path": path, "format": fmt, "version": version}
        return answers

    def _post_one(self, endpoint: str, path: str, fmt: str, version: int) -> dict[str, Any]:
        import httpx

        url = f"{endpoint.rstrip('/')}/v1/weights"
        try:
            response = httpx.post(
                url,
                json={"path": path, "format": fmt, "version": version},
                headers=rollout_auth_headers(),
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as err:
            raise WeightSyncError(f"POST {url} failed: {type(err).__name__}: {err}") from err
        if response.status_code >= 400:
            raise WeightSyncError(f"POST {url} -> HTTP {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else {}

    def bring_up_to_date(self, replica_urls: Sequence[str]) -> list[str]:
        """Give the last synced weights to every replica of `replica_urls` that serves an older version (a
        pod that replaced another, or a restarted server, starts from the base weights, version 0) before
        it is sampled from; the replicas brought up. Nothing before the first sync. A replica that does not
        answer its version is left to the rollout's own error handling."""
        import httpx

        with self._served_lock:
            served = self.served
            if served is None:
                return []
            behind = []
            for url in replica_urls:
                try:
                    response = httpx.get(f"{url.rstrip('/')}/v1/weights", timeout=10.0)
                    version = response.json().get("weight_version") if response.status_code == 200 else None
                except (httpx.HTTPError, ValueError, AttributeError):
                    continue
                if isinstance(version, int) and version < served["version"]:
                    self._post_one(url, served["path"], served["format"], served["version"])
                    behind.append(url)
        return behind

    def sync(
        self, model: torch.nn.Module, tokenizer, version: int, fmt: str = "full", state=None
    ) -> SyncResult:
        started = time.perf_counter()
        local = self.save(model, tokenizer, version, fmt, state)
        saved = time.perf_counter()
        path = self.upload(local, version)
        uploaded = time.perf_counter()
        answers = self.post(path, fmt, version)
        done = time.perf_counter()
        pruned = self.prune(served=version)  # every server now holds `version`: older ones can go
        return SyncResult(
            version=version,
            path=path,
            format=fmt,
            save_seconds=saved - started,
            upload_seconds=uploaded - saved,
            post_seconds=done - uploaded,
            total_seconds=done - started,
            server=answers,
            pruned=pruned,
        )
