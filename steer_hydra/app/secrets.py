"""Keep secrets out of logged config and provenance: redact secret-looking keys and values of secret env vars."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"
_TOKENIZER_FIELD = re.compile(r"(pad|eos|bos|unk|sep|cls|mask)_token$")
_SECRET_NAME = re.compile(
    r"(api[_-]?key|secret|password|passwd|access[_-]?key|private[_-]?key|credential|(^|[_-])token$)", re.IGNORECASE
)


def is_secret_name(name: str) -> bool:
    """Whether a key or env var name looks like it holds a secret (`HF_TOKEN`, `WANDB_API_KEY`, `api_key`...)."""
    lowered = name.lower()
    if lowered.endswith(("_env", "_var")) or _TOKENIZER_FIELD.search(lowered):
        return False
    return bool(_SECRET_NAME.search(name))


def secret_values(environ: Mapping[str, str] | None = None) -> set[str]:
    """Values of environment variables whose names look secret (long enough to be worth matching)."""
    environ = os.environ if environ is None else environ
    return {v for k, v in environ.items() if is_secret_name(k) and len(v) >= 6}


def redact(value: Any, *, secrets: set[str] | None = None) -> Any:
    """A copy of `value` with secret-named keys and any occurrence of a secret env value replaced by `***`."""
    secrets = secret_values() if secrets is None else secrets
    if isinstance(value, Mapping):
        return {
            k: REDACTED
            if isinstance(k, str) and is_secret_name(k) and value[k] not in (None, "")
            else redact(v, secrets=secrets)
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v, secrets=secrets) for v in value)
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    return value
