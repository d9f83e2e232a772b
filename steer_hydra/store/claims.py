"""`SuiteClaim`: one job's hold on a suite's protocol in a save_dir, so jobs with another setting are refused.

How it runs: a job checks the protocol before any model loads (`check`, read-only) and claims it right before it
evaluates its first cell (`claim`, with the loaded backend's identity in the protocol); `release` undoes a claim
that no log came to back. Jobs share `protocol/<suite>.json` and `configs/<config_id>.json`; both are written
atomically, and check-and-claim runs under the save_dir's lock.

The protocol of a suite is held while a log of the suite exists or a job holding it runs. A job's hold is a holder
file (`SaveDir.holders_dir/<suite>.<host>.<pid>.<uuid>`) whose JSON names the job's process
(`core.files.process_identity`: host, boot, pid namespace, pid, start time) and which the job touches every
`HOLDER_REFRESH_S` seconds until it releases it. A holder is stale when its process is gone (checked on its own
host: the pid is free, a zombie, or another process's) or, on any host, when it was not touched for
`HOLDER_LEASE_S` seconds (a job killed with SIGKILL or SIGTERM cannot remove its own). The next claim or release
clears stale holders with a warning, and a protocol that neither a log nor a live holder backs; a refusal names
what holds the protocol (logs, running jobs). Damaged shared files (the protocol, the configuration records) fail
in `check`, before any model loads, naming the file and the fix.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steer_hydra.core.errors import ConfigError
from steer_hydra.core.files import locked, on_this_host, process_gone, process_identity, read_json, write_json
from steer_hydra.store.comparable import changed_leaves
from steer_hydra.store.save_dir import SaveDir

logger = logging.getLogger(__name__)

HOLDER_REFRESH_S = 60.0  # a job touches its holder this often while it runs
HOLDER_LEASE_S = 600.0  # a holder not touched for this long is stale on any host (its job is gone)
NEW_SAVE_DIR = "evaluate into another save_dir"  # how a library user starts a new protocol; the app names its keys


@dataclass(frozen=True, slots=True)
class Holder:
    """One job's hold on a suite's protocol: its file, what the file says (`{}` when unreadable) and its age."""

    path: Path
    info: Mapping[str, Any]
    age_s: float

    @classmethod
    def read(cls, path: Path, suite: str) -> Holder | None:
        """The holder at `path` when it holds `suite` (None for another suite's, or a file gone meanwhile)."""
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return None
        try:
            info = read_json(path)
        except (OSError, ValueError):  # empty or unreadable: judged by its name and age only
            info = None
        if not isinstance(info, Mapping):
            return cls(path, {}, age) if path.name.startswith(f"{suite}.") else None
        return cls(path, info, age) if info.get("suite") == suite else None

    def describe(self) -> str:
        """`pid 12 on host h, arm pasta, claimed 2026-01-01T00:00:00Z`, or the file's name when it says nothing."""
        if not self.info:
            return f"holder {self.path.name}"
        pid, host, arm, claimed = (self.info.get(key) for key in ("pid", "host", "arm", "claimed_utc"))
        return f"pid {pid} on host {host}, arm {arm}, claimed {claimed}"

    def stale_reason(self) -> str | None:
        """Why this holder no longer holds anything (its job is gone), or None while its job may still run."""
        if self.info and on_this_host(self.info):
            return "its process is gone" if process_gone(self.info) else None
        if self.age_s > HOLDER_LEASE_S:
            return (
                f"not refreshed for {self.age_s / 60:.0f} min (a running job refreshes it every "
                f"{HOLDER_REFRESH_S:.0f} s; the lease is {HOLDER_LEASE_S / 60:.0f} min)"
            )
        return None


def _refresh_holder(path: Path, stop: threading.Event) -> None:
    """Touch `path` every `HOLDER_REFRESH_S` seconds until `stop` is set (or the file is gone)."""
    while not stop.wait(HOLDER_REFRESH_S):
        try:
            os.utime(path)
        except OSError:
            return


class SuiteClaim:
    """A job's claim on `suite`'s protocol in `save_dir`, for the configuration `config_id` shown as `arm`.

    `new_protocol_fix` says how to start a new protocol (the app: `set experiment_name=<new name> (or
    save_dir=...)`); `rejudge_command`, when given, is offered when only the judge changed and logs exist.
    """

    def __init__(
        self,
        save_dir: SaveDir,
        suite: str,
        *,
        arm: str,
        config_id: str,
        new_protocol_fix: str = NEW_SAVE_DIR,
        rejudge_command: str | None = None,
    ) -> None:
        self.save_dir = save_dir
        self.suite = suite
        self.arm = arm
        self.config_id = config_id
        self.new_protocol_fix = new_protocol_fix
        self.rejudge_command = rejudge_command
        self._holder: Path | None = None
        self._holder_stop: threading.Event | None = None

    @property
    def protocol_path(self) -> Path:
        return self.save_dir.protocol_path(self.suite)

    @property
    def held(self) -> bool:
        return self._holder is not None

    # -------------------------------------------------------------------------------------------- check
    def check(self, protocol: Mapping[str, Any]) -> None:
        """Refuse a save_dir whose logs or running jobs for this suite hold another protocol (they would be
        reused), a damaged protocol file that something holds, and damaged configuration records; read-only."""
        self._check_config_records()
        if not self.protocol_path.exists():
            return
        try:
            if not self._changes(protocol):
                return
        except ConfigError:  # damaged: an error only while something holds it (the claim clears it otherwise)
            with locked(self.save_dir.lock_path):
                live, logs = self._holds()
                if live or logs:
                    raise
            return
        with locked(self.save_dir.lock_path):
            live, logs = self._holds()
            changed = self._changes(protocol) if self.protocol_path.exists() else []
            if changed and (live or logs):
                raise ConfigError(self._refusal(changed, live, logs))

    def _read_protocol(self) -> dict[str, Any]:
        """The suite's recorded protocol; a damaged file raises ConfigError naming it and the fix."""
        try:
            previous = read_json(self.protocol_path)
        except ValueError as error:
            previous, reason = None, str(error.__cause__ or error)
        else:
            reason = f"a JSON {type(previous).__name__}, not an object"
        if not isinstance(previous, dict):
            raise ConfigError(
                f"{self.protocol_path} is damaged ({reason}). It records the protocol (model, backend, provider, "
                f"generation settings, suite, seed) of the logs and running jobs of suite {self.suite!r} in "
                f"save_dir {self.save_dir.root}. Fix: if they were made with this command's settings, delete the "
                f"file and re-run (the job writes it again); otherwise {self.new_protocol_fix}."
            )
        return previous

    def _changes(self, protocol: Mapping[str, Any]) -> list[str]:
        """`key: old -> new` of the recorded protocol against `protocol` (empty when they match)."""
        previous, current = self._read_protocol(), dict(protocol)
        if "identity" not in current["backend"]:  # not loaded yet: compared at the claim
            previous.get("backend", {}).pop("identity", None)
        return changed_leaves(previous, current) if previous != current else []

    def _refusal(self, changed: list[str], live: list[Holder], logs: list[Path]) -> str:
        """What holds the other protocol (logs, running jobs) and how to go on; one line."""
        held = []
        if logs:
            cells = sorted({self.save_dir.relative(log.parent) for log in logs})
            shown = ", ".join(cells[:3]) + (f" and {len(cells) - 3} more" if len(cells) > 3 else "")
            held.append(f"{len(logs)} Inspect log(s) in {shown}")
        if live:
            held.append(f"{len(live)} running job(s) with a claim on it ({'; '.join(h.describe() for h in live[:3])})")
        holding = f", held by {' and by '.join(held)}" if held else ""
        message = (
            f"save_dir {self.save_dir.root} holds suite {self.suite!r} under another protocol "
            f"({self.protocol_path}; changed: {'; '.join(changed[:6])}){holding}. "
        )
        message += (
            "Inspect would resume those logs as if nothing changed. " if logs else "No log of the suite exists yet. "
        )
        message += f"Fix: {self.new_protocol_fix} for the new protocol, or restore the old settings"
        judged = any(change.startswith(("model_roles", "scorers")) for change in changed)
        if judged and logs and self.rejudge_command:
            message += f"; to judge the finished logs without generating again, run {self.rejudge_command}"
        if live and not logs:
            message += "; or wait for those jobs to end (a job that ends without a log releases its claim)"
        remote = [holder for holder in live if not (holder.info and on_this_host(holder.info))]
        if remote:
            message += (
                f"; a claim from another host counts until its job has not refreshed it for {HOLDER_LEASE_S / 60:.0f} "
                f"min: if that job is gone, delete {remote[0].path}"
            )
        return message + "."

    def _check_config_records(self) -> None:
        """Every configuration record must be whole: every job's results table and a sweep's aggregate read them
        all (the arm names), so a damaged one would fail only after the evaluation."""
        damaged = self.save_dir.damaged_config_records()
        if damaged:
            raise ConfigError(
                f"save_dir {self.save_dir.root} has {len(damaged)} damaged configuration record(s): "
                f"{'; '.join(damaged)}. Every job's results and a sweep's aggregate read these records (the arm "
                "names). Fix: delete the file(s) and re-run; the results stay in the Inspect logs, and a record is "
                "written again when a job of its configuration next evaluates a cell (until then tables name that "
                "configuration by its config_id)."
            )

    # -------------------------------------------------------------------------------------------- holders
    def _holds(self) -> tuple[list[Holder], list[Path]]:
        """The live holders and the logs of this suite (stale holders are left alone)."""
        live = [holder for holder in self._holders() if holder.stale_reason() is None]
        return live, self.save_dir.suite_logs(self.suite)

    def _holders(self) -> list[Holder]:
        folder = self.save_dir.holders_dir
        found = (Holder.read(path, self.suite) for path in sorted(folder.iterdir())) if folder.is_dir() else ()
        return [holder for holder in found if holder is not None]

    def _clear_stale(self) -> None:
        """Under the save_dir lock: remove stale holders (a warning each), then the protocol when no log of the
        suite exists and no live holder remains."""
        live = []
        for holder in self._holders():
            reason = holder.stale_reason()
            if reason is None:
                live.append(holder)
                continue
            logger.warning(
                "Clearing a stale claim on suite %s: %s left %s and %s.",
                self.suite,
                holder.describe(),
                holder.path,
                reason,
            )
            holder.path.unlink(missing_ok=True)
        if not live and self.protocol_path.exists() and not self.save_dir.suite_logs(self.suite):
            logger.info(
                "No log of suite %s exists and no running job holds its protocol: removing %s.",
                self.suite,
                self.protocol_path,
            )
            self.protocol_path.unlink(missing_ok=True)

    # -------------------------------------------------------------------------------------------- claim, release
    def claim(self, protocol: Mapping[str, Any], config_record: Mapping[str, Any]) -> None:
        """Check and claim this suite's `protocol` and write `config_record`, atomically under the save_dir lock
        (idempotent: a second call does nothing). Stale claims are cleared first."""
        if self._holder is not None:
            return
        with locked(self.save_dir.lock_path):
            self._clear_stale()
            if self.protocol_path.exists():
                changed = self._changes(protocol)
                if changed:
                    live, logs = self._holds()
                    raise ConfigError(self._refusal(changed, live, logs))
            else:
                write_json(self.protocol_path, dict(protocol))
            identity = process_identity()
            host = re.sub(r"[^A-Za-z0-9_-]", "-", str(identity["host"]))
            holder = self.save_dir.holders_dir / f"{self.suite}.{host}.{identity['pid']}.{uuid.uuid4().hex}"
            write_json(
                holder,
                {
                    "suite": self.suite,
                    "config_id": self.config_id,
                    "arm": self.arm,
                    "claimed_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    **identity,
                },
            )
            self._holder = holder
            self._holder_stop = threading.Event()
            threading.Thread(
                target=_refresh_holder, args=(holder, self._holder_stop), name="steer_hydra-claim", daemon=True
            ).start()
            self.save_dir.write_config_record(config_record)

    def release(self) -> None:
        """Drop this job's hold on the protocol; remove the protocol if no log of the suite exists and nobody
        (alive) holds it."""
        if self._holder is None:
            return
        if self._holder_stop is not None:
            self._holder_stop.set()
            self._holder_stop = None
        with locked(self.save_dir.lock_path):
            self._holder.unlink(missing_ok=True)
            self._holder = None
            self._clear_stale()
