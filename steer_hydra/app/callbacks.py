"""Sweep aggregation: paired deltas vs the baseline of exactly a sweep's configurations, also after failed jobs.

`SweepAggregator.on_multirun_end` aggregates every finished job of the sweep. Hydra skips `on_multirun_end` when
a job failed (its sweeper re-raises the job's error first), so the callback also registers, at
`on_multirun_start`, an exit handler that aggregates what finished and lists each missing cell with the command
that completes it. `python -m steer_hydra.aggregate <sweep dir>` re-aggregates any sweep from its directory
(`aggregate_sweep_dir`).

Selection: a sweep's aggregate holds the configurations its own jobs evaluated (by `config_id`) plus the
baseline, taken from the sweep or from an earlier run into the same save_dirs; never other configurations found
in the save_dirs.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.analysis.compare import Comparison, compare, write_files
from steer_hydra.app.job import sweep_id_of
from steer_hydra.app.records import JOB_RECORD, JobRecord, cells_of
from steer_hydra.app.report import print_report, report_text, table_title
from steer_hydra.app.results import delta_summary, summary_metrics, track
from steer_hydra.app.secrets import redact_overrides
from steer_hydra.app.tracking import wandb_key, wandb_run
from steer_hydra.core.files import read_json, write_csv, write_json
from steer_hydra.study import LAUNCHED_FILE, PLANNED_FILE

logger = logging.getLogger(__name__)

AGGREGATE_DIR = "aggregate"
MISSING_FILE = "missing_cells.json"


def all_job_records(sweep_dir: Path) -> list[JobRecord]:
    """Every job record under `sweep_dir/*/`, oldest first (two jobs may have evaluated the same cell)."""
    paths = sorted(sweep_dir.glob(f"*/{JOB_RECORD}"), key=lambda p: p.stat().st_mtime)
    return [JobRecord.read(path.parent) for path in paths]


def job_records(sweep_dir: Path) -> list[JobRecord]:
    """The job records under `sweep_dir/*/`, one per (model, suite, seed, config_id): a re-run's newest wins."""
    records = {(r.model, r.suite, str(r.seed), r.config_id): r for r in all_job_records(sweep_dir)}
    return list(records.values())


# Swept keys that never change a suite's protocol within one save_dir: the configuration (arm, its controls and the
# strength or concept they read), or the save_dir itself (model, seed, experiment name, output root); display keys.
SAFE_SWEEP_KEYS = frozenset(
    {"arm", "seed", "model", "experiment_name", "save_dir", "output_root", "strength", "concept", "tags", "progress"}
    | {"display", "logger", "residency", "fit_ahead", "baseline_arm"}
)
SAFE_SWEEP_PREFIXES = ("arm.", "logger.", "hydra.", "+arm.", "~arm.")


class SweepRefused(SystemExit):
    """A sweep refused before it launches anything, in one line (a SystemExit: Hydra turns a callback's exception
    into a warning and goes on)."""


def _swept_keys(jobs: Sequence[Sequence[str]]) -> list[str]:
    """The keys whose value differs between the jobs of a sweep."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for line in job:
            key, _, value = line.partition("=")
            values.setdefault(key.lstrip("+~"), set()).add(value)
    return sorted(key for key, seen in values.items() if len(seen) > 1)


def sweep_protocol_problem(config: DictConfig) -> str | None:
    """Why a sweep of Hydra's basic sweeper would evaluate one suite into one save_dir under two protocols (its second
    job would be refused, every job after it too, and their re-run commands again), or None. Composes and plans each
    job only when the sweep varies a key that may change the protocol (`SAFE_SWEEP_KEYS` never does)."""
    sweeper = str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
    if not sweeper.endswith("BasicSweeper"):
        return None  # the study sweeper plans its own jobs (and refuses other sweeps)
    try:
        jobs = expected_jobs(config)
    except Exception:  # noqa: BLE001 - a sweep this cannot split is left to Hydra
        return None
    risky = [k for k in _swept_keys(jobs) if k not in SAFE_SWEEP_KEYS and not k.startswith(SAFE_SWEEP_PREFIXES)]
    if not risky:
        return None
    from steer_hydra.app.compose import compose_config
    from steer_hydra.app.plan import JobPlan
    from steer_hydra.store.comparable import changed_leaves

    seen: dict[tuple[str, str], tuple[dict[str, Any], list[str]]] = {}
    for job in jobs:
        try:
            plan = JobPlan.from_config(compose_config(list(job)))
            cell, protocol = (str(plan.save_dir), plan.suite.name), plan.protocol()
        except Exception:  # noqa: BLE001 - a job that cannot be planned refuses itself, naming the fix
            continue
        if cell not in seen:
            seen[cell] = (protocol, list(job))
            continue
        changed = changed_leaves(seen[cell][0], protocol)
        if changed:
            return (
                f"it evaluates suite {cell[1]!r} into one save_dir ({cell[0]}) under different protocols "
                f"({'; '.join(changed[:3])}), from the swept {', '.join(risky)}: every job after the first would be "
                f"refused. Fix: run one command per value of {', '.join(risky)}, each with its own experiment_name "
                f"(e.g. {risky[0]}=<value> experiment_name=<name>_<value>), so each value has its own save_dir."
            )
    return None


UNTOUCHED_SWEEP = frozenset({"multirun.yaml"})  # what a sweep folder holds when no job of it started


def any_job_started(sweep_dir: Path) -> bool:
    """Whether a job of the sweep started: a job folder (`<num>_*/`) with its config copies, log or record."""
    return any(
        folder.is_dir() and any((folder / name).exists() for name in (".hydra", "main.log", JOB_RECORD))
        for folder in sweep_dir.glob("*_*")
    )


def remove_if_untouched(sweep_dir: Path) -> None:
    """Remove a sweep folder that holds nothing but what Hydra wrote before launching (`multirun.yaml`)."""
    try:
        entries = list(sweep_dir.iterdir())
    except OSError:
        return
    if entries and {entry.name for entry in entries} <= UNTOUCHED_SWEEP and all(e.is_file() for e in entries):
        for entry in entries:
            entry.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            sweep_dir.rmdir()


def launched_jobs(sweep_dir: Path) -> list[list[str]] | None:
    """The jobs a sweeper that plans as it goes (the study sweeper) has launched so far (`launched_jobs.json`), in
    launch order; None for a sweep without that file."""
    path = sweep_dir / LAUNCHED_FILE
    return [list(job) for job in read_json(path)] if path.is_file() else None


def expected_jobs(config: DictConfig, sweep_dir: Path | None = None) -> list[list[str]]:
    """Each job's overrides of the sweep `config` describes, in launch order (as Hydra's basic sweeper splits them),
    or those a sweeper that plans as it goes has launched (`launched_jobs`)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    sweep_dir = sweep_dir if sweep_dir is not None else Path(str(OmegaConf.select(config, "hydra.sweep.dir") or "."))
    launched = launched_jobs(sweep_dir)
    if launched is not None:
        return launched
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    arguments = [f"{k}={v}" for k, v in params.items()] + list(OmegaConf.select(config, "hydra.overrides.task") or [])
    parsed = OverridesParser.create().parse_overrides(arguments)
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def missing_jobs(config: DictConfig, records: Sequence[JobRecord], sweep_dir: Path) -> list[dict[str, Any]]:
    """The sweep's jobs that left no record among `records` (every record: jobs that evaluated the same cell, e.g. a
    study's baseline on a cost suite for each concept, each count), each with the command that completes it into
    this sweep directory."""
    finished = {frozenset(redact_overrides(r.overrides)) for r in records}
    searchpath = [
        o for o in OmegaConf.select(config, "hydra.overrides.hydra") or [] if o.startswith("hydra.searchpath")
    ]
    missing = []
    for num, job in enumerate(expected_jobs(config, sweep_dir)):
        shown = redact_overrides(job)
        if frozenset(shown) in finished:
            continue
        args = [*shown, *searchpath, f"hydra.run.dir={sweep_dir / f'{num}_rerun'}"]
        missing.append({"job": num, "overrides": shown, "command": shlex.join(["python", "-m", "steer_hydra", *args])})
    return missing


def aggregate_sweep(records: Sequence[JobRecord], out_dir: Path) -> dict[str, Any]:
    """Paired deltas of each of the sweep's configurations vs the baseline per (model, suite), pooling seeds.

    Only the records' configurations, their trials and their baseline (`baseline_config_id`) are read from the
    save_dirs (`analysis.compare`). Writes the results path's files (`results.csv`, `samples.csv`,
    `paired_deltas.csv`, `results_table.csv`, plots) and `summary.csv` (each metric's mean, std and runs over the
    sweep's seeds and trials); returns the paths, the comparison and the summary.
    """
    groups: dict[tuple[str, str, str], list[JobRecord]] = {}
    for record in records:
        groups.setdefault((record.model, record.suite, record.baseline_config_id), []).append(record)
    parts = []
    for (model, suite, baseline_id), group in sorted(groups.items()):
        selection = cells_of(group)
        part = compare(selection)
        if part.deltas.empty and any(r.config_id != baseline_id for r in group):
            logger.warning(
                "Sweep aggregate: no baseline (config_id %s) evaluated for model %s, suite %s in %s; run it once "
                "(arm=baseline) to get paired deltas.",
                baseline_id,
                model,
                suite,
                sorted(map(str, selection.save_dirs.values())),
            )
        parts.append(part)
    comparison = Comparison.combine(parts)
    paths = write_files(comparison, out_dir)
    results = comparison.results
    keys = ["model", "suite", "task", "scorer", "metric", "arm", "config_id"]
    summary = (
        results.groupby(keys, sort=True)["value"].agg(mean="mean", std="std", n_runs="count").reset_index()
        if not results.empty
        else pd.DataFrame(columns=[*keys, "mean", "std", "n_runs"])
    )
    paths["summary"] = out_dir / "summary.csv"
    write_csv(summary, paths["summary"])
    return {"paths": paths, "comparison": comparison, "summary": summary}


def aggregate_sweep_dir(sweep_dir: str | Path, config: DictConfig, *, track: bool = True) -> dict[str, Any] | None:
    """Aggregate the sweep in `sweep_dir` (its `config` as in `multirun.yaml`): finished jobs, missing cells, W&B."""
    sweep_dir = Path(sweep_dir).absolute()
    records = job_records(sweep_dir)
    missing = missing_jobs(config, all_job_records(sweep_dir), sweep_dir)
    out_dir = sweep_dir / AGGREGATE_DIR
    write_json(out_dir / MISSING_FILE, missing)
    if missing:
        logger.warning(
            "Sweep %s: %d of %d job(s) left no results. Complete each, then re-aggregate with "
            "`python -m steer_hydra.aggregate %s`:\n%s",
            sweep_dir,
            len(missing),
            len(missing) + len(records),
            sweep_dir,
            "\n".join(f"  {m['command']}" for m in missing),
        )
    if not records:
        logger.warning("Sweep aggregate: no finished job under %s; nothing to aggregate.", sweep_dir)
        return None
    out = aggregate_sweep(records, out_dir)
    out["missing"] = missing
    notes = _track(config, out_dir, records, out) if track else []
    if missing:
        notes.append(f"{len(missing)} job(s) missing: see {out_dir / MISSING_FILE}")
    table = out["comparison"].table
    if launched_jobs(sweep_dir) is not None:  # a study's sweep: its own report, printed before, is the summary
        files = ", ".join(sorted(Path(p).name for p in out["paths"].values() if p is not None and Path(p).exists()))
        first = f"Sweep {sweep_dir.name}: {len(records)} job(s), every configuration vs the baseline in {out_dir}: "
        print_report("\n".join([first + files, *notes]))
        return out
    title = table_title(f"Sweep {sweep_dir.name}: {len(records)} job(s)", table)
    print_report(report_text(table, title=title, files=out["paths"], notes=notes))
    return out


def sweep_summary(comparison: Comparison, model: str, config_id: str) -> dict[str, float]:
    """One (model, configuration)'s sweep summary under the job runs' keys: each metric's mean over the sweep's
    seeds and trials (`<suite>/<task>/<scorer>/<metric>`), and its pooled paired delta with the CI bounds."""
    results, deltas = comparison.results, comparison.deltas
    own = results[(results["model"] == model) & (results["config_id"] == config_id)]
    out = summary_metrics(own)
    if not deltas.empty:
        out.update(delta_summary(deltas[(deltas["model"] == model) & (deltas["config_id"] == config_id)], own))
    return out


def _track(config: DictConfig, out_dir: Path, records: Sequence[JobRecord], out: Mapping[str, Any]) -> list[str]:
    """One W&B summary run per (model, configuration) of the sweep, with the same keys as a job run of that
    configuration (pooled over seeds), the sweep's tables and plots, and the ids of the sweep's job runs.
    Returns where each run is (`Tracker.where`)."""
    comparison = out["comparison"]
    results = comparison.results
    sweep = sweep_id_of(config.hydra.sweep.dir) if OmegaConf.select(config, "hydra.sweep.dir") else None
    overrides = redact_overrides(list(OmegaConf.select(config, "hydra.overrides.task") or []))
    job_run_ids = [r.wandb_run_id for r in records if r.wandb_run_id]
    arms = results[["model", "arm", "config_id"]].drop_duplicates().itertuples(index=False) if len(results) else []
    where = []
    for model, arm, config_id in arms:
        run = wandb_run(
            config,
            directory=out_dir / f"{model}-{config_id}",
            name=f"sweep-{arm}-{model}",
            job_type="sweep_summary",
            tags=["sweep_summary", arm, model],
            run_config={
                "config_id": config_id,
                "sweep_id": sweep,
                "overrides": overrides,
                "arm": arm,
                "model": model,
                "baseline_arm": str(config.baseline_arm),
                "jobs": len(records),
                "missing_jobs": len(out["missing"]),
            },
        )
        with run as tracker:
            if tracker is None:
                return []
            tracker.summary(
                {
                    "jobs": len(records),
                    "missing_jobs": len(out["missing"]),
                    "arm": arm,
                    "config_id": config_id,
                    "job_run_ids": job_run_ids,
                    **sweep_summary(comparison, model, config_id),
                }
            )
            track(tracker, comparison.table, comparison.deltas, out["paths"])
            tracker.table(wandb_key("tables", "summary"), out["summary"])
            where.append(tracker.where())
    return [w for w in where if w]


@dataclass
class SweepProgress:
    """Jobs done out of the sweep's total; a study's total is its whole plan (`planned_jobs.json`: each phase's job
    count, written before its first job), its phases in order. In the process that launched the sweep it counts its
    own jobs; in a launcher's worker process (a copy pickled there: joblib, Ray) it counts the job records written
    into the sweep dir since the sweep began, since the jobs finish in several processes."""

    total: int
    sweep_dir: Path
    done: int = 0
    started: float = field(default_factory=time.time)  # wall clock: a worker process reads it too
    pid: int = field(default_factory=os.getpid)  # a launcher that pickles the callback to its workers: not there
    phases: dict[str, int] = field(default_factory=dict)  # a study's jobs per phase, in launch order

    def recorded(self) -> int:
        """Jobs whose record was written into the sweep dir since the sweep began (in any process)."""
        return sum(1 for p in self.sweep_dir.glob(f"*/{JOB_RECORD}") if p.stat().st_mtime >= self.started)

    def job_done(self) -> str:
        """Count one more job done (in a worker process: the records so far); the progress line:
        `Sweep: k/N job(s) done (<phase> i/n) in Ts, about Ts left`."""
        if not self.phases:  # a study's plan is read once: written before its first job, it never changes
            planned = self.sweep_dir / PLANNED_FILE
            if planned.is_file():
                self.phases = {str(k): int(v) for k, v in read_json(planned).items()}
                self.total = sum(self.phases.values())
            elif (launched := launched_jobs(self.sweep_dir)) is not None:  # else the jobs launched so far, if listed
                self.total = max(self.total, len(launched))
        self.done = self.done + 1 if self.pid == os.getpid() else max(self.recorded(), 1)
        self.total = max(self.total, self.done)
        phase, before = "", 0
        for name, count in self.phases.items():
            if self.done <= before + count:
                phase = f" ({name} {self.done - before}/{count})"
                break
            before += count
        elapsed = max(time.time() - self.started, 0.0)
        left = self.total - self.done
        eta = f", about {elapsed / self.done * left:.0f}s left" if left > 0 else ""
        return f"Sweep: {self.done}/{self.total} job(s) done{phase} in {elapsed:.0f}s{eta}"


class SweepAggregator(Callback):
    """Aggregate the sweep at `on_multirun_end`, or at exit when a failed job made Hydra skip that hook."""

    def __init__(self) -> None:
        self._pending: tuple[str, DictConfig] | None = None
        self._progress: SweepProgress | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        problem = sweep_protocol_problem(config)  # before anything is launched or registered
        if problem is not None:
            raise SweepRefused(f"steer_hydra: invalid sweep: {problem}")
        self._pending = (str(config.hydra.sweep.dir), config)
        atexit.register(self._after_failure)
        try:
            self._progress = SweepProgress(len(expected_jobs(config)), Path(str(config.hydra.sweep.dir)))
        except Exception:  # noqa: BLE001 - progress lines only; a sweeper this cannot split shows none
            self._progress = None

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """`Sweep: k/N job(s) done, ETA ...`, from whichever process ran the job."""
        if self._progress is not None:
            logger.info("%s", self._progress.job_done())

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = None
        aggregate_sweep_dir(Path(config.hydra.sweep.dir), config)

    def _after_failure(self) -> None:
        if self._pending is None:
            return
        sweep_dir, config = self._pending
        self._pending = None
        if not any_job_started(Path(sweep_dir)):  # refused before launching (a launcher, a sweeper): nothing to say
            remove_if_untouched(Path(sweep_dir))
            return
        logger.warning("Sweep %s ended with failed job(s): aggregating the jobs that finished.", sweep_dir)
        try:
            aggregate_sweep_dir(sweep_dir, config)
        except Exception:  # noqa: BLE001 - the process is exiting with the job's error already
            logger.exception("Sweep aggregate after failed jobs did not complete; run python -m steer_hydra.aggregate")
        sys.stderr.flush()
