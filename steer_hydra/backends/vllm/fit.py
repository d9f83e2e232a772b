"""Vectors to fit for an engine backend: fitted on the Hugging Face model of the engine's checkpoint, cached on disk.

A layer-vector control given data instead of a vector (CAA with `data=`, ActAdd with a prompt pair:
`steering.needs_fit`) needs hidden states, which a vLLM engine does not expose. `fitted_for_engine` loads the same
checkpoint with transformers (on the GPU when there is one, else the CPU), runs the control's own fit there, and
releases that model before the engine starts (`TokenEngineBackend.ready`); `fit_vectors` fits many controls on one
load (the app fits a run's or sweep's vectors so before any engine or server starts: `app.prefit`). The vector is
cached under `<cache_dir()>/vectors/<key>.safetensors` (`vector_path`), the key being a digest of the fit's
identity: the control and the arguments its vector depends on (`LayerVectorControl.fit_identity`), the checkpoint
(its folder and the size and modification time of its weight and config files) and the dtype and device kind of
the fit. The jobs of a sweep fit once; a changed checkpoint or fit argument fits again.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from steer_hydra.core import resident
from steer_hydra.core.identity import canonical_json
from steer_hydra.core.source import checkpoint_dtype, checkpoint_files
from steer_hydra.models.loading import model_construction
from steer_hydra.models.references import cache_dir

logger = logging.getLogger(__name__)


def fit_key(control: Any, model_path: str, *, dtype: torch.dtype, device: str) -> str:
    """The digest that names a fitted vector in the cache (see the module docstring)."""
    payload = {
        "fit": control.fit_identity(),
        "checkpoint": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "files": checkpoint_files(model_path),
        "dtype": str(dtype),
        "device": device,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:32]


def vector_path(control: Any, model_path: str, *, dtype: Any = None) -> Path:
    """Where the vector `control` fits on `model_path` (in `dtype`, as `fitted_for_engine` takes it) is cached."""
    key = fit_key(control, model_path, dtype=checkpoint_dtype(dtype), device=resident.checkpoint_device())
    return cache_dir() / "vectors" / f"{key}.safetensors"


def _cached(control: Any, path: Path) -> Any:
    """The vector cached at `path`, or None when there is none or it is unreadable (it is fitted again)."""
    if not path.is_file():
        return None
    try:
        return control.load_vector(path)
    except (OSError, ValueError) as error:
        logger.warning("Cached %s vector %s is unreadable (%s); fitting it again.", type(control).__name__, path, error)
        return None


def fitted_for_engine(
    control: Any, model_path: str, tokenizer: Any, *, trust_remote_code: bool = False, dtype: Any = None
) -> Any:
    """The vector `control` fits on `model_path`'s Hugging Face model (in `dtype`: the model group's, a name or a
    torch dtype; default float32): from the cache, or fitted now and cached."""
    path = vector_path(control, model_path, dtype=dtype)
    vector = _cached(control, path)
    if vector is not None:
        logger.info("%s vector reused from %s (fitted earlier on this checkpoint)", type(control).__name__, path)
        return vector
    return _fit({path: control}, model_path, tokenizer, trust_remote_code=trust_remote_code, dtype=dtype)[path]


def fit_vectors(
    controls: Iterable[Any], model_path: str, tokenizer: Any, *, trust_remote_code: bool = False, dtype: Any = None
) -> list[Path]:
    """Fit and cache, on one load of `model_path`'s Hugging Face model, the vector of every control in `controls`
    not cached yet (one fit per cache key: controls fitting the same vector share it); returns the paths fitted."""
    todo: dict[Path, Any] = {}
    for control in controls:
        path = vector_path(control, model_path, dtype=dtype)
        if path not in todo and _cached(control, path) is None:
            todo[path] = control
    if todo:
        _fit(todo, model_path, tokenizer, trust_remote_code=trust_remote_code, dtype=dtype)
    return list(todo)


def _fit(
    todo: Mapping[Path, Any], model_path: str, tokenizer: Any, *, trust_remote_code: bool, dtype: Any
) -> dict[Path, Any]:
    """Each control's vector fitted on one Hugging Face load of `model_path`, cached at its path. Each control is
    steered and released in turn (release restores the model bit-exactly, so a fit never sees another's)."""

    def fit_all(model: torch.nn.Module) -> dict[Path, Any]:
        vectors = {}
        for number, (path, control) in enumerate(todo.items(), 1):
            name = type(control).__name__
            control.steer(model, tokenizer=tokenizer, backend="huggingface")
            vector = control.fitted_vector
            control.cleanup()
            if vector is None:
                raise RuntimeError(f"{name} fitted no vector on {model_path}.")
            _store(vector, path)
            vectors[path] = vector
            logger.info("%s vector %d/%d cached at %s", name, number, len(todo), path)
        return vectors

    return resident.on_checkpoint_model(
        model_path,
        fit_all,
        purpose=f"Fitting {len(todo)} vector(s)",
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        guard=model_construction(),  # transformers' loading patches process state: one load at a time
    )


def _store(vector: Any, path: Path) -> None:
    """Write `vector` to `path` atomically: a concurrent job reads the old file or the new one, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    vector.save(tmp)
    os.replace(tmp, path)
