"""Model ids: synth's allowlist of base models with experimental gating, fine-tuned ids, and
where a posttrain job's weights live in S3. The one home of these rules: the CLI, the operator, the local
runner and the trainer (both images ship this package) import them from here.

- Base ids are looked up case-insensitively and normalised to their canonical spelling.
- Experimental models (235B/480B and every *-Thinking-2507) need SDK_EXPERIMENTAL=1 (or
  POSTTRAIN_EXPERIMENTAL=1).
- Fine-tuned ids start with ft:, fft:, qft: or rl: and must contain a known base as one of their
  ':'-separated segments. Only model.source may carry a prefix.
- posttrain's own fine-tuned ids: `<rl|ft>:<base>:<namespace>.<name>.<uid8>`; their weights live at
  `s3://<bucket>/jobs/<namespace>/<name>-<uid8>/final/`.
- A base given as a local folder or an s3:// URI is your own weights and is not checked against the list.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

FT_PREFIXES = ("ft", "fft", "qft", "rl")

_QWEN3_RL = [
    "Qwen3-0.6B",
    "Qwen3-1.7B",
    "Qwen3-4B",
    "Qwen3-8B",
    "Qwen3-14B",
    "Qwen3-30B-A3B",
    "Qwen3-4B-2507",
    "Qwen3-4B-Instruct-2507",
    "Qwen3-4B-Instruct-2507-FP8",
    "Qwen3-30B-A3B-Instruct-2507",
    "Qwen3-30B-A3B-Instruct-2507-FP8",
    "Qwen3-4B-Thinking-2507",
    "Qwen3-4B-Thinking-2507-FP8",
    "Qwen3-30B-A3B-Thinking-2507",
    "Qwen3-30B-A3B-Thinking-2507-FP8",
    "Qwen3-Coder-30B-A3B-Instruct",
    "Qwen3-Coder-30B-A3B-Instruct-FP8",
    "Qwen3-VL-2B-Instruct",
    "Qwen3-VL-2B-Thinking",
    "Qwen3-VL-4B-Instruct",
    "Qwen3-VL-4B-Thinking",
    "Qwen3-VL-8B-Instruct",
    "Qwen3-VL-8B-Thinking",
]
_QWEN3_SFT_ONLY = [
    "Qwen3-32B",
    "Qwen3-235B-A22B",
    "Qwen3-235B-A22B-Instruct-2507",
    "Qwen3-235B-A22B-Instruct-2507-FP8",
    "Qwen3-235B-A22B-Thinking-2507",
    "Qwen3-235B-A22B-Thinking-2507-FP8",
    "Qwen3-Coder-480B-A35B-Instruct",
    "Qwen3-Coder-480B-A35B-Instruct-FP8",
    "Qwen3-VL-30B-A3B-Instruct",
    "Qwen3-VL-30B-A3B-Thinking",
    "Qwen3-VL-32B-Instruct",
    "Qwen3-VL-32B-Thinking",
    "Qwen3-VL-235B-A22B-Instruct",
    "Qwen3-VL-235B-A22B-Thinking",
]
# posttrain's own additions (CPU demo and tests).
_EXTENSION = [
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "posttrain/tiny-random-qwen2",
    "posttrain/tiny-random-qwen2-vl",  # vision RL on CPU (examples/rl_vision_shapes.toml)
]


@dataclass(frozen=True)
class SupportedModel:
    id: str
    modes: frozenset[str]  # {"rl", "sft"}
    experimental: bool = False

    @property
    def vision(self) -> bool:
        return "-VL-" in self.id or self.id.endswith("-vl")  # Qwen3-VL-*, posttrain/tiny-random-qwen2-vl


def _experimental(model_id: str) -> bool:
    return "235B" in model_id or "480B" in model_id or "Thinking-2507" in model_id


SUPPORTED_MODELS: dict[str, SupportedModel] = {}
for _name in _QWEN3_RL:
    _id = f"Qwen/{_name}"
    SUPPORTED_MODELS[_id.lower()] = SupportedModel(_id, frozenset({"rl", "sft"}), _experimental(_id))
for _name in _QWEN3_SFT_ONLY:
    _id = f"Qwen/{_name}"
    SUPPORTED_MODELS[_id.lower()] = SupportedModel(_id, frozenset({"sft"}), _experimental(_id))
for _id in _EXTENSION:
    SUPPORTED_MODELS[_id.lower()] = SupportedModel(_id, frozenset({"rl", "sft"}))


class ModelIdError(ValueError):
    """A model id that the allowlist or the id rules refuse; the message says what is wrong, `fix` what
    to do instead."""

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix


# What `model.source` may hold in a custom resource: a posttrain fine-tuned id (its weights are found from
# the namespace, name and uid8 at its end), an s3:// URI of weights, or an absolute path inside the image.
# The CRD carries this pattern (crdgen), so the API server refuses anything else at `kubectl apply`.
# An s3:// URI must be inside a namespace's folder or the shared models/ (weights_namespace says whose).
SOURCE_PATTERN = (
    r"^(?:(?:ft|fft|qft|rl):.+:[^.:/]+\.[^:/]+\.[0-9A-Za-z]{1,8}|s3://[^/]+/(?:jobs/[^/]+/|models/).*|/.+)$"
)
# What `model.base` may hold: a model id (org/name), an s3:// URI or an absolute path; no braces, spaces or
# other characters that would end up inside a path template or a command line.
BASE_PATTERN = r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9._-]+)*|s3://[^/\s]+/\S*|/\S+)$"
MODEL_ID_MAX_LENGTH = 512
SOURCE_FIX = (
    "use the fine_tuned_model id a posttrain job printed (rl:<base>:<namespace>.<name>.<uid8> or "
    "ft:...), or the s3:// URI of the weights; a synth backend id (ft:<base>:job_...) names weights "
    "posttrain cannot reach"
)


def experimental_enabled() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("SDK_EXPERIMENTAL", "POSTTRAIN_EXPERIMENTAL")
    )


def is_local_weights(value: str) -> bool:
    """A local folder or an object-store URI: the user's own weights, not an allowlist id."""
    return value.startswith(("/", "./", "../", "s3://", "file://"))


def is_fine_tuned_id(value: str) -> bool:
    prefix, sep, _ = value.partition(":")
    return bool(sep) and prefix.lower() in FT_PREFIXES


def lookup(model_id: str) -> SupportedModel | None:
    return SUPPORTED_MODELS.get(model_id.strip().lower())


def normalize_base(model_id: str, mode: str) -> str:
    """The canonical spelling of an allowlisted base id usable for `mode` ("rl" or "sft")."""
    model_id = model_id.strip()
    if is_local_weights(model_id):
        return model_id
    if is_fine_tuned_id(model_id):
        raise ModelIdError(
            f"{model_id!r} is a fine-tuned model id; only model.source may name one (model.base takes a base model)"
        )
    model = lookup(model_id)
    if model is None:
        raise ModelIdError(
            f"unsupported model {model_id!r}; supported for {mode}: e.g. Qwen/Qwen3-4B, "
            "HuggingFaceTB/SmolLM2-135M-Instruct (see posttrain.api.model_ids.SUPPORTED_MODELS)"
        )
    if mode not in model.modes:
        raise ModelIdError(f"{model.id} supports {', '.join(sorted(model.modes))} training only, not {mode}")
    if model.experimental and not experimental_enabled():
        raise ModelIdError(f"{model.id} is experimental; set SDK_EXPERIMENTAL=1 to use it")
    return model.id


def base_of_fine_tuned(model_id: str) -> str:
    """The base a fine-tuned id was trained from: the first ':'-separated run of segments naming a known
    base (synth scans the segments the same way). Raises ModelIdError when there is none."""
    if not is_fine_tuned_id(model_id):
        raise ModelIdError(
            f"{model_id!r} is not a fine-tuned model id (expected ft:/fft:/qft:/rl:<base>:...)"
        )
    segments = model_id.split(":")[1:]
    for start in range(len(segments)):
        for end in range(len(segments), start, -1):
            candidate = ":".join(segments[start:end])
            model = lookup(candidate)
            if model is not None:
                return model.id
    raise ModelIdError(
        f"fine-tuned id {model_id!r} names no known base model; use the id an earlier job printed, "
        "e.g. rl:Qwen/Qwen3-4B:<namespace>.<name>.<uid8>"
    )


def normalize_source(model_id: str, mode: str) -> str:
    """Check a model.source: a fine-tuned id containing a known base usable for `mode`; returned with the
    base segment spelled canonically."""
    model_id = model_id.strip()
    if model_id.startswith("s3://"):
        weights_namespace(model_id)  # inside a namespace's folder (or models/), whatever the bucket
    if is_local_weights(model_id):
        return model_id
    if not is_fine_tuned_id(model_id):
        raise ModelIdError(
            f"model.source {model_id!r} is not a fine-tuned id (ft:/fft:/qft:/rl:<base>:...); "
            "a base model goes in model.base"
        )
    base = base_of_fine_tuned(model_id)
    normalize_base(base, mode)
    prefix, _, rest = model_id.partition(":")
    pattern = re.compile(re.escape(base), re.IGNORECASE)
    normalized = f"{prefix.lower()}:{pattern.sub(base, rest, count=1)}"
    if not is_resolvable_source(normalized):
        raise ModelIdError(
            f"{model_id!r} is not a posttrain fine-tuned id: posttrain finds a job's weights "
            "from the <namespace>.<name>.<uid8> at the end of the id",
            fix=SOURCE_FIX,
        )
    return normalized


def is_resolvable_source(value: str) -> bool:
    """Whether posttrain can find the weights `value` names (the CRD's pattern for model.source)."""
    return len(value) <= MODEL_ID_MAX_LENGTH and re.fullmatch(SOURCE_PATTERN, value) is not None


# ------------------------------------------------------------------------------ posttrain's own ids


def uid8(uid: str) -> str:
    """First 8 characters of a Kubernetes uid without dashes."""
    return uid.replace("-", "")[:8]


def fine_tuned_model_id(kind_prefix: str, base: str, namespace: str, name: str, uid: str) -> str:
    """`rl:<base>:<ns>.<name>.<uid8>` (kind_prefix "rl") or `ft:...` (SFT)."""
    if kind_prefix not in FT_PREFIXES:
        raise ValueError(f"kind_prefix must be one of {FT_PREFIXES}, not {kind_prefix!r}")
    return f"{kind_prefix}:{base}:{namespace}.{name}.{uid8(uid)}"


def namespace_prefix(namespace: str) -> str:
    """A namespace's folder of the bucket: its jobs read and write only under it (docs/storage.md)."""
    return f"jobs/{namespace}/"


def job_artifact_prefix(namespace: str, name: str, uid: str) -> str:
    """Where a job's artifacts live in the bucket: `jobs/<ns>/<name>-<uid8>/`."""
    return f"{namespace_prefix(namespace)}{name}-{uid8(uid)}/"


@dataclass(frozen=True)
class FineTunedId:
    prefix: str
    base: str
    namespace: str
    name: str
    uid8: str

    def __str__(self) -> str:
        return f"{self.prefix}:{self.base}:{self.namespace}.{self.name}.{self.uid8}"


_TAIL = re.compile(r"^(?P<ns>[^.:/]+)\.(?P<name>[^:/]+)\.(?P<uid8>[0-9A-Za-z]{1,8})$")


def parse_fine_tuned_id(model_id: str) -> FineTunedId:
    """Parse a posttrain fine-tuned id `<prefix>:<base>:<ns>.<name>.<uid8>`; ModelIdError if it is not one
    (a namespace has no dots, so the name is everything between the first and the last dot)."""
    prefix, sep, rest = model_id.partition(":")
    base, sep2, tail = rest.rpartition(":")
    match = _TAIL.match(tail) if sep and sep2 else None
    if prefix.lower() not in FT_PREFIXES or not base or match is None:
        raise ModelIdError(
            f"{model_id!r} is not a posttrain fine-tuned model id (<ft|rl>:<base>:<namespace>.<name>.<uid8>)",
            fix=SOURCE_FIX,
        )
    return FineTunedId(prefix.lower(), base, match["ns"], match["name"], match["uid8"])


def resolve_model_source(model_id: str, bucket: str) -> str:
    """The S3 URI of the final/ folder of the job that produced `model_id`."""
    if model_id.startswith("s3://"):
        return model_id
    parsed = parse_fine_tuned_id(model_id)
    return f"s3://{bucket}/{job_artifact_prefix(parsed.namespace, parsed.name, parsed.uid8)}final/"


def source_weights(source: str, bucket: str) -> tuple[str, str]:
    """(base model id, where the weights are) of a model.source: a posttrain fine-tuned id is its job's
    final/ folder in `bucket`, trained from the base it names; an s3:// URI or an absolute path is its own
    base. ModelIdError for anything else."""
    if is_fine_tuned_id(source):
        return parse_fine_tuned_id(source).base, resolve_model_source(source, bucket)
    if source.startswith(("s3://", "/")):
        return source, source
    raise ModelIdError(
        f"{source!r} names no weights posttrain can find",
        fix="use a posttrain fine-tuned id (rl:<base>:<namespace>.<name>.<uid8>) or an s3:// URI",
    )


# ------------------------------------------------------------------------ whose folder weights are in

SHARED_MODEL_PREFIX = "models/"  # base models in the bucket: every namespace reads them (docs/storage.md)
SHARE_WITH_EVERY_NAMESPACE = "*"
SHARING_FIX = (
    "train from a model of this namespace; the cluster admin lets a namespace use another's models with "
    "the operator setting POSTTRAIN_SHARED_MODELS (docs/storage.md)"
)


def weights_namespace(value: str, bucket: str | None = None) -> str | None:
    """The namespace whose folder of `bucket` weights named by `value` are in: the <namespace> of a
    posttrain fine-tuned id, or of an s3:// URI under jobs/<namespace>/. None for weights every namespace
    may read (a path in the image, a model id, the shared models/ folder). ModelIdError for an s3:// URI
    anywhere else (another bucket, or a key outside jobs/<namespace>/ and models/), and for keys with
    empty, "." or ".." segments (a store may normalise them into another folder). bucket None: the URI's
    own (what the CLI can check without knowing the operator's bucket)."""
    if is_fine_tuned_id(value):
        return parse_fine_tuned_id(value).namespace
    if not value.startswith("s3://"):
        return None
    uri_bucket, _, key = value[len("s3://") :].partition("/")
    bucket = uri_bucket if bucket is None else bucket
    segments = key.split("/")
    if any(s in ("", ".", "..") for s in segments[:-1]) or segments[-1] in (".", ".."):
        raise ModelIdError(f"{value!r} has an empty, '.' or '..' folder in its key", fix="name the folder plainly")
    if uri_bucket == bucket and key.startswith(SHARED_MODEL_PREFIX):
        return None
    if uri_bucket != bucket or len(segments) < 3 or segments[0] != "jobs":
        raise ModelIdError(
            f"{value!r} is outside this namespace's folder of object storage (s3://{bucket}/jobs/<namespace>/)",
            fix="use weights under the namespace's folder, e.g. the fine_tuned_model id of one of its jobs",
        )
    return segments[1]


def shares_models(owner: str, reader: str, shared: dict[str, list[str]]) -> bool:
    """Whether namespace `owner` lets namespace `reader` train from its models: shared maps an owner to the
    namespaces it shares with ("*": every namespace). A namespace always reads its own."""
    allowed = shared.get(owner, [])
    return owner == reader or reader in allowed or SHARE_WITH_EVERY_NAMESPACE in allowed


def check_weights_access(value: str, field: str, namespace: str, bucket: str, shared: dict[str, list[str]]) -> None:
    """ModelIdError when a job of `namespace` may not read the weights `value` names (field: spec path)."""
    owner = weights_namespace(value, bucket)
    if owner is not None and not shares_models(owner, namespace, shared):
        raise ModelIdError(
            f"{field} {value!r} is a model of namespace {owner!r}, which does not share its models with "
            f"namespace {namespace!r}",
            fix=SHARING_FIX,
        )
