"""Artifacts that controls build at `steer()` (trained adapters, merged weights, chosen prompts), cached on disk by a
content digest, and the digests themselves (files, folders, a live model's weights).

How it runs: `build_artifact(kind, key, build)` returns `<cache>/<kind>/<key>/`, calling `build(work, out)` first
when no complete entry exists. The build runs under an exclusive lock (`<cache>/<kind>/.<key>.lock`, released by
the operating system when a process dies), writes into `<cache>/<kind>/.<key>.partial/out/`, then a completion
marker (`artifact.json`) inside it, and only then renames `out/` to the entry's name in one step.

Invariants:
- an entry folder exists only complete: the rename is atomic and the marker is written before it, so a reader (or
  a concurrent job) sees no entry or a whole one, never a half-written one;
- a killed build leaves only its `.partial` folder; the next build of the same key removes a half-written `out/`
  and may resume from state the builder kept beside it in the work folder (a trainer's checkpoints);
- the key is a digest of everything the artifact depends on (`content_key`), so a changed input builds a new
  entry and an unchanged one is reused, across jobs and processes.

The cache root is `cache_dir` when a control names one, else `$STEER_HYDRA_CACHE`, else `~/.cache/steer_hydra`:
the folder `steer_hydra.models.cache_dir()` names (this layer may not import it).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar

import torch

from steer_hydra.core.files import locked, read_json, write_json
from steer_hydra.core.identity import canonical_json
from steer_hydra.core.resident import on_checkpoint_model
from steer_hydra.core.source import checkpoint_dtype, checkpoint_files

logger = logging.getLogger(__name__)

MARKER = "artifact.json"  # written last inside a finished entry: its presence means "complete"
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.pth")
CHECKPOINT_PATTERNS = (*WEIGHT_PATTERNS, "config.json", "*.index.json")
FULL_HASH_PARAMS = 300_000_000  # models up to this many parameters have every weight hashed; larger ones sampled
_DIGESTS: dict[tuple[Any, ...], str] = {}  # in-process memo: (path, patterns, sizes and mtimes) -> sha256


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The artifact cache: `cache_dir`, else `$STEER_HYDRA_CACHE`, else `~/.cache/steer_hydra`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("STEER_HYDRA_CACHE", Path.home() / ".cache" / "steer_hydra"))


def content_key(payload: Any) -> str:
    """A 32-hex digest of `payload`'s canonical JSON (`steer_hydra.core.identity.canonical_json`)."""
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()[:32]


def _files(folder: Path, patterns: Iterable[str]) -> list[Path]:
    return sorted({p for pattern in patterns for p in folder.glob(pattern) if p.is_file()})


def file_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of one file's bytes, memoised in this process by its size and modification time."""
    path = Path(path).resolve()
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    found = _DIGESTS.get(key)
    if found is None:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
        found = _DIGESTS[key] = digest.hexdigest()
    return found


def folder_sha256(
    folder: str | os.PathLike[str], patterns: Iterable[str] = CHECKPOINT_PATTERNS, *, cache_dir: Any = None
) -> str:
    """sha256 over the names and bytes of a folder's files matching `patterns` (a checkpoint's weights and config).

    Hashing a large checkpoint reads all of it, so the result is memoised in this process and on disk
    (`<cache>/digests/`), keyed by the files' names, sizes and modification times.
    """
    folder = Path(folder).resolve()
    patterns = tuple(patterns)
    files = _files(folder, patterns)
    if not files:
        raise ValueError(
            f"{folder} holds no files matching {list(patterns)}. Fix: point at a checkpoint folder written by "
            "save_pretrained (config.json and safetensors weights)."
        )
    stats = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(folder), patterns, stats)
    found = _DIGESTS.get(key)
    if found is not None:
        return found
    memo = cache_root(cache_dir) / "digests" / f"{content_key(list(key))}.json"
    with contextlib.suppress(OSError, ValueError):
        found = str(read_json(memo)["sha256"]) if memo.is_file() else None
    if found is None:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode() + b"\0" + bytes.fromhex(file_sha256(path)))
        found = digest.hexdigest()
        with contextlib.suppress(OSError):
            write_json(memo, {"folder": str(folder), "sha256": found})
    _DIGESTS[key] = found
    return found


_VOLATILE_CONFIG = {"transformers_version", "use_cache", "dtype", "torch_dtype", "architectures"}


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of a live model: its class, its configuration and every weight (names, dtypes, shapes and bytes).

    Models with more than `FULL_HASH_PARAMS` parameters hash a strided sample of 4096 values per tensor instead of
    every byte (reading tens of gigabytes per job would cost more than the work it keys). Two loads of one
    checkpoint in one dtype give one digest; an in-place edit (a merged adapter, swapped weights) gives another.
    """
    config = getattr(model, "config", None)
    settings = config.to_diff_dict() if config is not None and hasattr(config, "to_diff_dict") else {}
    settings = {k: v for k, v in settings.items() if not k.startswith("_") and k not in _VOLATILE_CONFIG}
    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    state = model.state_dict()
    full = sum(t.numel() for t in state.values()) <= FULL_HASH_PARAMS
    with torch.no_grad():
        for name, tensor in state.items():
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
            if tensor.device.type == "meta" or tensor.numel() == 0:
                continue
            flat = tensor.detach().reshape(-1)
            if not full:
                flat = flat[:: max(1, flat.numel() // 4096)][:4096]
            flat = flat.contiguous().cpu()
            digest.update(flat.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _digest_memo(model_path: str, dtype: Any, cache_dir: str | os.PathLike[str] | None) -> Path | None:
    """Where the `weights_digest` of a local checkpoint's model loaded in `dtype` is memoised (None for a Hub id).
    Keyed by the folder and the stamps of its weight and config files: a changed checkpoint is loaded again."""
    if not Path(model_path).is_dir():
        return None
    payload = [str(Path(model_path).resolve()), checkpoint_files(model_path), str(checkpoint_dtype(dtype))]
    return cache_root(cache_dir) / "digests" / f"base-{content_key(payload)}.json"


def memoised_digest(model_path: str, dtype: Any, cache_dir: str | os.PathLike[str] | None) -> str | None:
    """The `weights_digest` of the checkpoint at `model_path` loaded in `dtype`, as `memoise_digest` kept it in
    `cache_dir`'s cache, or None: an artifact built on an engine's checkpoint is found again without a load."""
    memo = _digest_memo(model_path, dtype, cache_dir)
    return read_json(memo)["weights"] if memo is not None and memo.is_file() else None


def memoise_digest(model: torch.nn.Module, model_path: str, dtype: Any, cache_dir: str | None) -> str:
    """`weights_digest(model)` of the checkpoint at `model_path` loaded in `dtype`, memoised in `cache_dir`'s cache
    for `memoised_digest`."""
    digest = weights_digest(model)
    memo = _digest_memo(model_path, dtype, cache_dir)
    if memo is not None:
        write_json(memo, {"model_path": str(model_path), "weights": digest})
    return digest


class BuildsForEngine:
    """Mixin of the controls that build what an engine serves on the engine's checkpoint (a trainer's adapter, a
    prompt optimizer's instruction): `prepare_for_engine`, called by the vLLM backends before the engine boots,
    finds it cached with no load (`found_for_engine`) or builds it (`build_for_engine`) on one load of the checkpoint.
    `builds_ahead`: the app builds it before any job (`Backend.fit_ahead`), many controls on one load."""

    builds_ahead: ClassVar[bool] = True
    cache_dir: str | None

    def found_for_engine(self, model_path: str, tokenizer: Any, dtype: Any = None) -> bool:
        """Whether what this control builds for the engine's checkpoint is cached; if so it is ready to serve."""
        raise NotImplementedError

    def build_for_engine(self, model: torch.nn.Module, model_path: str, tokenizer: Any, dtype: Any = None) -> Path:
        """Build (or find) it on `model`, the checkpoint's Hugging Face model loaded in `dtype`, leaving `model`
        unchanged (the checkpoint's digest is memoised: `memoise_digest`); returns its cache entry, ready to serve.
        Many controls may build on one load in turn (`Backend.fit_ahead`)."""
        raise NotImplementedError

    def prepare_for_engine(
        self, model_path: str | None, tokenizer: Any, *, trust_remote_code: bool = False, dtype: Any = None
    ) -> Path | None:
        """Find or build it on the engine's checkpoint before the engine boots (a load of the checkpoint frees the
        resident engine first: `core.resident.on_checkpoint_model`); returns the cache entry built now (None when
        it was found cached)."""
        if model_path is None:
            raise ValueError(
                f"{type(self).__name__} builds on the engine's checkpoint (model_name_or_path=); the backend has none."
            )
        if self.found_for_engine(model_path, tokenizer, dtype):
            return None
        return on_checkpoint_model(
            model_path,
            lambda model: self.build_for_engine(model, model_path, tokenizer, dtype),
            purpose=f"{type(self).__name__} builds",
            dtype=dtype,
            trust_remote_code=trust_remote_code,
        )


def tokenizer_digest(tokenizer: Any) -> str | None:
    """sha256 of what a tokenizer contributes to formatted training text: vocabulary, special tokens, template."""
    if tokenizer is None:
        return None
    payload = {
        "vocab": sorted(tokenizer.get_vocab().items()) if hasattr(tokenizer, "get_vocab") else len(tokenizer),
        "special": {k: str(v) for k, v in sorted(getattr(tokenizer, "special_tokens_map", {}).items())},
        "template": getattr(tokenizer, "chat_template", None),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def is_complete(entry: Path) -> bool:
    """Whether `entry` is a finished cache entry (its marker exists)."""
    return (entry / MARKER).is_file()


def build_artifact(
    kind: str,
    key: str,
    build: Callable[[Path, Path], None],
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    record: Mapping[str, Any] | None = None,
) -> tuple[Path, bool]:
    """`(entry folder, built)`: the complete entry `<cache>/<kind>/<key>`, built now (`built=True`) when missing.

    `build(work, out)` must write the artifact into `out` (created empty); `work` survives a killed build, so a
    builder may keep resumable state there (outside `out`). `record` (JSON values) is written into the entry's
    marker beside the key and the time. See the module docstring for the invariants.
    """
    kind_dir = cache_root(cache_dir) / kind
    entry = kind_dir / key
    if is_complete(entry):
        return entry, False
    kind_dir.mkdir(parents=True, exist_ok=True)

    def waiting(lock: Path) -> None:
        logger.info("Waiting for another process building %s/%s (it holds %s)", kind, key, lock)

    with locked(kind_dir / f".{key}.lock", on_wait=waiting):
        if is_complete(entry):  # built by the process we waited for
            return entry, False
        work = kind_dir / f".{key}.partial"
        out = work / "out"
        if out.exists():
            logger.info("Removing the half-written output of an interrupted build of %s/%s", kind, key)
            shutil.rmtree(out)
        out.mkdir(parents=True)
        build(work, out)
        write_json(
            out / MARKER, {"kind": kind, "key": key, "created_utc": datetime.now(UTC).isoformat(), **dict(record or {})}
        )
        if entry.exists():  # a folder without a marker (copied in by hand, or damaged): never served
            shutil.rmtree(entry)
        os.rename(out, entry)
        shutil.rmtree(work, ignore_errors=True)
    logger.info("Cached %s at %s", kind, entry)
    return entry, True


def read_record(entry: Path) -> dict[str, Any]:
    """The marker of a complete entry (what `build_artifact` recorded)."""
    return dict(read_json(entry / MARKER))
