"""`ModelSource`: where a pipeline's base model and tokenizer come from and how they load (one value, not a bundle).

It travels unchanged from the job's `model` config group (`ModelSource.from_config`) through `SteeringEval`,
`PipelineFactory` and `SteeringPipeline` to `Backend.load(source, model=..., tokenizer=...)`; preloaded model and
tokenizer objects travel beside it, never inside it (the source is a frozen, comparable value).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A base model reference and its loading options.

    Args:
        model_name_or_path: Hugging Face id or local path (or `steer_hydra:tiny`), loaded in `steer()`.
        tokenizer_name_or_path: defaults to the model reference.
        device_map: forwarded to `from_pretrained` (default "auto"); ignored when `device` is set.
        device: move the model there after loading (or a preloaded model).
        hf_model_kwargs: forwarded to `from_pretrained` (e.g. `attn_implementation`, `dtype`).
        trust_remote_code: for the tokenizer; give the model's through `hf_model_kwargs`.
    """

    model_name_or_path: str | None = None
    tokenizer_name_or_path: str | None = None
    device_map: Any = "auto"
    device: Any = None
    hf_model_kwargs: Mapping[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.device is not None and self.device_map not in (None, "auto"):
            raise ValueError(
                f"Pass either device={self.device!r} or device_map={self.device_map!r}, not both. "
                "Fix: drop one of them."
            )
        object.__setattr__(self, "hf_model_kwargs", dict(self.hf_model_kwargs or {}))
        object.__setattr__(self, "trust_remote_code", bool(self.trust_remote_code))

    @classmethod
    def coerce(cls, value: ModelSource | str | Mapping[str, Any] | None) -> ModelSource:
        """Accept a source, a model reference string, a mapping of the fields, or None (no model reference)."""
        if value is None:
            return cls()
        if isinstance(value, ModelSource):
            return value
        if isinstance(value, str):
            return cls(model_name_or_path=value)
        if isinstance(value, Mapping):
            return cls.from_config(value)
        raise TypeError(f"A model source must be a ModelSource, a model reference or a mapping; got {value!r}.")

    @classmethod
    def from_config(cls, model: Mapping[str, Any]) -> ModelSource:
        """The source a `model` config group describes (keys other than the fields, e.g. `name`, are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in model.items() if k in names})

    def identity(self) -> dict[str, Any]:
        """What a save_dir's protocol and cell keys record of the source: the reference and every loading option,
        the tokenizer and the device only when set (so a job that sets neither matches one written before they
        existed)."""
        identity = {
            "model_name_or_path": self.model_name_or_path,
            "hf_model_kwargs": dict(self.hf_model_kwargs),
            "device_map": self.device_map,
            "trust_remote_code": self.trust_remote_code,
        }
        optional = {"tokenizer_name_or_path": self.tokenizer_name_or_path, "device": self.device}
        return {**identity, **{key: value for key, value in optional.items() if value is not None}}

    def replace(self, **changes: Any) -> ModelSource:
        return dataclasses.replace(self, **changes)


def checkpoint_files(model_path: str) -> list[tuple[str, int, int]]:
    """`(file name, size, mtime_ns)` of a local checkpoint folder's weight and config files (`.safetensors`, `.bin`,
    `.json`), sorted by name; empty for a Hub id. What keys work done on a checkpoint (a fitted vector, a memoised
    weights digest): a rewritten file changes it."""
    from pathlib import Path

    folder = Path(model_path)
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".json"))
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def checkpoint_dtype(dtype: Any) -> Any:
    """The torch dtype a model group's `hf_model_kwargs.dtype` names (a name or a torch dtype); float32 when it is
    unset or "auto": what a checkpoint is loaded in to fit or train on it for an engine backend."""
    import torch

    value = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else (dtype or torch.float32)
    return value if isinstance(value, torch.dtype) else torch.float32
