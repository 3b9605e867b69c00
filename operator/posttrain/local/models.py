"""Where the local runner finds a job's starting weights.

- A base model id known to posttrain.modelzoo (SmolLM2-135M-Instruct, the tiny random Qwen2) resolves to its
  folder under .models/, built on first use (there are no hub downloads here).
- A base that is a local folder is used as it is.
- A fine-tuned id (`ft:` / `rl:` / `fft:` / `qft:` `<base>:<ns>.<name>.<uid8>`) resolves to the S3 URI of the
  earlier job's final/ folder in the same embedded S3 (FFT-first chaining); its base is the id's base."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posttrain.errors import Problem, UserError

REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS_DIR = REPO_ROOT / ".models"
FT_PREFIXES = ("ft:", "fft:", "qft:", "rl:")


@dataclass(frozen=True)
class ResolvedModel:
    base_model: str  # the base model id (for the fine_tuned_model id and the served name)
    model_path: str  # local folder or s3:// URI of the weights to start from
    source_id: str | None = None  # the fine-tuned id this job starts from, if any


def is_fine_tuned_id(value: str) -> bool:
    return value.lower().startswith(FT_PREFIXES)


def parse_fine_tuned_id(model_id: str) -> tuple[str, str, str, str, str]:
    """`rl:<base>:<ns>.<name>.<uid8>` -> (kind, base, namespace, name, uid8)."""
    kind, _, rest = model_id.partition(":")
    base, _, tail = rest.rpartition(":")
    parts = tail.split(".")
    if not base or len(parts) < 3 or not parts[0] or not parts[-1]:
        raise UserError(
            Problem(
                f"not a posttrain fine-tuned model id: {model_id!r}",
                field="model.source",
                fix="use the fine_tuned_model printed by an earlier job, e.g. ft:<base>:<namespace>.<name>.<uid8>",
            )
        )
    return kind, base, parts[0], ".".join(parts[1:-1]), parts[-1]


def source_uri(model_id: str, bucket: str) -> str:
    """The S3 URI of a fine-tuned id's final/ folder (posttrain.api.model_ids when present)."""
    try:
        from posttrain.api.model_ids import resolve_model_source
    except ImportError:  # issue 2's module not there yet: the same rule, spelled out
        _, _, namespace, name, uid8 = parse_fine_tuned_id(model_id)
        return f"s3://{bucket}/jobs/{namespace}/{name}-{uid8}/final/"
    return resolve_model_source(model_id, bucket)


def local_model_dir(base: str) -> Path | None:
    """A modelzoo model's folder (built on first use), or None when `base` is not one."""
    from posttrain import modelzoo

    known = {
        modelzoo.SMOLLM2_MODEL_NAME.lower(): (modelzoo.convert_smollm2, "smollm2-135m-instruct"),
        modelzoo.TINY_MODEL_NAME.lower(): (modelzoo.build_tiny_model, "tiny-random-qwen2"),
    }
    entry = known.get(base.lower())
    if entry is None:
        return None
    build, folder = entry
    return build(MODELS_DIR / folder)


def resolve_model(
    base: str | None,
    source: str | None,
    *,
    bucket: str,
    model_path: str | None = None,
    config_file: str | None = None,
) -> ResolvedModel:
    if source:
        if not is_fine_tuned_id(source):
            if Path(source).is_dir():
                return ResolvedModel(base_model=base or source, model_path=str(Path(source).resolve()))
            raise UserError(
                Problem(
                    f"model.source {source!r} is neither a fine-tuned id (ft:/rl:...) nor a folder",
                    file=config_file,
                    field="model.source",
                )
            )
        _, id_base, _, _, _ = parse_fine_tuned_id(source)
        return ResolvedModel(base_model=id_base, model_path=source_uri(source, bucket), source_id=source)
    if not base:
        raise UserError(
            Problem("the config names no model", file=config_file, field="model.base", fix="set [model].base")
        )
    if model_path:
        return ResolvedModel(base_model=base, model_path=str(Path(model_path).resolve()))
    if Path(base).is_dir():
        return ResolvedModel(base_model=base, model_path=str(Path(base).resolve()))
    folder = local_model_dir(base)
    if folder is None:
        raise UserError(
            Problem(
                f"no local weights for base model {base!r} (this machine has no hub access)",
                file=config_file,
                field="model.base",
                fix="pass --model-path DIR with the model's Hugging Face folder, or use "
                "HuggingFaceTB/SmolLM2-135M-Instruct / posttrain/tiny-random-qwen2",
            )
        )
    return ResolvedModel(base_model=base, model_path=str(folder))
