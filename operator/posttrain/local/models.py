"""Where the local runner finds a job's starting weights.

- A base model id known to posttrain.modelzoo (SmolLM2-135M-Instruct, the tiny random Qwen2 and Qwen2-VL) resolves to its
  folder under .models/, built on first use.
- Any other base id is downloaded from the Hugging Face Hub into the user's HF cache when the Hub is reachable
  (posttrain.hub: HF_ENDPOINT, HF_HUB_OFFLINE honoured); else the error names --model-path.
- A base that is a local folder is used as it is.
- A fine-tuned id (`ft:` / `rl:` / `fft:` / `qft:` `<base>:<ns>.<name>.<uid8>`) resolves to the S3 URI of the
  earlier job's final/ folder in the same embedded S3 (FFT-first chaining); its base is the id's base
  (posttrain.api.model_ids, the rule the operator follows too)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from posttrain.api import model_ids
from posttrain.errors import Problem, UserError

REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS_DIR = REPO_ROOT / ".models"


@dataclass(frozen=True)
class ResolvedModel:
    base_model: str  # the base model id (for the fine_tuned_model id and the served name)
    model_path: str  # local folder or s3:// URI of the weights to start from
    source_id: str | None = None  # the fine-tuned id this job starts from, if any


def _tiny_vl_for_vllm(out: Path) -> Path:
    from posttrain import modelzoo

    return modelzoo.build_tiny_vl_model(out, hidden_size=128)


def local_model_dir(base: str) -> Path | None:
    """A modelzoo model's folder (built on first use), or None when `base` is not one."""
    from posttrain import modelzoo

    known = {
        modelzoo.SMOLLM2_MODEL_NAME.lower(): (modelzoo.convert_smollm2, "smollm2-135m-instruct"),
        modelzoo.TINY_MODEL_NAME.lower(): (modelzoo.build_tiny_model, "tiny-random-qwen2"),
        # head_dim 32: vLLM's CPU attention rejects the builder's default 16 (the vllm_vl_model_dir fixture's model)
        modelzoo.TINY_VL_MODEL_NAME.lower(): (_tiny_vl_for_vllm, "tiny-random-qwen2-vl-hd32"),
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
        if not model_ids.is_fine_tuned_id(source):
            if Path(source).is_dir():
                return ResolvedModel(base_model=base or source, model_path=str(Path(source).resolve()))
            raise UserError(
                Problem(
                    f"model.source {source!r} is neither a fine-tuned id (ft:/rl:...) nor a folder",
                    file=config_file,
                    field="model.source",
                )
            )
        try:
            id_base, weights = model_ids.source_weights(source, bucket)
        except model_ids.ModelIdError as err:
            raise UserError(Problem(str(err), file=config_file, field="model.source", fix=err.fix)) from err
        return ResolvedModel(base_model=id_base, model_path=weights, source_id=source)
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
        from posttrain import hub

        try:
            folder = hub.download(base)
        except hub.HubUnavailable as err:
            raise UserError(
                Problem(
                    f"no local weights for base model {base!r}: {err}",
                    file=config_file,
                    field="model.base",
                    fix="pass --model-path DIR with the model's Hugging Face folder, or use "
                    "HuggingFaceTB/SmolLM2-135M-Instruct / posttrain/tiny-random-qwen2",
                )
            ) from None
    return ResolvedModel(base_model=base, model_path=str(folder))
