"""Files that concurrent jobs share in a save_dir: atomic writes, JSON reads that name the file, an fcntl lock.

Invariants: a shared file is only ever replaced whole (`os.replace` of a temporary file in the same directory),
so a reader sees the old content or the new one, never a partial file; a read-check-write sequence on shared
files runs under `locked(<save_dir>/.lock)`, one process at a time (advisory `fcntl.flock`, which works on
local and NFS-v4 filesystems).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically: a temporary file in the same directory, fsynced, then `os.replace`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_csv(frame: pd.DataFrame, path: str | os.PathLike) -> None:
    """Write `frame` as CSV atomically, every string quoted, so any text (`\\r`, NUL, quotes, emoji) round-trips
    through `pandas.read_csv(path, keep_default_na=False)` or `csv.reader(open(path, newline=""))`."""
    atomic_write_text(path, frame.to_csv(index=False, quoting=csv.QUOTE_NONNUMERIC))


def write_json(path: str | os.PathLike, value: Any) -> None:
    """`atomic_write_text` of indented JSON (non-JSON values via `str`)."""
    atomic_write_text(path, json.dumps(value, indent=1, default=str))


def read_json(path: str | os.PathLike) -> Any:
    """Parse a JSON file; a damaged file raises ValueError that names it and the fix."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}). It was written by another tool or damaged. Fix: delete it and "
            "re-run the command (results come back from the Inspect logs)."
        ) from error


@contextlib.contextmanager
def locked(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the body; blocks until it is free."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as error:
            raise OSError(
                f"Cannot lock {path} ({error}). Fix: put save_dir on a filesystem with file locks."
            ) from error
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
