"""The model an evaluation (`posttrain eval`, the demo's) talks to: `--inference-url` (any OpenAI-compatible server: its model name is
--model), or a vLLM rollout server started here on the model's weights (`python -m posttrain_rollout serve
--role policy`, stopped at the end). --model is then

- a local Hugging Face folder;
- a base model id: SmolLM2-135M-Instruct and the tiny test model are built from their local sources (no hub
  here); any other id is downloaded from the Hugging Face Hub when it is reachable (posttrain.hub), else needs --model-path DIR;
- a fine_tuned_model id (`ft:` / `rl:` `<base>:<namespace>.<name>.<uid8>`): its final/ folder in S3
  (S3_ENDPOINT and keys; without them, the embedded S3 of the local runs in .runs/s3), with a LoRA result
  merged onto its base first (vLLM on CPU serves full weights)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from posttrain import hardware
from posttrain.errors import Problem, UserError


@dataclass
class Served:
    inference_url: str  # base URL (no /v1)
    served_name: str  # the `model` sent in requests
    base_model: str
    log_path: Path | None = None


def materialize(model_path: str, out_dir: Path, s3: Any) -> Path:
    """A plain local HF folder for a model path: itself when it is one; else (an s3:// final/ folder, full
    weights or a LoRA adapter on a chain of bases) loaded with the trainer's loader, merged in fp32, saved in
    the dtype vLLM serves a LoRA policy in here (posttrain.hardware: float32 on a CPU)."""
    local = Path(model_path)
    if not model_path.startswith("s3://") and (local / "config.json").exists():
        return local
    import torch
    from posttrain_trainer.modeling import load_model_and_tokenizer, save_merged

    from posttrain.api.jobfile import StorageRef

    if (out_dir / "config.json").exists():
        return out_dir
    storage = StorageRef.model_validate(s3.storage())
    saved = {k: os.environ.get(k) for k in s3.env()}
    os.environ.update(s3.env())
    try:
        # the base as the trainer held it (a LoRA's frozen base is bf16 where bf16 is native), merged in fp32:
        # the policy the job served and evaluated, not the adapter on the original fp32 base
        base_dtype = hardware.torch_dtype(hardware.plan().load)
        model, tokenizer = load_model_and_tokenizer(
            model_path, storage=storage, dtype=torch.float32, base_dtype=base_dtype
        )
        # a LoRA result merged into bf16 weights would lose most of its change: float32 on a CPU (hardware)
        save_merged(model, tokenizer, out_dir, dtype=hardware.torch_dtype(hardware.plan(lora_policy=True).sync))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return out_dir


def server_argv(folder: Path, port: int, served_name: str, max_model_len: int) -> list[str]:
    """The rollout server (policy role) when installed; else vLLM's own OpenAI server: evaluation needs only
    chat completions, no captures."""
    import importlib.util

    from posttrain.local.runner import _rollout_argv

    if importlib.util.find_spec("posttrain_rollout.__main__") is not None:
        # served as a LoRA policy is during training (float32 on a CPU), so before/after scores compare
        return [*_rollout_argv("policy", str(folder), port, served_name, max_model_len), "--lora-policy"]
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
            "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
            "--dtype", hardware.vllm_dtype(hardware.probe(), lora_policy=True),
            "--max-model-len", str(max_model_len)]  # fmt: skip


class _S3FromEnv:
    """The S3 named by S3_ENDPOINT / keys, shaped like posttrain.s3server's handle (env, storage, bucket)."""

    def __init__(self) -> None:
        self.bucket = os.environ.get("S3_BUCKET", "posttrain")

    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in ("S3_ENDPOINT", "S3_ACCESS_KEY_ID", "S3_SECRET_ACCESS_KEY")}

    def storage(self, prefix: str = "") -> dict[str, Any]:
        endpoint = os.environ["S3_ENDPOINT"]
        return {"endpoint": endpoint, "secure": endpoint.startswith("https://"), "bucket": self.bucket,
                "prefix": prefix}  # fmt: skip

    def stop(self) -> None:
        pass


@contextlib.contextmanager
def model_server(
    model: str, *, run_dir: Path, runs_dir: Path, model_path: str | None = None, max_model_len: int = 1024,
    startup_timeout: float = 1800.0, out: Any = None,
) -> Iterator[Served]:  # fmt: skip
    """Serve `model` on a free 127.0.0.1 port for the duration of the block (every process stopped after)."""
    from posttrain.api.model_ids import is_fine_tuned_id
    from posttrain.dataset_upload import s3_configured
    from posttrain.local.models import ResolvedModel, resolve_model
    from posttrain.local.processes import ProcessSet, wait_http
    from posttrain.local.runner import _vllm_env
    from posttrain.localhost import free_port

    out = out or sys.stderr
    fine_tuned = is_fine_tuned_id(model)
    s3 = None
    with ProcessSet(run_dir / "pids.json") as procs:
        try:
            remote = bool(model_path and model_path.startswith("s3://"))
            hub = in_cluster() and not fine_tuned and not model_path and not Path(model).is_dir()
            if fine_tuned or remote:
                s3 = _S3FromEnv() if s3_configured() else _embedded_s3(runs_dir)
            folder: Path | str
            if hub:  # a pod of `eval --cluster` with a plain base id: vLLM fetches it, as the operator's servers do
                resolved, folder = ResolvedModel(base_model=model, model_path=model), model
            else:
                if remote:  # a base model's weights in S3 (a cluster's POSTTRAIN_BASE_MODEL_URI)
                    resolved = ResolvedModel(base_model=model, model_path=str(model_path))
                else:
                    resolved = resolve_model(None if fine_tuned else model, model if fine_tuned else None,
                                             bucket=s3.bucket if s3 is not None else "posttrain",
                                             model_path=model_path, config_file=None)  # fmt: skip
                folder = materialize(resolved.model_path, run_dir / "model", s3)
            port = free_port()
            log = run_dir / "logs" / "eval-model-server.log"
            env = {**os.environ, **(s3.env() if s3 is not None else {}), "PYTHONUNBUFFERED": "1"}
            if not hub:
                env["HF_HUB_OFFLINE"] = "1"
            proc = procs.start("eval-model-server", server_argv(Path(folder), port, resolved.base_model, max_model_len),
                               log, env=_vllm_env(env, runs_dir, run_dir, 1))  # fmt: skip
            url = f"http://127.0.0.1:{port}"
            print(f"serving {model} from {folder} on {url} (log {log})", file=out, flush=True)
            wait_http(f"{url}/health", timeout=startup_timeout, proc=proc, interval=1.0)
            yield Served(url, resolved.base_model, resolved.base_model, log)
        finally:
            procs.stop_all()
            if s3 is not None:
                s3.stop()


def _embedded_s3(runs_dir: Path) -> Any:
    from posttrain import s3server

    return s3server.start(runs_dir / "s3")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


def check_inference_url(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(Problem(f"not an http(s) URL: {url!r}", field="--inference-url",
                                fix="pass e.g. http://127.0.0.1:8000/v1"))  # fmt: skip
    return url.rstrip("/")
