"""Vectors to fit for an engine backend: fitted on the Hugging Face model of the engine's checkpoint, cached on disk.

A layer-vector control given data instead of a vector (CAA with `data=`, ActAdd with a prompt pair) needs hidden
states, which a vLLM engine does not expose. `fitted_for_engine` loads the same checkpoint with transformers (on
the GPU when there is one, else the CPU), runs the control's own fit there, and releases that model before the
engine starts (`TokenEngineBackend.ready`). The vector is cached under
`<cache_dir()>/vectors/<key>.safetensors`, the key being a digest of the fit's identity: the control and the
arguments its vector depends on (`LayerVectorControl.fit_identity`), the checkpoint (its folder and the size and
modification time of its weight and config files) and the dtype and device kind of the fit. The jobs of a sweep
fit once; a changed checkpoint or fit argument fits again.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from steer_hydra.core import resident
from steer_hydra.core.identity import canonical_json
from steer_hydra.models.loading import model_construction
from steer_hydra.models.references import cache_dir

logger = logging.getLogger(__name__)

_CHECKPOINT_FILES = ("*.safetensors", "*.bin", "*.json")


def _fit_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def checkpoint_identity(model_path: str) -> list[tuple[str, int, int]]:
    """`(file name, size, mtime_ns)` of a local checkpoint's weight and config files (empty for a Hub id)."""
    folder = Path(model_path)
    if not folder.is_dir():
        return []
    files = sorted({p for pattern in _CHECKPOINT_FILES for p in folder.glob(pattern)})
    return [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def fit_key(control: Any, model_path: str, *, dtype: torch.dtype, device: str) -> str:
    """The digest that names a fitted vector in the cache (see the module docstring)."""
    payload = {
        "fit": control.fit_identity(),
        "checkpoint": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "files": checkpoint_identity(model_path),
        "dtype": str(dtype),
        "device": device,
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:32]


def fitted_for_engine(
    control: Any, model_path: str, tokenizer: Any, *, trust_remote_code: bool = False, dtype: Any = None
) -> Any:
    """The vector `control` fits on `model_path`'s Hugging Face model (in `dtype`: the model group's, a name or a
    torch dtype; default float32): from the cache, or fitted now and cached."""
    device = _fit_device()
    dtype = getattr(torch, dtype) if isinstance(dtype, str) and dtype != "auto" else (dtype or torch.float32)
    if not isinstance(dtype, torch.dtype):
        dtype = torch.float32
    path = cache_dir() / "vectors" / f"{fit_key(control, model_path, dtype=dtype, device=device)}.safetensors"
    name = type(control).__name__
    if path.is_file():
        try:
            vector = control.load_vector(path)
        except (OSError, ValueError) as error:  # damaged: fit again and replace it
            logger.warning("Cached %s vector %s is unreadable (%s); fitting it again.", name, path, error)
        else:
            logger.info("%s vector reused from %s (fitted earlier on this checkpoint)", name, path)
            return vector
    from transformers import AutoModelForCausalLM

    resident.drop()  # a resident engine (or base) is freed first: never two models in memory
    logger.info(
        "Fitting %s's vector on the Hugging Face model of %s (%s) before the engine starts", name, model_path, device
    )
    with model_construction():  # transformers' loading patches process state: one load at a time (models.loading)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, trust_remote_code=trust_remote_code)
    try:
        model.to(device).eval()
        control.steer(model, tokenizer=tokenizer, backend="huggingface")
        vector = control.fitted_vector
        control.cleanup()
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if vector is None:
        raise RuntimeError(f"{name} fitted no vector on {model_path}.")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=".safetensors", dir=path.parent)
    os.close(fd)
    vector.save(tmp)
    os.replace(tmp, path)  # a concurrent job reads the old file or the new one, never a partial one
    logger.info("%s vector cached at %s", name, path)
    return vector
