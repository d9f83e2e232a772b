"""`JobRecord`: what one job leaves in its output directory (`job_record.json`), typed, with its one writer and reader.

Its readers: the sweep aggregate (which jobs finished, their cells), rescore (which save_dirs and configurations a
job or sweep covers, and the tables it rewrites) and the study (each launched job's cells). `cells_of` is the one
place records become the cells a comparison reads (`analysis.compare.CellSelection`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from steer_hydra.analysis.compare import CellSelection
from steer_hydra.core.files import read_json, write_json
from steer_hydra.core.identity import BASELINE_CONFIG_ID

JOB_RECORD = "job_record.json"


@dataclass
class JobRecord:
    """One job: its arm (`arm`: the display name, `arm_name`: the arm file's `name`), configuration, suite, model and
    seed, its trials, where its cells are, what it reported and where it ran."""

    arm: str
    arm_name: str
    config_id: str
    suite: str
    model: str
    save_dir: str
    baseline_config_id: str = BASELINE_CONFIG_ID
    seed: int | None = None
    trial_ids: list[int] = field(default_factory=list)
    trial_seeds: list[int | None] = field(default_factory=list)
    overrides: list[str] = field(default_factory=list)
    sweep_id: str | None = None
    wandb_run_id: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    results_reused: bool = False
    tasks_without_baseline: list[str] = field(default_factory=list)
    failed_samples: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    memory_after_release: dict[str, Any] = field(default_factory=dict)
    placement: dict[str, Any] = field(default_factory=dict)

    # the keys in the order the file has always listed them
    ORDER = (
        "arm",
        "arm_name",
        "config_id",
        "baseline_config_id",
        "suite",
        "model",
        "seed",
        "trial_ids",
        "trial_seeds",
        "save_dir",
        "overrides",
        "sweep_id",
        "wandb_run_id",
        "files",
        "results_reused",
        "tasks_without_baseline",
        "failed_samples",
        "metrics",
        "provenance",
        "memory_after_release",
        "placement",
    )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRecord:
        """A record from its JSON form (keys a newer version added and this one does not know are ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in names and value is not None}
        values.setdefault("arm_name", str(data.get("arm", "")))
        return cls(**values)

    @classmethod
    def read(cls, directory: str | os.PathLike) -> JobRecord:
        """The record in a job's output directory."""
        return cls.from_dict(read_json(Path(directory) / JOB_RECORD))

    @staticmethod
    def exists(directory: str | os.PathLike) -> bool:
        return (Path(directory) / JOB_RECORD).is_file()

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return {key: data[key] for key in self.ORDER}

    def write(self, directory: str | os.PathLike) -> Path:
        """Write the record into a job's output directory (atomically); returns its path."""
        path = Path(directory) / JOB_RECORD
        write_json(path, self.to_dict())
        return path

    @property
    def config_ids(self) -> set[str]:
        """This job's configuration and the baseline it compares with."""
        return {self.config_id, self.baseline_config_id}

    def cells(self) -> CellSelection:
        """The cells this job reports: its configuration and the baseline, its trials, in its save_dir."""
        return cells_of([self])


def cells_of(records: Sequence[JobRecord]) -> CellSelection:
    """The cells of jobs of one (model, suite, baseline): their configurations and the baseline, their trials, one
    save_dir per seed (a sweep's seeds pooled as further trials)."""
    first = records[0]
    trials = sorted({trial for record in records for trial in record.trial_ids})
    return CellSelection(
        save_dirs={record.seed: Path(record.save_dir) for record in records},
        config_ids=[record.config_id for record in records],
        baseline_config_id=first.baseline_config_id,
        suite=first.suite,
        model=first.model,
        trial_ids=trials or None,
        names={record.config_id: record.arm for record in records},
    )
