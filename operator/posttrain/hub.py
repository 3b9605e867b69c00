"""Base models from the Hugging Face Hub for `train --local` and `eval`: a model id the machine has no folder
for is downloaded with huggingface_hub's snapshot_download into the user's Hugging Face cache (HF_HOME /
HF_HUB_CACHE), as TRL, vLLM and synth take an id. HF_ENDPOINT names the Hub (a mirror or a proxy) and
HF_HUB_OFFLINE=1 keeps to what the cache already has; both are read when the download is asked for, not
when huggingface_hub was imported. Only the files a model needs are fetched (config, tokenizer, weights as
safetensors, generation config, chat template), never pickled weights (*.bin, *.pt)."""

from __future__ import annotations

import os
from pathlib import Path

# data only: no remote code (*.py), no pickled weights
ALLOW = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja", "tokenizer*"]
TRUE = ("1", "true", "yes", "on")


class HubUnavailable(Exception):
    """The model is not in the cache and the Hub cannot give it (the message says why)."""


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in TRUE


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def cache_dir() -> Path:
    """The user's Hugging Face cache, as huggingface_hub finds it (HF_HUB_CACHE, HF_HOME/hub,
    XDG_CACHE_HOME/huggingface/hub, ~/.cache/huggingface/hub), read now."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    return Path(home).expanduser() / "hub"


def download(model_id: str, *, revision: str | None = None, timeout_s: float = 20.0) -> Path:
    """The model's folder in the Hugging Face cache (downloaded when missing and the Hub is reachable);
    HubUnavailable otherwise."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        folder = snapshot_download(
            model_id, revision=revision, allow_patterns=ALLOW, endpoint=endpoint(), local_files_only=offline(),
            etag_timeout=timeout_s, cache_dir=cache_dir(),
        )  # fmt: skip
    except LocalEntryNotFoundError as err:
        why = "HF_HUB_OFFLINE is set" if offline() else f"the Hub at {endpoint()} cannot be reached"
        raise HubUnavailable(f"{why} and the Hugging Face cache has no copy ({type(err).__name__})") from None
    except RepositoryNotFoundError:
        raise HubUnavailable(f"the Hub at {endpoint()} has no model {model_id!r} (or it is gated: set HF_TOKEN)") from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise HubUnavailable(f"the Hub at {endpoint()} did not give {model_id!r}: {type(err).__name__}: "
                             f"{str(err).splitlines()[0][:200] if str(err) else ''}") from None  # fmt: skip
    path = Path(folder)
    if not (path / "config.json").is_file():
        raise HubUnavailable(f"the Hub's {model_id!r} has no config.json: not a transformers model")
    return path
