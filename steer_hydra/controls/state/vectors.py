"""`SteeringVector`: a steering tensor with its layer and metadata, saved and loaded as safetensors, content-hashed.

The content hash is a sha256 over a canonical byte form (format tag, layer, dtype, shape, the tensor's bytes in
C order on the CPU), so the same vector hashes the same wherever it was fitted or loaded; metadata (method,
source model, pair count...) is kept with the vector but is not part of its identity.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

FORMAT = "steer_hydra.steering_vector/1"
_TENSOR_KEY = "vector"


@dataclass(frozen=True, eq=False)
class SteeringVector:
    """A steering direction (`[hidden]`) or positional steering block (`[positions, hidden]`) for one layer.

    Attributes:
        tensor: the vector; kept as given (dtype, values), moved to the CPU and detached.
        layer: the decoder layer it was fitted at (None when unknown).
        metadata: JSON-serialisable provenance (fitting method, model, number of pairs...).
    """

    tensor: torch.Tensor
    layer: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, torch.Tensor):
            raise TypeError(f"SteeringVector.tensor must be a torch.Tensor; got {type(self.tensor).__name__}.")
        if self.tensor.dim() not in (1, 2) or self.tensor.numel() == 0:
            raise ValueError(
                f"SteeringVector.tensor must be 1-D [hidden] or 2-D [positions, hidden] and non-empty; "
                f"got shape {tuple(self.tensor.shape)}."
            )
        if not (self.tensor.is_floating_point() and torch.isfinite(self.tensor).all()):
            raise ValueError("SteeringVector.tensor must hold finite floating-point values.")
        if self.layer is not None and (isinstance(self.layer, bool) or not isinstance(self.layer, int)):
            raise TypeError(f"SteeringVector.layer must be an int or None; got {self.layer!r}.")
        try:
            json.dumps(dict(self.metadata), sort_keys=True)
        except TypeError as error:
            raise TypeError(f"SteeringVector.metadata must be JSON-serialisable: {error}.") from error
        object.__setattr__(self, "tensor", self.tensor.detach().cpu().contiguous())
        object.__setattr__(self, "metadata", dict(self.metadata))

    @property
    def content_hash(self) -> str:
        """sha256 (hex) of the canonical bytes: format tag, layer, dtype, shape and tensor data."""
        digest = hashlib.sha256()
        header = {"format": FORMAT, "layer": self.layer, "dtype": str(self.tensor.dtype), "shape": list(self.shape)}
        digest.update(json.dumps(header, sort_keys=True).encode())
        digest.update(self.tensor.view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def canonical_form(self) -> dict[str, Any]:
        """Identity for configuration digests (`canonical_value`): the content hash and the layer."""
        return {"steering_vector": self.content_hash, "layer": self.layer}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the vector as a safetensors file (tensor plus layer, metadata and content hash); return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = {
            "format": FORMAT,
            "layer": "" if self.layer is None else str(self.layer),
            "metadata": json.dumps(self.metadata, sort_keys=True),
            "content_hash": self.content_hash,
        }
        save_file({_TENSOR_KEY: self.tensor}, str(path), metadata=header)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> SteeringVector:
        """Read a file written by `save()`; raise ValueError when it is not one or its content hash disagrees."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"No steering vector file at {str(path)!r}; save one with SteeringVector.save().")
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
            names = list(handle.keys())
            if header.get("format") != FORMAT or _TENSOR_KEY not in names:
                raise ValueError(
                    f"{str(path)!r} is not a steer_hydra steering vector (format {header.get('format')!r}); "
                    f"write it with SteeringVector.save()."
                )
            tensor = handle.get_tensor(_TENSOR_KEY)
        layer = int(header["layer"]) if header.get("layer") else None
        vector = cls(tensor, layer, json.loads(header.get("metadata") or "{}"))
        stored = header.get("content_hash")
        if stored and stored != vector.content_hash:
            raise ValueError(f"{str(path)!r} is corrupt: its content hash {stored} does not match its data.")
        return vector

    @classmethod
    def coerce(cls, value: SteeringVector | torch.Tensor | str | os.PathLike, *, field_name: str) -> SteeringVector:
        """Accept a `SteeringVector`, a tensor, or a path to a saved vector."""
        if isinstance(value, SteeringVector):
            return value
        if isinstance(value, torch.Tensor):
            return cls(value)
        if isinstance(value, (str, os.PathLike)):
            return cls.load(value)
        raise TypeError(
            f"{field_name} must be a SteeringVector, a torch.Tensor or a path to a saved vector; "
            f"got {type(value).__name__}."
        )

    def __repr__(self) -> str:
        return f"SteeringVector(shape={self.shape}, layer={self.layer}, hash={self.content_hash[:12]})"
