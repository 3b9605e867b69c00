"""Training state on disk without pickle: tensors in safetensors, everything else in JSON, and a sha256
manifest of a checkpoint's files written at save time and checked before anything is loaded.

Whoever can write a job's S3 folder must not run code in its trainer on resume (torch.load with
weights_only=False unpickles arbitrary objects). A state (optimizer, scheduler, RNG) is a tree of dicts,
lists, tuples, numbers, strings, tensors and numpy arrays; `save_state` writes its tensors to
<name>.safetensors and the rest of the tree to <name>.json, with each tensor replaced by a reference.
`load_state` rebuilds the tree and refuses any other type: the files hold data, never objects."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

MANIFEST_FILE = "checksums.json"
_TENSOR = "__tensor__"
_NDARRAY = "__ndarray__"
_TUPLE = "__tuple__"
_ITEMS = "__items__"  # a dict whose keys are not all strings (torch optimizer state is keyed by int)
_MARKERS = (_TENSOR, _NDARRAY, _TUPLE, _ITEMS)


class CheckpointIntegrityError(RuntimeError):
    """A checkpoint file is missing, unexpected or differs from the manifest written when it was saved."""


def _encode(value: Any, tensors: dict[str, torch.Tensor], path: str) -> Any:
    if isinstance(value, torch.Tensor):
        key = path or "."
        tensors[key] = value.detach().cpu().contiguous()
        return {_TENSOR: key}
    if isinstance(value, np.ndarray):
        return {_NDARRAY: value.tolist(), "dtype": str(value.dtype)}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, tuple):
        return {_TUPLE: [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and k not in _MARKERS for k in value):
            return {k: _encode(v, tensors, f"{path}/{k}") for k, v in value.items()}
        items = []
        for k, v in value.items():
            if not isinstance(k, (str, int, float, bool)) and k is not None:
                raise TypeError(f"state key {k!r} at {path or '/'} is not a string or number")
            items.append([k, _encode(v, tensors, f"{path}/{k}")])
        return {_ITEMS: items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"state at {path or '/'} holds a {type(value).__name__}: only data can be saved")


def _decode(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors) for v in value]
    if not isinstance(value, dict):
        return value
    if _TENSOR in value:
        key = value[_TENSOR]
        if key not in tensors:
            raise CheckpointIntegrityError(f"tensor {key!r} is missing from the checkpoint")
        return tensors[key]
    if _NDARRAY in value:
        return np.asarray(value[_NDARRAY], dtype=np.dtype(str(value["dtype"])))
    if _TUPLE in value:
        return tuple(_decode(v, tensors) for v in value[_TUPLE])
    if _ITEMS in value:
        return {k: _decode(v, tensors) for k, v in value[_ITEMS]}
    return {k: _decode(v, tensors) for k, v in value.items()}


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """safetensors refuses tensors that share memory (tied weights): those are written as copies."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        tensor = tensor.detach().cpu().contiguous()
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        out[key] = tensor.clone() if ident in seen and tensor.numel() else tensor
        seen.add(ident)
    save_file(out, str(path))


def save_state(state: Any, folder: Path, name: str) -> list[str]:
    """Write <name>.json (and <name>.safetensors when the state holds tensors); returns the file names."""
    tensors: dict[str, torch.Tensor] = {}
    tree = _encode(state, tensors, "")
    files = [f"{name}.json"]
    (folder / files[0]).write_text(json.dumps({"tree": tree}))
    if tensors:
        save_tensors(tensors, folder / f"{name}.safetensors")
        files.append(f"{name}.safetensors")
    return files


def load_state(folder: Path, name: str) -> Any:
    tree = json.loads((folder / f"{name}.json").read_text())["tree"]
    tensor_file = folder / f"{name}.safetensors"
    tensors = load_file(str(tensor_file)) if tensor_file.exists() else {}
    return _decode(tree, tensors)


# ---------------------------------------------------------------------------------------- manifest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(root: Path, names: Iterable[str]) -> dict[str, str]:
    """{relative name: sha256} of the files `names` under root."""
    return {name: sha256_file(root / name) for name in sorted(set(names))}


def verify_files(root: Path, expected: dict[str, str], *, where: str) -> None:
    """Every file in `expected` exists under root with that sha256, and no other file is there. Raises
    CheckpointIntegrityError naming the first mismatch (checked before anything is loaded)."""
    if not isinstance(expected, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in expected.items()
    ):
        raise CheckpointIntegrityError(f"{where}: the checksum manifest is malformed")
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    extra = sorted(present - set(expected))
    if extra:
        raise CheckpointIntegrityError(f"{where}: {extra[0]} is not in the checksum manifest")
    for name, digest in sorted(expected.items()):
        path = root / name
        if name.startswith("/") or ".." in Path(name).parts or not path.is_file():
            raise CheckpointIntegrityError(f"{where}: {name} is missing")
        actual = sha256_file(path)
        if actual != digest:
            raise CheckpointIntegrityError(
                f"{where}: {name} does not match the checksum written when the checkpoint was saved "
                f"(sha256 {actual[:12]}..., expected {digest[:12]}...): the file was changed or corrupted; "
                "delete this checkpoint to resume from an earlier one"
            )
