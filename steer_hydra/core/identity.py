"""Identity and seeds: canonical forms, configuration digests, trial and item seeds, model fingerprints."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Mapping, Set
from pathlib import PurePath
from typing import Any

import torch

BASELINE_CONFIG_ID = "baseline"


def canonical_value(value: Any) -> Any:
    """Return a JSON-stable form of `value`.

    Tensors become a sha256 of dtype, shape and bytes; dataclasses their qualified name plus init fields;
    mappings are key-sorted; sets sorted; callables and other objects are named by their qualified name only.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (PurePath, torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest = hashlib.sha256()
        digest.update(str(tensor.dtype).encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
        return {"__tensor__": digest.hexdigest()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: canonical_value(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        return {"__class__": _qualname(type(value)), **fields}
    if isinstance(value, Mapping):
        return {str(k): canonical_value(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (Set, frozenset)):
        return sorted((canonical_value(v) for v in value), key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [canonical_value(v) for v in value]
    if hasattr(value, "canonical_form"):
        return canonical_value(value.canonical_form())
    if callable(value):
        return {"__callable__": _qualname(value)}
    return {"__object__": _qualname(type(value))}


def _qualname(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or type(obj).__qualname__
    return f"{module}.{name}" if module else name


def canonical_json(value: Any) -> str:
    """Sorted-key JSON of `canonical_value(value)`."""
    return json.dumps(canonical_value(value), sort_keys=True, separators=(",", ":"))


def config_digest(descriptor: Any) -> str:
    """First 12 hex chars of sha256 over the canonical descriptor; `baseline` for an empty descriptor."""
    if descriptor is None or (isinstance(descriptor, (list, tuple, dict)) and not descriptor):
        return BASELINE_CONFIG_ID
    return hashlib.sha256(canonical_json(descriptor).encode()).hexdigest()[:12]


def derive_trial_seed(base_seed: int, config_id: str, trial_id: int) -> int:
    """First 4 bytes (big-endian) of sha256(`base:config:trial`): one seed per (configuration, trial)."""
    digest = hashlib.sha256(f"{base_seed}:{config_id}:{trial_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def derive_item_seed(base_seed: int, op: str, index: int) -> int:
    """First 8 bytes of sha256(`base:op:index`), masked to 63 bits: one seed per generated row."""
    digest = hashlib.sha256(f"{base_seed}:{op}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def model_fingerprint(model: torch.nn.Module | None, *, hash_params_below: int = 50_000_000) -> str | None:
    """A short identity of a loaded model: its config, plus a hash of all weights when it is small.

    Hashing every weight of a multi-billion-parameter model would read gigabytes, so large models are
    identified by config, name and hub commit only.
    """
    if model is None:
        return None
    config = getattr(model, "config", None)
    payload: dict[str, Any] = {
        "class": _qualname(type(model)),
        "config": config.to_diff_dict() if config is not None and hasattr(config, "to_diff_dict") else None,
        "commit": getattr(config, "_commit_hash", None),
    }
    params = list(model.state_dict().items())
    if sum(t.numel() for _, t in params) <= hash_params_below:
        payload["weights"] = [(name, canonical_value(t)) for name, t in params]
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:16]
