"""Weight sync from the trainer to the policy rollout servers after an update.

Rank 0 only. Full weights (LoRA merged out of place, safetensors in the sync dtype that posttrain.hardware
decides (bf16 where bf16 is native, fp32 elsewhere) + config + tokenizer: a folder vLLM's
reload_weights reads) or the LoRA adapter alone (format "lora", for GPU servers that hot-load adapters; on
CPU the rollout server merges it itself or refuses). The folder goes to the shared dir (weight_sync.via =
"path": a volume both sides mount) or to S3 under <prefix>weights/v<N>/ (via = "s3"); then POST /v1/weights
{path, format, version} to every policy endpoint. Timed: save, upload and server seconds are returned.
Only the last `keep` versions are kept on disk."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from posttrain.api.jobfile import JobFile

from posttrain_trainer.server_auth import rollout_auth_headers


class WeightSyncError(RuntimeError):
    pass


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

    def as_metrics(self) -> dict[str, Any]:
        return {
            "weight_version": self.version,
            "weight_sync_seconds": self.total_seconds,
            "weight_sync_save_seconds": self.save_seconds,
            "weight_sync_post_seconds": self.post_seconds,
        }


def sync_format(config: dict[str, Any], is_lora: bool) -> str:
    """ "full" unless training.weight_sync.format/mode asks for "lora" (and the model is a LoRA)."""
    training = config.get("training") if isinstance(config.get("training"), dict) else {}
    ws = training.get("weight_sync") if isinstance(training.get("weight_sync"), dict) else {}
    wanted = str(ws.get("format") or "full").lower()
    return "lora" if wanted == "lora" and is_lora else "full"


class WeightSyncer:
    def __init__(
        self,
        job: JobFile,
        endpoints: Sequence[str] | None = None,
        *,
        client=None,
        keep: int = 2,
        timeout_s: float = 600.0,
        dtype: torch.dtype = torch.bfloat16,
    ):
        self.job = job
        self.endpoints = list(endpoints if endpoints is not None else job.endpoints.policy)
        self.via = job.weight_sync.via
        base = job.weight_sync.shared_dir or str(Path(job.workdir) / "weights")
        self.shared_dir = Path(base)
        self.client = client
        self.keep = keep
        self.timeout_s = timeout_s
        self.dtype = dtype
        self._written: list[Path] = []

    def save(self, model: torch.nn.Module, tokenizer, version: int, fmt: str) -> Path:
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
            save_merged(model, tokenizer, tmp, dtype=self.dtype)
        tmp.rename(out)  # the server never sees a half-written folder
        self._written.append(out)
        while len(self._written) > self.keep:
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        return out

    def upload(self, local: Path, version: int) -> str:
        if self.via != "s3":
            return str(local)
        from posttrain_trainer import storage as s3

        if self.job.storage is None:
            raise WeightSyncError("weight_sync.via = s3 needs the job file's storage section")
        client = self.client or s3.client_from_env(self.job.storage)
        self.client = client
        return s3.upload_dir(
            client, local, self.job.storage.bucket, f"{self.job.storage.prefix}weights/v{version}/"
        )

    def post(self, path: str, fmt: str, version: int) -> list[dict[str, Any]]:
        import httpx

        answers = []
        for endpoint in self.endpoints:
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
            answers.append(response.json() if response.content else {})
        return answers

    def sync(self, model: torch.nn.Module, tokenizer, version: int, fmt: str = "full") -> SyncResult:
        started = time.perf_counter()
        local = self.save(model, tokenizer, version, fmt)
        saved = time.perf_counter()
        path = self.upload(local, version)
        uploaded = time.perf_counter()
        answers = self.post(path, fmt, version)
        done = time.perf_counter()
        return SyncResult(
            version=version,
            path=path,
            format=fmt,
            save_seconds=saved - started,
            upload_seconds=uploaded - saved,
            post_seconds=done - uploaded,
            total_seconds=done - started,
            server=answers,
        )
