"""The process's resident base model: consecutive jobs (and configurations) that use the same model reuse the loaded
one instead of loading it again, and a job that needs another model frees the resident one first.

Invariants:
- at most one base is resident per process (a Hugging Face model with its tokenizer, or a booted engine), so memory
  never holds two bases: `keep` and `take` of another key free the one held first;
- a base is kept only as its user hands it back, after its controls were released (release restores the weights
  bit-exactly, and `core.sweeps.PipelineFactory`'s tripwire drops a base whose weights, hooks, attention
  implementation or tokenizer changed), so a job on a resident base sees what a fresh load gives;
- the key names everything that makes two loads the same (`residency_key`): the model source, the backend's kind
  and the options that bear on what it generates, and the state of a local checkpoint's files;
- a model loaded beside an engine's job to fit or train on (`on_checkpoint_model`) frees the resident base first,
  and is freed itself before the engine starts.
"""

from __future__ import annotations

import gc
import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from steer_hydra.core.identity import canonical_json
from steer_hydra.core.source import checkpoint_dtype

T = TypeVar("T")

logger = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".json", ".model", ".txt")


@dataclass
class _Held:
    key: str
    label: str
    value: Any
    close: Callable[[Any], None] | None


_lock = threading.Lock()
_held: _Held | None = None
_enabled = False


def residency_key(source_identity: Mapping[str, Any], backend_kind: str, backend_options: Mapping[str, Any]) -> str:
    """A digest of what makes two loads the same: the source (`ModelSource.identity()`), the backend's kind and its
    generation options, and, for a local checkpoint folder, its files' names, sizes and modification times."""
    reference = source_identity.get("model_name_or_path")
    files: list[tuple[str, int, int]] = []
    if isinstance(reference, str) and reference and Path(reference).expanduser().is_dir():
        folder = Path(reference).expanduser()
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in _WEIGHT_SUFFIXES:
                stat = path.stat()
                files.append((path.relative_to(folder).as_posix(), stat.st_size, stat.st_mtime_ns))
    payload = canonical_json(
        {"source": dict(source_identity), "backend": backend_kind, "options": dict(backend_options), "files": files}
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def take(key: str) -> Any | None:
    """The resident base under `key` (it stays resident: hand it back with `keep` or drop it), or None; a base of
    another key is freed first, so the caller can load its own without holding two."""
    global _held
    with _lock:
        if _held is not None and _held.key == key:
            logger.info("Reusing the resident %s (no load).", _held.label)
            return _held.value
    drop()
    return None


def keep(key: str, value: Any, *, label: str, close: Callable[[Any], None] | None = None) -> None:
    """Make `value` the resident base under `key` (`close(value)` frees it when it is dropped); another base is
    freed first."""
    global _held
    with _lock:
        if _held is not None and _held.key == key and _same(_held.value, value):  # handed back: nothing to free
            return
    drop()
    with _lock:
        _held = _Held(key, label, value, close)


def _same(held: Any, value: Any) -> bool:
    """Whether `value` is the resident base itself (a tuple of the same objects counts: callers rebuild it)."""
    if held is value:
        return True
    return (
        isinstance(held, tuple)
        and isinstance(value, tuple)
        and len(held) == len(value)
        and all(a is b for a, b in zip(held, value, strict=True))
    )


def holds(key: str | None = None) -> bool:
    """Whether a base is resident (under `key`, when given)."""
    with _lock:
        return _held is not None and (key is None or _held.key == key)


def resident_label() -> str | None:
    """What is resident (e.g. the model reference), or None."""
    with _lock:
        return _held.label if _held is not None else None


def drop() -> None:
    """Free the resident base, if any (its `close`, then a garbage collection and the CUDA cache).

    The collection first unfreezes what a job froze (`gc.freeze`: the resident base is alive when a job starts), or
    a base held in a reference cycle would outlive the drop."""
    global _held
    with _lock:
        held, _held = _held, None
    if held is None:
        return
    logger.info("Freeing the resident %s.", held.label)
    if held.close is not None:
        try:
            held.close(held.value)
        except Exception:  # noqa: BLE001 - freeing must not fail the job that needs the memory
            logger.exception("Closing the resident %s failed.", held.label)
    del held
    gc.unfreeze()
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass


def checkpoint_device() -> str:
    """Where a checkpoint's model is fitted or trained on for an engine: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def on_checkpoint_model(
    model_path: str,
    work: Callable[[Any], T],
    *,
    purpose: str,
    dtype: Any = None,
    trust_remote_code: bool = False,
    guard: AbstractContextManager[Any] | None = None,
) -> T:
    """`work(model)` on the Hugging Face model of an engine's checkpoint (in `dtype`, see `checkpoint_dtype`; on
    `checkpoint_device()`, in eval mode), for what an engine cannot do itself: fit a vector, train an adapter,
    optimize a prompt. The resident base (a booted engine, a loaded model) is freed first, so memory never holds two
    models, and the model is freed when `work` returns. `purpose` names the work in the log and in errors; `guard`
    is held around the load (`models.loading.model_construction`, for callers that may import it)."""
    import torch
    from transformers import AutoModelForCausalLM

    drop()
    device = checkpoint_device()
    logger.info("%s on the Hugging Face model of %s (%s) before the engine starts", purpose, model_path, device)
    try:
        with guard if guard is not None else nullcontext():
            model = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=checkpoint_dtype(dtype), trust_remote_code=trust_remote_code
            )
    except OSError as error:
        raise ValueError(
            f"{purpose} on the Hugging Face model of {model_path!r}, which does not load here ({error}). Fix: make "
            "model.model_name_or_path a local checkpoint (or a Hub id) of the model the engine serves."
        ) from error
    try:
        return work(model.to(device).eval())
    finally:
        del model
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def configure(enabled: bool) -> None:
    """Turn residency on or off for this process (off frees what is resident). The runner sets it per run
    (`SteeringEval(residency=...)`, the app's `residency` option); backends and the pipeline factory read it."""
    global _enabled
    _enabled = bool(enabled)
    if not _enabled:
        drop()


def is_enabled() -> bool:
    return _enabled
