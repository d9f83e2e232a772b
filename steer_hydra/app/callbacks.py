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
import logging
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

from hydra_plugins.steer_hydra_study.study_sweeper import LAUNCHED_FILE
from steer_hydra.app.analysis import (
    app_columns,
    deltas_for,
    plot_job,
    pooled_samples,
    summary_metrics,
    tasks_without_baseline,
)
from steer_hydra.app.files import read_json, write_csv, write_json
from steer_hydra.app.job import JOB_RECORD, delta_summary, sweep_id_of
from steer_hydra.app.plan import arm_names, to_plain
from steer_hydra.app.report import (
    changed_share,
    delta_rows,
    print_report,
    report_text,
    results_table,
    table_title,
    with_changed,
)
from steer_hydra.app.secrets import redact, redact_overrides
from steer_hydra.app.tracking import Tracker, wandb_key
from steer_hydra.evaluation.logs import results_from_logs

logger = logging.getLogger(__name__)

AGGREGATE_DIR = "aggregate"
MISSING_FILE = "missing_cells.json"


def job_records(sweep_dir: Path) -> list[dict[str, Any]]:
    """The job records under `sweep_dir/*/`, one per (model, suite, seed, config_id): a re-run's newest wins."""
    records: dict[tuple, dict[str, Any]] = {}
    for path in sorted(sweep_dir.glob(f"*/{JOB_RECORD}"), key=lambda p: p.stat().st_mtime):
        record = read_json(path)
        records[(record["model"], record["suite"], str(record["seed"]), record["config_id"])] = record
    return list(records.values())


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


def missing_jobs(config: DictConfig, records: Sequence[Mapping[str, Any]], sweep_dir: Path) -> list[dict[str, Any]]:
    """The sweep's jobs that left no record, each with the command that completes it into this sweep directory."""
    finished = {frozenset(redact_overrides(r.get("overrides") or [])) for r in records}
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


def job_results(record: Mapping[str, Any]) -> pd.DataFrame:
    """A job's results rows (app columns plus `model`), read from the results file its record names.

    A record without one (written by an older version) has its rows rebuilt from the save_dir's logs.
    """
    path = (record.get("files") or {}).get("results")
    if path and Path(path).is_file():
        frame = pd.read_csv(path, keep_default_na=False)  # an empty scorer name stays ""
        frame = frame.assign(value=pd.to_numeric(frame["value"], errors="coerce"))
        frame = frame.assign(n=pd.to_numeric(frame["n"], errors="coerce"))
    else:
        names = {record["config_id"]: record["arm"]}
        frame = app_columns(
            results_from_logs(Path(record["save_dir"]), names, config_ids=[record["config_id"]]), seed=record["seed"]
        )
        frame = frame[frame["suite"] == record["suite"]]
    if frame.empty:
        return frame
    frame = frame.assign(model=record["model"], arm=record["arm"], config_id=record["config_id"])
    return frame.astype({"suite": str, "task": str, "scorer": str, "metric": str})


def aggregate_sweep(records: Sequence[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Paired deltas of each of the sweep's configurations vs the baseline per (model, suite), pooling seeds.

    Metrics come from each job's results file (named in its job record); only the records' configurations and
    their baseline (`baseline_config_id`) are read from the save_dirs for the paired deltas. Writes `summary.csv`,
    `paired_deltas.csv`, `results_table.csv` and plots; returns the paths, frames, the results table and the tasks
    lacking a baseline.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        key = (record["model"], record["suite"], record.get("baseline_config_id", "baseline"))
        groups.setdefault(key, []).append(record)
    parts = [job_results(r) for r in records]
    results = pd.concat([p for p in parts if not p.empty], ignore_index=True) if any(len(p) for p in parts) else None
    results = results if results is not None else pd.DataFrame(columns=["model", "suite", "task", "scorer", "metric"])
    all_deltas, lacking, tables = [], [], []
    for (model, suite, baseline_id), group in sorted(groups.items()):
        save_dirs = {str(r["seed"]): Path(r["save_dir"]) for r in group}
        config_ids = {r["config_id"] for r in group} | {baseline_id}
        names: dict[str, str] = {}
        for save_dir in save_dirs.values():
            names.update({k: v for k, v in arm_names(save_dir).items() if k in config_ids})
        names.update({r["config_id"]: r["arm"] for r in group})
        frames, cells = pooled_samples(save_dirs, names, config_ids, suite=suite, include_text=True)
        missing = tasks_without_baseline(cells, baseline_id) if not cells.empty else []
        lacking += [f"{model}/{task}" for task in missing]
        deltas = deltas_for(frames, baseline_id)
        group_results = results[(results["model"] == model) & (results["suite"] == suite)]
        if deltas.empty:
            logger.warning(
                "Sweep aggregate: no baseline (config_id %s) evaluated for model %s, suite %s in %s; run it once "
                "(arm=baseline) to get paired deltas.",
                baseline_id,
                model,
                suite,
                sorted(map(str, save_dirs.values())),
            )
        else:
            deltas = app_columns(with_changed(deltas, changed_share(frames, baseline_id)))
            deltas = deltas.assign(model=model, seeds=",".join(sorted(save_dirs)))
            all_deltas.append(deltas)
        tables.append(results_table(group_results, deltas, baseline_id))
    summary = (
        results.groupby(["model", "suite", "task", "scorer", "metric", "arm", "config_id"], sort=True)["value"]
        .agg(mean="mean", std="std", n_runs="count")
        .reset_index()
        if not results.empty
        else pd.DataFrame()
    )
    write_csv(summary, out_dir / "summary.csv")
    deltas = pd.concat(all_deltas, ignore_index=True) if all_deltas else pd.DataFrame()
    table = pd.concat([t for t in tables if not t.empty], ignore_index=True) if any(len(t) for t in tables) else None
    table = table if table is not None else pd.DataFrame()
    write_csv(table, out_dir / "results_table.csv")
    paths: dict[str, Path] = {"summary": out_dir / "summary.csv", "results_table": out_dir / "results_table.csv"}
    if not deltas.empty:
        write_csv(deltas, out_dir / "paired_deltas.csv")
        paths["paired_deltas"] = out_dir / "paired_deltas.csv"
    if not results.empty:
        models = sorted(results["model"].unique())
        plots = plot_job(results, deltas, out_dir, model=", ".join(models))
        paths.update({f"plot_{k}": v for k, v in plots.items()})
    return {
        "paths": paths,
        "summary": summary,
        "deltas": deltas,
        "results": results,
        "table": table,
        "tasks_without_baseline": lacking,
    }


def aggregate_sweep_dir(sweep_dir: str | Path, config: DictConfig, *, track: bool = True) -> dict[str, Any] | None:
    """Aggregate the sweep in `sweep_dir` (its `config` as in `multirun.yaml`): finished jobs, missing cells, W&B."""
    sweep_dir = Path(sweep_dir).absolute()
    records = job_records(sweep_dir)
    missing = missing_jobs(config, records, sweep_dir)
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
    logger_cfg = to_plain(OmegaConf.select(config, "logger") or {"kind": "none"})
    notes = []
    if track and logger_cfg.get("kind") != "none":
        notes = _track(config, logger_cfg, out_dir, records, out)
    if missing:
        notes.append(f"{len(missing)} job(s) missing: see {out_dir / MISSING_FILE}")
    title = table_title(f"Sweep {sweep_dir.name}: {len(records)} job(s)", out["table"])
    print_report(report_text(out["table"], title=title, files=out["paths"], notes=notes))
    return out


def sweep_summary(results: pd.DataFrame, deltas: pd.DataFrame, model: str, config_id: str) -> dict[str, float]:
    """One (model, configuration)'s sweep summary under the job runs' keys: each metric's mean over the sweep's
    seeds and trials (`<suite>/<task>/<scorer>/<metric>`), and its pooled paired delta with the CI bounds."""
    own = results[(results["model"] == model) & (results["config_id"] == config_id)]
    out = summary_metrics(own)
    if not deltas.empty:
        rows = deltas[(deltas["model"] == model) & (deltas["config_id"] == config_id)]
        out.update(delta_summary(delta_rows(rows.drop(columns="model"), own.drop(columns="model"))))
    return out


def _track(
    config: DictConfig, logger_cfg: dict, out_dir: Path, records: Sequence[Mapping], out: Mapping[str, Any]
) -> list[str]:
    """One W&B summary run per (model, configuration) of the sweep, with the same keys as a job run of that
    configuration (pooled over seeds), the sweep's tables and plots, and the ids of the sweep's job runs.
    Returns where each run is (`Tracker.where`)."""
    results, deltas = out["results"], out["deltas"]
    sweep = sweep_id_of(config.hydra.sweep.dir) if OmegaConf.select(config, "hydra.sweep.dir") else None
    overrides = redact_overrides(list(OmegaConf.select(config, "hydra.overrides.task") or []))
    job_run_ids = [r.get("wandb_run_id") for r in records if r.get("wandb_run_id")]
    arms = results[["model", "arm", "config_id"]].drop_duplicates().itertuples(index=False) if len(results) else []
    where = []
    for model, arm, config_id in arms:
        tracker = Tracker.from_logger(
            logger_cfg,
            directory=out_dir / f"{model}-{config_id}",
            name=f"sweep-{arm}-{model}",
            group=str(config.experiment_name),
            job_type="sweep_summary",
            tags=["sweep_summary", arm, model, *map(str, config.tags)],
            config=redact(
                {
                    "config_id": config_id,
                    "sweep_id": sweep,
                    "overrides": overrides,
                    "arm": arm,
                    "model": model,
                    "baseline_arm": str(config.baseline_arm),
                    "jobs": len(records),
                    "missing_jobs": len(out["missing"]),
                }
            ),
        ).start()
        exit_code = 1
        try:
            tracker.summary(
                {
                    "jobs": len(records),
                    "missing_jobs": len(out["missing"]),
                    "arm": arm,
                    "config_id": config_id,
                    "job_run_ids": job_run_ids,
                    **sweep_summary(results, deltas, model, config_id),
                }
            )
            tracker.table(wandb_key("tables", "results"), out["table"])
            tracker.table(wandb_key("tables", "paired_deltas"), deltas)
            tracker.table(wandb_key("tables", "summary"), out["summary"])
            plots = {k.removeprefix("plot_"): v for k, v in out["paths"].items() if k.startswith("plot_")}
            tracker.images({wandb_key("plots", k): v for k, v in plots.items()})
            where.append(tracker.where())
            exit_code = 0
        finally:
            tracker.finish(exit_code)
    return [w for w in where if w]


@dataclass
class SweepProgress:
    """Jobs done out of the sweep's total, for a sweep whose jobs run in this process."""

    total: int
    sweep_dir: Path
    done: int = 0
    started: float = field(default_factory=time.monotonic)


class SweepAggregator(Callback):
    """Aggregate the sweep at `on_multirun_end`, or at exit when a failed job made Hydra skip that hook."""

    def __init__(self) -> None:
        self._pending: tuple[str, DictConfig] | None = None
        self._progress: SweepProgress | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = (str(config.hydra.sweep.dir), config)
        atexit.register(self._after_failure)
        try:
            self._progress = SweepProgress(len(expected_jobs(config)), Path(str(config.hydra.sweep.dir)))
        except Exception:  # noqa: BLE001 - progress lines only; a sweeper this cannot split shows none
            self._progress = None

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """A sweep whose jobs run in this process (the basic launcher): `Sweep: k/N job(s) done, ETA ...`."""
        progress = self._progress
        if progress is None:
            return
        launched = launched_jobs(progress.sweep_dir)  # a sweeper that plans as it goes: the jobs launched so far
        if launched is not None:
            progress.total = max(progress.total, len(launched))
        progress.done += 1
        elapsed = time.monotonic() - progress.started
        left = progress.total - progress.done
        eta = f", about {elapsed / progress.done * left:.0f}s left" if left > 0 else ""
        logger.info("Sweep: %d/%d job(s) done in %.0fs%s", progress.done, progress.total, elapsed, eta)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = None
        aggregate_sweep_dir(Path(config.hydra.sweep.dir), config)

    def _after_failure(self) -> None:
        if self._pending is None:
            return
        sweep_dir, config = self._pending
        self._pending = None
        logger.warning("Sweep %s ended with failed job(s): aggregating the jobs that finished.", sweep_dir)
        try:
            aggregate_sweep_dir(sweep_dir, config)
        except Exception:  # noqa: BLE001 - the process is exiting with the job's error already
            logger.exception("Sweep aggregate after failed jobs did not complete; run python -m steer_hydra.aggregate")
        sys.stderr.flush()
