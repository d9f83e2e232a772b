"""`SaveDir`: the one owner of a save_dir's layout, its cell index, its locks and its configuration records.

Layout (nothing else in the package builds these paths):

    <root>/
      inspect_logs/<config_id>/trial_<t>/<suite>/   the Inspect logs of one cell (the record and the checkpoint)
      cells/<config_id>/trial_<t>/<suite>.json      the index of a finished cell (its key, task results, provenance)
      cells/<config_id>/trial_<t>/<suite>.lock      held by whoever evaluates or rewrites that cell
      configs/<config_id>.json                      one record per configuration evaluated here (arm name, controls)
      protocol/<suite>.json                         what makes the suite's logs comparable (`store.comparable`)
      protocol/holders/<suite>.<host>.<pid>.<uuid>  one per running job holding that protocol (`store.claims`)
      generations/<scope>/<key>.json                a generation kept by what determines it (`store.generations`)
      .lock                                         the save_dir's lock (protocol check-and-claim)
      .scratch/                                     temporary files moved over logs (a reader sees old or new)

Invariants: a cell index is written only for a finished cell and atomically (a concurrent reader sees the old or
the new one); a damaged index is reported once and read as absent (the cell is evaluated again, Inspect reusing
the samples its log holds); readers never take a lock, writers of a cell hold its lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from steer_hydra.core.files import locked, read_json, write_json
from steer_hydra.store.generations import GenerationStore

logger = logging.getLogger(__name__)

LOGS_DIR = "inspect_logs"
CELLS_DIR = "cells"
CONFIGS_DIR = "configs"
PROTOCOL_DIR = "protocol"
HOLDERS_DIR = "holders"
LOCK_FILE = ".lock"
SCRATCH_DIR = ".scratch"
TRIAL_PREFIX = "trial_"


@dataclass(frozen=True, slots=True)
class Cell:
    """One (configuration, trial, suite) of a save_dir: the unit that is evaluated, indexed, locked and reused."""

    config_id: str
    trial_id: int
    suite: str


@dataclass(frozen=True, slots=True)
class LoggedCell:
    """A cell found on disk by its log directory (what readers of a save_dir walk)."""

    cell: Cell
    log_dir: Path


class SaveDir:
    """A save_dir: where every job of an experiment (per model and seed) evaluates, resumes and reuses cells."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"SaveDir({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SaveDir) and other.root == self.root

    def __hash__(self) -> int:
        return hash(self.root)

    # -------------------------------------------------------------------------------------------- logs
    @property
    def logs_root(self) -> Path:
        return self.root / LOGS_DIR

    def holds_logs(self) -> bool:
        """Whether this folder looks like a save_dir (it has a logs folder)."""
        return self.logs_root.is_dir()

    def config_log_dir(self, config_id: str) -> Path:
        """Every log of one configuration (all its trials and suites): what a W&B artifact or `inspect view` opens."""
        return self.logs_root / config_id

    def log_dir(self, cell: Cell) -> Path:
        return self.config_log_dir(cell.config_id) / f"{TRIAL_PREFIX}{cell.trial_id}" / cell.suite

    def logged_cells(
        self, config_ids: Iterable[str] | None = None, suites: Iterable[str] | None = None
    ) -> Iterator[LoggedCell]:
        """Every cell with a log directory, in path order (of `config_ids` and of `suites` only, when given)."""
        wanted = None if config_ids is None else set(config_ids)
        wanted_suites = None if suites is None else set(suites)
        root = self.logs_root
        for config_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            if wanted is not None and config_dir.name not in wanted:
                continue
            for trial_dir in sorted(p for p in config_dir.iterdir() if p.is_dir() and p.name.startswith(TRIAL_PREFIX)):
                trial = trial_dir.name.removeprefix(TRIAL_PREFIX)
                if not trial.isdigit():
                    continue
                for suite_dir in sorted(p for p in trial_dir.iterdir() if p.is_dir()):
                    if wanted_suites is not None and suite_dir.name not in wanted_suites:
                        continue
                    yield LoggedCell(Cell(config_dir.name, int(trial), suite_dir.name), suite_dir)

    def suite_logs(self, suite: str) -> list[Path]:
        """Every `.eval` log of `suite`, any configuration and trial (what backs a suite's protocol)."""
        return sorted(self.logs_root.glob(f"*/{TRIAL_PREFIX}*/{suite}/**/*.eval"))

    def relative(self, path: str | os.PathLike) -> str:
        """A path inside the save_dir as the results and cell indexes hold it (relative, `/`-separated)."""
        return Path(path).absolute().relative_to(self.root).as_posix()

    @contextlib.contextmanager
    def scratch_file(self, suffix: str) -> Iterator[Path]:
        """A temporary file inside the save_dir (so it can be moved over a log atomically), removed afterwards."""
        folder = self.root / SCRATCH_DIR
        folder.mkdir(parents=True, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=folder, suffix=suffix)
        os.close(handle)
        try:
            yield Path(temp)
        finally:
            Path(temp).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()

    # -------------------------------------------------------------------------------------------- cells
    def _cell_base(self, cell: Cell) -> Path:
        return self.root / CELLS_DIR / cell.config_id / f"{TRIAL_PREFIX}{cell.trial_id}" / cell.suite

    def index_path(self, cell: Cell) -> Path:
        return self._cell_base(cell).with_suffix(".json")

    def cell_lock(self, cell: Cell) -> Path:
        return self._cell_base(cell).with_suffix(".lock")

    @contextlib.contextmanager
    def locked_cell(self, cell: Cell, *, on_wait: Callable[[Path], None] | None = None) -> Iterator[None]:
        """Hold the cell's lock: one writer per cell (a job evaluating it, a rescore rewriting its logs)."""
        with locked(self.cell_lock(cell), on_wait=on_wait):
            yield

    def read_index(self, cell: Cell) -> dict[str, Any] | None:
        """The cell's index, or None when there is none or it is damaged (said in one warning: the cell is then
        evaluated again, Inspect reusing the samples its log holds, and the index rewritten)."""
        path = self.index_path(cell)
        try:
            index = read_json(path)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            cause = error.__cause__ or error
            why = f"{type(cause).__name__}: {cause}"
        else:
            if isinstance(index, dict) and isinstance(index.get("tasks", {}), dict):
                return index
            why = f"a JSON {type(index).__name__}, not a cell index"
        logger.warning("Cell index %s is damaged (%s); its cell is evaluated again and the index rewritten.", path, why)
        return None

    def write_index(self, cell: Cell, *, key: str, tasks: Mapping[str, Any], static: Any) -> None:
        """Index a finished cell: its key (`store.comparable.cell_key`), its task results and its provenance."""
        write_json(self.index_path(cell), {"key": key, "tasks": dict(tasks), "static": static})

    def update_indexed_metrics(self, cell: Cell, task: str, location: str, metrics: Mapping[str, Any]) -> bool:
        """Give the cell index's entry for `task` new metrics when it names the log at `location` (a rescored log);
        returns whether it did. A damaged index is left for the next job of that cell to rewrite. Hold the cell's
        lock."""
        if not self.index_path(cell).is_file():
            return False
        try:
            index = read_json(self.index_path(cell))
        except (OSError, ValueError):
            return False
        entry = (index.get("tasks") or {}).get(task) if isinstance(index, dict) else None
        if not isinstance(entry, dict) or entry.get("log") != location:
            return False
        entry["metrics"] = dict(metrics)
        write_json(self.index_path(cell), index)
        return True

    def generations(self, scope: str) -> GenerationStore:
        """The generations a configuration's trial keeps here (`comparable.generation_scope`)."""
        return GenerationStore(self.root, scope)

    # -------------------------------------------------------------------------------------------- configurations
    @property
    def configs_dir(self) -> Path:
        return self.root / CONFIGS_DIR

    def config_record_path(self, config_id: str) -> Path:
        return self.configs_dir / f"{config_id}.json"

    def write_config_record(self, record: Mapping[str, Any]) -> None:
        """Record one configuration evaluated here (`arm`, `arm_name`, `config_id`, `controls`)."""
        write_json(self.config_record_path(str(record["config_id"])), dict(record))

    def config_records(self) -> dict[str, dict[str, Any]]:
        """`{config_id: record}` of every configuration recorded here."""
        folder = self.configs_dir
        records = {}
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            record = read_json(path)
            records[record["config_id"]] = record
        return records

    def arm_names(self) -> dict[str, str]:
        """`{config_id: arm}` of every configuration recorded here."""
        return {config_id: record["arm"] for config_id, record in self.config_records().items()}

    def damaged_config_records(self) -> list[str]:
        """`<path> (why)` of every configuration record that is not a whole record (readers would fail on it)."""
        folder = self.configs_dir
        damaged = []
        for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
            try:
                record = read_json(path)
            except (OSError, ValueError) as error:
                damaged.append(f"{path} ({error.__cause__ or error})")
                continue
            if not isinstance(record, dict) or not {"config_id", "arm"} <= set(record):
                damaged.append(f"{path} (not a configuration record: it needs 'config_id' and 'arm')")
        return damaged

    # -------------------------------------------------------------------------------------------- protocol
    @property
    def lock_path(self) -> Path:
        """The save_dir's own lock: a suite's protocol is checked and claimed under it."""
        return self.root / LOCK_FILE

    def protocol_path(self, suite: str) -> Path:
        return self.root / PROTOCOL_DIR / f"{suite}.json"

    @property
    def holders_dir(self) -> Path:
        return self.root / PROTOCOL_DIR / HOLDERS_DIR
