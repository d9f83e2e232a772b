"""Keep secrets out of files, logs and W&B: redact secret-looking keys, secret env values and secret overrides."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
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


def _override_key(line: str) -> str | None:
    """The dotted key of a Hydra override line (`+a.b_token=x` -> `a.b_token`), or None for a bare group."""
    key, sep, _ = line.partition("=")
    return key.lstrip("+~").split("@")[0] if sep else None


def is_secret_override(line: str) -> bool:
    """Whether a Hydra override line sets a secret-named key (its last dotted component looks secret)."""
    key = _override_key(line)
    return key is not None and is_secret_name(key.split(".")[-1])


def override_secrets(overrides: Iterable[str]) -> dict[str, set[str]]:
    """`{key: values}` given to secret-named keys in Hydra override lines (each value of a sweep, and the raw text)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    found: dict[str, set[str]] = {}
    for line in overrides:
        if not is_secret_override(line):
            continue
        key, _, raw = line.partition("=")
        values = {raw}
        try:
            override = parser.parse_override(line)
            if override.is_sweep_override():
                values |= {str(v) for v in override.sweep_string_iterator()}
            else:
                values.add(str(override.value()))
        except Exception:  # not parseable: fall back on the raw text and its comma-separated parts
            values |= set(raw.split(","))
        found.setdefault(key, set()).update(v for v in values if v)
    return found


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Override lines with the value of every secret-named key replaced by `***`."""
    return [f"{line.partition('=')[0]}={REDACTED}" if is_secret_override(line) else line for line in overrides]


class Redactor:
    """Replaces secrets in text and nested values: env secret values, and the values of secret-named overrides.

    A `key=value` pair of a secret override is redacted wherever it appears (override_dirname, launch lines);
    a bare value only when it is at least `MIN_BARE` characters long (shorter ones would hit ordinary text).
    """

    MIN_BARE = 4

    def __init__(self, overrides: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> None:
        pairs = override_secrets(list(overrides))
        self.pairs = {(k, v) for k, values in pairs.items() for v in values}
        self.values = {v for _, v in self.pairs if len(v) >= self.MIN_BARE} | secret_values(environ)

    def __bool__(self) -> bool:
        return bool(self.pairs or self.values)

    def text(self, text: str) -> str:
        for key, value in sorted(self.pairs, key=lambda p: -len(p[1])):
            text = text.replace(f"{key}={value}", f"{key}={REDACTED}")
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text

    def value(self, value: Any) -> Any:
        """`redact` with these secrets, plus override lines redacted by key."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, Mapping):
            return {
                k: REDACTED
                if isinstance(k, str) and is_secret_name(k) and value[k] not in (None, "")
                else self.value(v)
                for k, v in value.items()
            }
        if isinstance(value, (list, tuple)):
            items = [redact_overrides([v])[0] if isinstance(v, str) else v for v in value]
            return type(value)(self.value(v) for v in items)
        return value

    def argv(self, argv: Sequence[str]) -> list[str]:
        """A command line with secret override values and env secret values replaced."""
        return [self.text(arg) for arg in redact_overrides(argv)]
