"""Checking a model reference without loading it: does it resolve (a built-in, a checkpoint folder, a Hub id), and
what its config says of its shape (context window, layers, heads), so a job's mistakes fail before any model loads.

Every check is bounded: a Hub id that is not in the local cache is looked up once with `HUB_TIMEOUT` seconds, and
not at all under `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`). Each problem is one line naming the config key
(`where`), the value and the fix.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steer_hydra.models.references import BUILTIN_REFERENCES, PREFIX
from steer_hydra.models.smollm2 import gguf_path, is_smollm2_reference
from steer_hydra.models.tiny import is_tiny_reference, parse_tiny_reference

HUB_TIMEOUT = 5.0  # seconds for one Hub lookup of a model id that is not cached locally
SMOLLM2_SHAPE = {"num_hidden_layers": 30, "num_attention_heads": 9}  # steer_hydra:smollm2 (SmolLM2-135M-Instruct)


def hub_offline() -> bool:
    """Whether the environment forbids reaching the Hugging Face Hub."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def looks_local(ref: str) -> bool:
    """Whether a reference is meant as a local path rather than a Hub id."""
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref.count("/") > 1 or "\\" in ref


def cached_hub_file(repo_id: str, filename: str) -> str | None:
    """A file of a Hub repository from the local cache, None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def reference_problems(ref: Any, where: str) -> list[str]:
    """Why `ref` (the value of config key `where`) cannot be loaded, found without loading it: `[]` for a built-in
    reference that resolves, a checkpoint folder, or a Hub id that is cached or that the Hub knows."""
    if not isinstance(ref, str) or not ref:
        return [f"{where} is empty. Fix: {where}=<Hub id or local folder>."]
    if ref.startswith(PREFIX):
        return _builtin_problems(ref, where)
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not list(path.glob("*.gguf")):
            return [f"{where}={ref!r} is a folder without config.json. Fix: point it at a saved checkpoint folder."]
        return []
    if looks_local(ref):
        return [
            f"{where}={ref!r}: no such local folder (resolved to {path.absolute()}). Fix: correct the path, "
            "or give a Hugging Face Hub id like org/name."
        ]
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as error:
        return [f"{where}={ref!r} is neither a local folder nor a valid Hub id ({error}). Fix: correct it."]
    if cached_hub_file(ref, "config.json") is not None:
        return []
    if hub_offline():
        return [
            f"{where}={ref!r} is not a local folder and not in the Hugging Face cache, and HF_HUB_OFFLINE=1 (or "
            "TRANSFORMERS_OFFLINE=1) forbids downloading it. Fix: download it once with network (hf download "
            f"{ref}), unset HF_HUB_OFFLINE, or point {where} at a local folder."
        ]
    return _hub_lookup(ref, where)


def _builtin_problems(ref: str, where: str) -> list[str]:
    if is_tiny_reference(ref):
        try:
            parse_tiny_reference(ref)
        except ValueError as error:
            return [f"{where}={ref!r}: {error} Fix: model=tiny or model=tiny_base."]
        return []
    if is_smollm2_reference(ref):
        try:
            gguf_path()
        except ImportError as error:
            return [f"{where}={ref!r}: {error}"]
        return []
    return [
        f"{where}={ref!r} is not a built-in model reference. Fix: one of {list(BUILTIN_REFERENCES)}, a Hub id "
        "or a local folder."
    ]


def _hub_lookup(ref: str, where: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(ref, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return [
            f"{where}={ref!r} is gated on the Hub and this machine has no access. Fix: accept its license on the "
            "Hub, then `hf auth login` or export HF_TOKEN."
        ]
    except RepositoryNotFoundError:
        return [f"{where}={ref!r}: no such model on the Hub (or it is private). Fix: check the id, or log in."]
    except Exception as error:  # network: unreachable, DNS, timeout
        return [
            f"{where}={ref!r} is not cached locally and the Hub did not answer within {HUB_TIMEOUT:.0f}s "
            f"({type(error).__name__}). Fix: download it where there is network (hf download {ref}), or set "
            "HF_HUB_OFFLINE=1 with a populated cache, or use a local folder."
        ]
    return []


def known_config(ref: Any) -> Mapping[str, Any] | None:
    """The config fields of a model when readable without loading it (no transformers import): the built-in
    models' known shapes, `config.json` of a local folder or of a Hub id in the local cache; else None."""
    if not isinstance(ref, str) or not ref:
        return None
    config: Any = None
    try:
        if is_tiny_reference(ref):
            spec = parse_tiny_reference(ref)
            config = {
                "max_position_embeddings": spec.max_position_embeddings,
                "num_hidden_layers": spec.num_hidden_layers,
                "num_attention_heads": spec.num_attention_heads,
            }
        elif is_smollm2_reference(ref):
            config = SMOLLM2_SHAPE
        elif (Path(ref).expanduser() / "config.json").is_file():
            config = json.loads((Path(ref).expanduser() / "config.json").read_text())
        elif not ref.startswith(PREFIX) and not looks_local(ref):
            cached = cached_hub_file(ref, "config.json")
            config = json.loads(Path(cached).read_text()) if cached else None
    except (ValueError, OSError):
        return None
    return config if isinstance(config, Mapping) else None
