"""Keep secrets out of files, logs and W&B: redact secret-looking keys, secret env values, secret overrides and the
password of a URL (`scheme://user:password@host`, shown as `scheme://user:***@host`) wherever text is redacted.

Also moves the value of a secret-named override into an environment variable (`move_to_environment`), so a
launcher that pickles or records the overrides (submitit, SLURM) stores only `${oc.env:...}`.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

REDACTED = "***"
SECRET_ENV_PREFIX = "STEER_HYDRA_SECRET_"
_ENV_REFERENCE = re.compile(r"\$\{oc\.env:([^,}]+)")
_TOKENIZER_FIELD = re.compile(r"(pad|eos|bos|unk|sep|cls|mask)_token$")
# `scheme://user:password@` (also as Hydra writes an override value, with its colons escaped: `http\://u\:p@`)
_URL_CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*\\?://[^\s:/@\\'\"]*\\?:)(?P<password>[^\s/@'\"]+)@")
_SECRET_NAME = re.compile(
    r"(api[_-]?key|secret|password|passwd|access[_-]?key|private[_-]?key|credential|(^|[_-])token$)", re.IGNORECASE
)


def is_secret_name(name: str) -> bool:
    """Whether a key or env var name looks like it holds a secret (`HF_TOKEN`, `WANDB_API_KEY`, `api_key`...)."""
    lowered = name.lower()
    if lowered.endswith(("_env", "_var")) or _TOKENIZER_FIELD.search(lowered):
        return False
    return bool(_SECRET_NAME.search(name))


def mask_url_credentials(text: str) -> str:
    """`text` with the password of every URL replaced: `http://user:pw@host` -> `http://user:***@host`."""
    if "@" not in text:
        return text
    return _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)


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
        return mask_url_credentials(value)
    return value


def _override_key(line: str) -> str | None:
    """The dotted key of a Hydra override line (`+a.b_token=x` -> `a.b_token`), or None for a bare group."""
    key, sep, _ = line.partition("=")
    return key.lstrip("+~").split("@")[0] if sep else None


def is_secret_override(line: str) -> bool:
    """Whether a Hydra override line sets a secret-named key (its last dotted component looks secret)."""
    key = _override_key(line)
    return key is not None and is_secret_name(key.split(".")[-1])


def override_secrets(overrides: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, set[str]]:
    """`{key: values}` given to secret-named keys in Hydra override lines (each value of a sweep, and the raw text).

    A value that reads the environment (`${oc.env:NAME}`) stands for that variable's value in `environ` (default
    `os.environ`); other interpolations are references, not secrets.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    environ = os.environ if environ is None else environ
    parser = OverridesParser.create()
    found: dict[str, set[str]] = {}
    for line in overrides:
        if not is_secret_override(line):
            continue
        key, _, raw = line.partition("=")
        try:
            override = parser.parse_override(line)
            parsed = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
            values = {str(getattr(v, "text", v)) for v in parsed}
        except Exception:  # not parseable: fall back on the raw text and its comma-separated parts
            values = set(raw.split(","))
        references = {v for v in values if "${" in v}
        values -= references
        values |= {environ[name] for v in references for name in _ENV_REFERENCE.findall(v) if name in environ}
        if not references:
            values.add(raw)
        found.setdefault(key, set()).update(v for v in values if v)
    return found


def redact_overrides(overrides: Iterable[str]) -> list[str]:
    """Override lines with the value of every secret-named key replaced by `***`, and every URL's password."""
    return [
        f"{line.partition('=')[0]}={REDACTED}" if is_secret_override(line) else mask_url_credentials(line)
        for line in overrides
    ]


class Redactor:
    """Replaces secrets in text and nested values: env secret values, the values of secret-named overrides, and the
    password of any URL (`mask_url_credentials`; so a redactor is never empty: a URL may come from a config file).

    A `key=value` pair of a secret override is redacted wherever it appears (override_dirname, launch lines);
    a bare value only when it is at least `MIN_BARE` characters long (shorter ones would hit ordinary text).
    """

    MIN_BARE = 4

    def __init__(self, overrides: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> None:
        pairs = override_secrets(list(overrides), environ)
        self.pairs = {(k, v) for k, values in pairs.items() for v in values}
        self.values = {v for _, v in self.pairs if len(v) >= self.MIN_BARE} | secret_values(environ)

    def __bool__(self) -> bool:
        return True  # URL passwords are masked whatever the overrides and the environment hold

    def text(self, text: str) -> str:
        for key, value in sorted(self.pairs, key=lambda p: -len(p[1])):
            text = text.replace(f"{key}={value}", f"{key}={REDACTED}")
        for value in sorted(self.values, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return mask_url_credentials(text)

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

    def exception(self, error: BaseException | None) -> None:
        """Replace secrets in the string arguments (and notes) of `error` and of the exceptions it chains, in place,
        so a traceback or a log that records it later shows none."""
        pending, seen = [error], set()
        while pending:
            each = pending.pop()
            if each is None or id(each) in seen:
                continue
            seen.add(id(each))
            args = tuple(self.text(a) if isinstance(a, str) else a for a in each.args)
            if args != each.args:
                with contextlib.suppress(Exception):  # an exception type whose args cannot be set
                    each.args = args
            notes = getattr(each, "__notes__", None)
            if isinstance(notes, list):
                notes[:] = [self.text(n) if isinstance(n, str) else n for n in notes]
            pending += [each.__cause__, each.__context__]


@dataclass(frozen=True)
class MovedSecret:
    """A secret-named override whose value moved to the environment.

    Attributes:
        key: the dotted config key (`api_token`, `backend.options.api_key`).
        line: the override that reads the environment instead, in Hydra's escaped form
            (`+api_token=$\\{oc.env\\:STEER_HYDRA_SECRET_API_TOKEN\\}`), so the overrides list holds no interpolation.
        reference: the config value the job resolves (`${oc.env:STEER_HYDRA_SECRET_API_TOKEN}`); None for a sweep.
        environ: the environment variables that hold the values (one per value of a sweep).
    """

    key: str
    line: str
    reference: str | None
    environ: dict[str, str] = field(repr=False)


def _env_name(key: str, taken: set[str]) -> str:
    base = SECRET_ENV_PREFIX + re.sub(r"[^A-Za-z0-9]", "_", key).upper()
    name, n = base, 1
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


def _reference(name: str, value: Any) -> tuple[str, str] | None:
    """`(config value that reads env var name, the variable's text)` for one parsed override value, or None."""
    value = getattr(value, "text", value)  # a quoted string
    if value is None or (isinstance(value, str) and ("${" in value or value == "")):
        return None  # nothing to hide, or already a reference
    if isinstance(value, (str, int, float, bool)):
        return "${oc.env:" + name + "}", str(value)
    from hydra.core.override_parser.types import Override

    return "${oc.decode:${oc.env:" + name + "}}", Override._get_value_element_as_str(value)  # a list or a dict


def _escaped(reference: str) -> str:
    """A config value as Hydra writes it in an override line: its interpolation escaped, inert in a config."""
    return re.sub(r"([{}:])", r"\\\1", reference)


def move_to_environment(line: str, taken: set[str]) -> MovedSecret | None:
    """The override `line` with its secret value(s) read from new environment variables, or None when `line` sets
    no secret-named key to a value (or only to interpolations). `taken` holds the variable names already used."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if not is_secret_override(line):
        return None
    parser = OverridesParser.create()
    try:
        override = parser.parse_override(line)
    except Exception:  # Hydra refuses the line itself when it composes the config
        return None
    if override.is_delete() or (override.is_sweep_override() and not override.is_discrete_sweep()):
        return None
    values = list(override.sweep_iterator()) if override.is_sweep_override() else [override.value()]
    if any(_reference("", value) is None for value in values):
        return None
    key = override.key_or_group
    sweep = override.is_sweep_override()
    names = [_env_name(f"{key}_{i}", taken) for i in range(len(values))] if sweep else [_env_name(key, taken)]
    moved = [_reference(name, value) for name, value in zip(names, values, strict=True)]
    references = [m[0] for m in moved if m is not None]
    elements = ",".join(_escaped(r) for r in references)
    new_line = f"{override.get_key_element()}={f'choice({elements})' if sweep else elements}"
    check = parser.parse_override(new_line)
    parsed = list(check.sweep_iterator()) if check.is_sweep_override() else [check.value()]
    if parsed != references:
        raise ValueError(
            f"{key}: its value cannot be handed to the jobs through the environment. Fix: export it in an "
            f"environment variable yourself and pass {override.get_key_element()}='${{oc.env:<VAR>}}'."
        )
    return MovedSecret(
        key=key,
        line=new_line,
        reference=None if sweep else references[0],
        environ={name: m[1] for name, m in zip(names, moved, strict=True) if m is not None},
    )
