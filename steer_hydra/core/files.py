"""Files that concurrent jobs share in a save_dir: atomic writes, JSON reads that name the file, an fcntl lock.

Invariants: a shared file is only ever replaced whole (`os.replace` of a temporary file in the same directory),
so a reader sees the old content or the new one, never a partial file, and its mode is what `open(path, "w")` would
give (0666 less the process's umask), like every other file a job writes; a read-check-write sequence on shared
files runs under `locked(<save_dir>/.lock)`, one process at a time (advisory `fcntl.flock`, which works on
local and NFS-v4 filesystems); `locked(..., on_wait=...)` says when it has to wait for another holder.

Process identity (`process_identity`, `process_gone`) lets a file name the process that wrote it and a later
reader on the same host tell whether that process still runs: host name, boot id and pid namespace say whether the
reader can see the process; the pid and its start time (`/proc/<pid>/stat`, where available) say whether it is the
same process, so a reused pid is not taken for the writer.
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import json
import os
import socket
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd


def current_umask() -> int:
    """The process's umask, read without changing it where `/proc/self/status` says it (Linux 4.7+)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere: read by setting it, then restore it at once
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` atomically: a temporary file in the same directory, fsynced, then `os.replace`.

    The file gets mode 0666 less the umask, as `open(path, "w")` gives (`mkstemp` alone would leave 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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
def locked(path: str | os.PathLike, *, on_wait: Callable[[Path], None] | None = None) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the body; blocks until it is free.

    `on_wait(path)` is called once, before blocking, when another process (or another open of the file) holds it.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait(path)
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        except OSError as error:
            raise OSError(
                f"Cannot lock {path} ({error}). Fix: put save_dir on a filesystem with file locks."
            ) from error
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of `/proc/<pid>/stat` after the command name (state first), None where unreadable."""
    text = _read_text(f"/proc/{pid}/stat")
    return text.rpartition(")")[2].split() if text else None


def process_start_time(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (`/proc/<pid>/stat` field 22); None where unknown."""
    stat = _proc_stat(pid)
    try:
        return int(stat[19]) if stat else None
    except (IndexError, ValueError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_identity(pid: int | None = None) -> dict[str, Any]:
    """What names a process across hosts: `host`, `boot_id`, `pid_namespace` (None where unknown), `pid` (this
    process's by default) and its `start_time` (`process_start_time`)."""
    pid = os.getpid() if pid is None else pid
    return {
        "host": socket.gethostname(),
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": _pid_namespace(),
        "pid": pid,
        "start_time": process_start_time(pid),
    }


def on_this_host(identity: Mapping[str, Any]) -> bool:
    """Whether the process `identity` names would be visible here: same host name, boot and pid namespace."""
    here = process_identity()
    return all(identity.get(key) == here[key] for key in ("host", "boot_id", "pid_namespace"))


def process_gone(identity: Mapping[str, Any]) -> bool:
    """Whether the process that `identity` (from `process_identity`, on this host) names has exited: its pid is
    free, a zombie, or now another process's (another start time). False when that cannot be told."""
    pid = identity.get("pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        pass
    stat = _proc_stat(pid)
    if stat and stat[0] in ("Z", "X"):
        return True
    recorded, current = identity.get("start_time"), process_start_time(pid)
    return recorded is not None and current is not None and recorded != current
