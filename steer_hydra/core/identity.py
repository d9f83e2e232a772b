"""Identity and seeds: canonical forms, configuration digests, trial and item seeds, model fingerprints."""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import math
import types
from collections.abc import Mapping, Set
from pathlib import PurePath
from typing import Any

import numpy as np
import torch

BASELINE_CONFIG_ID = "baseline"


def canonical_value(value: Any) -> Any:
    """Return a JSON-stable form of `value`, by content.

    Python scalars stay themselves (non-finite floats as their repr); numpy scalars become their Python values;
    arrays and tensors a sha256 of dtype, shape and bytes (object arrays: their items, recursively); dataclasses
    their qualified name plus init fields; mappings are key-sorted; sets sorted; objects with `canonical_form()`
    that form. Named functions and classes are identified by qualified name, lambdas and local functions by their
    code, defaults and closure, `functools.partial` and bound methods by their parts.

    Raises:
        TypeError: for a value that has no content-based form (it would otherwise make distinct configurations
            share one id); the message names the argument path and the fix.
    """
    return _canonical(value, "value")


def _canonical(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value if type(value) in (bool, int, str) or value is None else _builtin(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else repr(float(value))
    if isinstance(value, np.generic):
        return _canonical(value.item(), path)  # numpy scalars compare like their Python values
    if isinstance(value, enum.Enum):
        return f"{type(value).__qualname__}.{value.name}"
    if isinstance(value, (PurePath, torch.dtype, torch.device, np.dtype)):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": hashlib.sha256(bytes(value)).hexdigest()}
    if isinstance(value, torch.Tensor):
        return {"__tensor__": _tensor_digest(value, path)}
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            items = [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value.reshape(-1).tolist())]
            return {"__ndarray__": "object", "shape": list(value.shape), "items": items}
        return {"__ndarray__": _array_digest(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            f.name: _canonical(getattr(value, f.name), f"{path}.{f.name}") for f in dataclasses.fields(value) if f.init
        }
        return {"__class__": _qualname(type(value)), **fields}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v, f"{path}[{k!r}]") for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (Set, frozenset)):
        items = (_canonical(v, f"{path}{{}}") for v in value)
        return sorted(items, key=lambda v: json.dumps(v, sort_keys=True))
    if isinstance(value, (list, tuple)):
        return [_canonical(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if hasattr(value, "canonical_form"):
        return _canonical(value.canonical_form(), path)
    if isinstance(value, torch.nn.Module):
        return {"__module__": _qualname(type(value)), "fingerprint": model_fingerprint(value)}
    if isinstance(value, functools.partial):
        return {
            "__partial__": _canonical(value.func, f"{path}.func"),
            "args": _canonical(value.args, f"{path}.args"),
            "keywords": _canonical(value.keywords, f"{path}.keywords"),
        }
    if isinstance(value, types.MethodType):
        return {"__method__": _qualname(value.__func__), "self": _canonical(value.__self__, f"{path}.__self__")}
    if isinstance(value, types.FunctionType):
        return _function(value, path)
    if isinstance(value, (type, types.BuiltinFunctionType)):
        return {"__callable__": _qualname(value)}
    raise TypeError(
        f"canonical_value: {path} is a {_qualname(type(value))} with no content-based canonical form, so two "
        "configurations that differ only in it would share one config_id. Fix: pass plain values (numbers, "
        "strings, lists, dicts, arrays, tensors), make it a dataclass, or give its class a canonical_form() "
        "method returning plain values that identify it."
    )


def _builtin(value: Any) -> Any:
    """A subclass of bool/int/str (e.g. `numpy.str_`, an IntEnum handled earlier) as the plain builtin value."""
    for kind in (bool, int, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _tensor_digest(value: torch.Tensor, path: str) -> str:
    if value.is_sparse or value.device.type == "meta":
        raise TypeError(
            f"canonical_value: {path} is a {'sparse' if value.is_sparse else 'meta'} tensor, which has no readable "
            "content. Fix: pass a dense tensor on a real device (e.g. tensor.to_dense().cpu())."
        )
    tensor = value.detach().cpu().contiguous()
    digest = hashlib.sha256()
    digest.update(str(tensor.dtype).encode())
    digest.update(str(tuple(tensor.shape)).encode())
    digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _array_digest(value: np.ndarray) -> str:
    array = np.ascontiguousarray(value)
    digest = hashlib.sha256()
    digest.update(array.dtype.str.encode())
    digest.update(str(array.shape).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _function(fn: types.FunctionType, path: str) -> dict[str, Any]:
    """A named module-level function by qualified name; a lambda or local function also by what it computes."""
    out: dict[str, Any] = {"__callable__": _qualname(fn)}
    if "<" not in fn.__qualname__:  # importable by name: the name is its identity
        return out
    out["code"] = _code_digest(fn.__code__)
    out["defaults"] = _canonical(list(fn.__defaults__ or ()), f"{path}.__defaults__")
    out["kwdefaults"] = _canonical(dict(fn.__kwdefaults__ or {}), f"{path}.__kwdefaults__")
    cells = zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
    out["closure"] = {name: _canonical(cell.cell_contents, f"{path}.<closure {name}>") for name, cell in cells}
    return out


def _code_digest(code: types.CodeType) -> str:
    digest = hashlib.sha256(code.co_code)
    for const in code.co_consts:
        digest.update((_code_digest(const) if isinstance(const, types.CodeType) else repr(const)).encode())
    digest.update(repr(code.co_names).encode())
    return digest.hexdigest()


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


def derive_trial_seed(seed: int, config_id: str, trial_id: int) -> int:
    """The trial seed of one (configuration, trial): the first 4 bytes (big-endian) of sha256(`seed:config:trial`),
    where `seed` is the seed the run was launched with and `trial_id` the trial index."""
    digest = hashlib.sha256(f"{seed}:{config_id}:{trial_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def derive_item_seed(request_seed: int, op: str, index: int) -> int:
    """The seed of one generated row: the first 8 bytes of sha256(`request_seed:op:index`), masked to 63 bits,
    where `request_seed` is the seed of the generate call (or of the rollout) the row belongs to."""
    digest = hashlib.sha256(f"{request_seed}:{op}:{index}".encode()).digest()
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
