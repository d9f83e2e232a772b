"""Normalized generation parameters and the merge rule for parameters lowered by output controls."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_MAX_NEW_TOKENS = 256
SEED_SCOPES = ("item", "dispatch")
# How a seeded sampling call applies its seed: "dispatch" seeds the whole call once and decodes it in one pass;
# "item" derives one seed per row and decodes the rows one at a time (reproducible per row).
DEFAULT_SEED_SCOPE = "dispatch"

# Names the pipeline owns in `generate(**gen_kwargs)`; everything else lands in `extra` (passed through on
# Hugging Face, refused by engine backends).
_KNOWN = (
    "max_new_tokens",
    "min_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "do_sample",
    "n",
    "num_return_sequences",
    "repetition_penalty",
    "seed",
    "seed_scope",
    "stop_strings",
    "stop_token_ids",
)


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """One call's decoding parameters, independent of the backend."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    min_new_tokens: int | None = None
    greedy: bool = True
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    repetition_penalty: float | None = None
    n: int = 1
    seed: int | None = None
    seed_scope: Literal["item", "dispatch"] = DEFAULT_SEED_SCOPE
    stop_strings: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_kwargs(cls, **gen_kwargs: Any) -> GenerationParams:
        """Normalize `generate()` kwargs; `do_sample` sets `greedy`, `num_return_sequences` is an alias of `n`."""
        kw = dict(gen_kwargs)
        extra = {k: kw.pop(k) for k in list(kw) if k not in _KNOWN}
        if "num_return_sequences" in kw:
            alias = kw.pop("num_return_sequences")
            if "n" in kw and kw["n"] != alias:
                raise ValueError(f"n={kw['n']} and num_return_sequences={alias} disagree; pass only n.")
            kw["n"] = alias
        do_sample = kw.pop("do_sample", None)
        if do_sample is None:
            do_sample = kw.get("temperature") not in (None, 0, 0.0)
        params = cls(
            max_new_tokens=int(kw.pop("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)),
            min_new_tokens=_opt(int, kw.pop("min_new_tokens", None)),
            greedy=not bool(do_sample),
            temperature=_opt(float, kw.pop("temperature", None)),
            top_p=_opt(float, kw.pop("top_p", None)),
            top_k=_opt(int, kw.pop("top_k", None)),
            repetition_penalty=_opt(float, kw.pop("repetition_penalty", None)),
            n=int(kw.pop("n", 1) or 1),
            seed=_opt(int, kw.pop("seed", None)),
            seed_scope=kw.pop("seed_scope", None) or DEFAULT_SEED_SCOPE,
            stop_strings=_as_tuple(kw.pop("stop_strings", None), str, "stop_strings"),
            stop_token_ids=_as_tuple(kw.pop("stop_token_ids", None), int, "stop_token_ids"),
            extra=extra,
        )
        params.validate()
        return params

    def validate(self) -> None:
        """Raise ValueError naming the field when a value is out of range."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1; got {self.max_new_tokens}.")
        if self.n < 1:
            raise ValueError(f"n must be >= 1; got {self.n}.")
        if self.seed_scope not in SEED_SCOPES:
            raise ValueError(f"seed_scope must be one of {SEED_SCOPES}; got {self.seed_scope!r}.")
        if self.temperature is not None and self.temperature < 0:
            raise ValueError(f"temperature must be >= 0; got {self.temperature}.")

    def replace(self, **changes: Any) -> GenerationParams:
        """A copy with `changes` applied."""
        return dataclasses.replace(self, **changes)

    def merge_lowered(self, lowered: Mapping[str, Any]) -> GenerationParams:
        """Merge parameters an output control lowered: stops union, `max_new_tokens` min, `min_new_tokens` max."""
        changes: dict[str, Any] = {}
        for key, value in lowered.items():
            if value is None:
                continue
            if key == "stop_strings":
                merged = self.stop_strings + tuple(s for s in value if s not in self.stop_strings)
                changes["stop_strings"] = merged
            elif key == "stop_token_ids":
                changes["stop_token_ids"] = self.stop_token_ids + tuple(
                    int(t) for t in value if int(t) not in self.stop_token_ids
                )
            elif key == "max_new_tokens":
                changes["max_new_tokens"] = min(self.max_new_tokens, int(value))
            elif key == "min_new_tokens":
                changes["min_new_tokens"] = max(self.min_new_tokens or 0, int(value))
            else:
                raise ValueError(
                    f"An output control lowered {key!r}; only stop_strings, stop_token_ids, max_new_tokens "
                    "and min_new_tokens can be lowered into generation params."
                )
        return self.replace(**changes) if changes else self


def _opt(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


def _as_tuple(value: Any, kind: type, name: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        value = [value]
    try:
        return tuple(kind(v) for v in value)
    except (TypeError, ValueError) as error:
        raise TypeError(f"{name} must be a sequence of {kind.__name__}; got {value!r}.") from error
