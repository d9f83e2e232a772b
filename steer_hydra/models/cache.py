"""`build_once`: write a model folder into the cache atomically (staging folder, then one rename)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(target: Path, build: Callable[[Path], None]) -> str:
    """`target` as a string, calling `build(staging)` first when `target/config.json` is absent.

    A crash leaves nothing half-written at `target`; two processes building at once both end with one identical copy.
    """
    if (target / "config.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(staging)
        try:
            os.rename(staging, target)
        except OSError:  # another process won the race; its copy is identical
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)
