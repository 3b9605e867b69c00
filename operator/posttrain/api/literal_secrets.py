"""Pure: keys of a TOML config that hold a literal secret (an API key, a token, a password) instead of a
reference to one. A config travels whole into the custom resource (spec.originalToml), into git and into
the job's files: a literal key there is a leaked key. `posttrain convert`, `validate` and `train` refuse
it, naming file:line; the key belongs in a Secret the job names (e.g. [judge.api_key_secret_ref],
--api-key-secret) or, for a local run, in an environment variable named by a `*_env` key.

A key is secret-looking when its words (split at `_`, `-`, `.`) hold password, passwd, passphrase, secret,
token, credential(s), authorization, apikey, or api/private/secret followed by key; and it is a reference,
not a secret, when its last word says so (`api_key_env`, `api_key_secret_ref`, `token_file`, `secret_name`).
Tokenizer special tokens (pad_token, eos_token, ...) are text, not secrets. Only non-empty strings count.
The providers' usual names (KNOWN_SECRET_NAMES: OPENAI_KEY, ANTHROPIC_API_KEY, HF_TOKEN, WANDB_API_KEY,
AWS_ACCESS_KEY_ID, access_key_id, secret_access_key, ...) and `<provider>_key` always count."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

SECRET_WORDS = frozenset(
    {"password", "passwd", "passphrase", "secret", "token", "credential", "credentials", "authorization",
     "apikey", "api-key", "bearer"}  # fmt: skip
)
KEY_PAIRS = frozenset({("api", "key"), ("private", "key"), ("secret", "key"), ("access", "token")})
REFERENCE_WORDS = frozenset({"env", "ref", "name", "names", "file", "path", "var", "variable", "id", "url"})
TEXT_TOKENS = frozenset(
    {"pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "stop", "start", "end", "image", "video",
     "audio", "think", "tool", "placeholder"}  # fmt: skip
)


def _words(key: str) -> list[str]:
    # camelCase too (apiKey, accessToken): split before an upper-case letter
    return [w for w in re.split(r"[_\-.\s]+|(?<=[a-z0-9])(?=[A-Z])", key) if w]


# The providers' usual names for their keys, whatever the word rules say (access_key_id ends in "id", a
# reference word elsewhere; openai_key has no "api"): matched whole, case-insensitively, `-` as `_`.
KNOWN_SECRET_NAMES = frozenset(
    {"openai_key", "openai_api_key", "anthropic_api_key", "anthropic_key", "groq_api_key", "gemini_api_key",
     "google_api_key", "mistral_api_key", "cohere_api_key", "together_api_key", "fireworks_api_key",
     "hf_token", "huggingface_token", "hugging_face_hub_token", "huggingface_hub_token", "wandb_api_key",
     "aws_access_key_id", "access_key_id", "aws_secret_access_key", "secret_access_key", "aws_session_token",
     "s3_access_key_id", "s3_secret_access_key", "environment_api_key", "synth_api_key", "password"}  # fmt: skip
)
# <provider>_key / <provider>Key: a provider's name before "key" is its API key.
PROVIDERS = frozenset(
    {"openai", "anthropic", "groq", "gemini", "google", "mistral", "cohere", "together", "fireworks", "hf",
     "huggingface", "wandb", "synth", "deepseek", "xai", "openrouter", "azure"}  # fmt: skip
)


def is_secret_key(key: str) -> bool:
    """Whether a key's name says it holds a secret value (see the module's docstring)."""
    if "_".join(w.lower() for w in _words(key)) in KNOWN_SECRET_NAMES:
        return True
    words = [w.lower() for w in _words(key)]
    if not words or words[-1] in REFERENCE_WORDS:
        return False
    if len(words) >= 2 and words[-1] == "key" and words[-2] in PROVIDERS:
        return True
    if len(words) >= 2 and words[-1] == "token" and words[-2] in TEXT_TOKENS:
        return False
    if any(w in SECRET_WORDS for w in words):
        return True
    return any(pair in KEY_PAIRS for pair in zip(words, words[1:], strict=False))


def literal_secrets(raw: Any, path: str = "") -> Iterator[str]:
    """Dotted paths (array indices left out, as toml_locate wants them) of every secret-looking key with a
    non-empty string value in a parsed TOML document."""
    if isinstance(raw, dict):
        for key, value in raw.items():
            child = f"{path}.{key}" if path else str(key)
            if isinstance(value, str) and value.strip() and is_secret_key(str(key)):
                yield child
            elif isinstance(value, dict | list):
                yield from literal_secrets(value, child)
    elif isinstance(raw, list):
        for item in raw:
            yield from literal_secrets(item, path)
