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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from steer_hydra.app.analysis import app_columns, deltas_for, plot_job, pooled_samples, tasks_without_baseline
from steer_hydra.app.files import read_json, write_csv, write_json
from steer_hydra.app.job import JOB_RECORD
from steer_hydra.app.plan import arm_names, to_plain
from steer_hydra.app.secrets import redact_overrides
from steer_hydra.app.tracking import Tracker

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


def expected_jobs(config: DictConfig) -> list[list[str]]:
    """Each job's overrides of the sweep `config` describes, in launch order (as Hydra's basic sweeper splits them)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

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
    for num, job in enumerate(expected_jobs(config)):
        shown = redact_overrides(job)
        if frozenset(shown) in finished:
            continue
        args = [*shown, *searchpath, f"hydra.run.dir={sweep_dir / f'{num}_rerun'}"]
        missing.append({"job": num, "overrides": shown, "command": shlex.join(["python", "-m", "steer_hydra", *args])})
    return missing


def aggregate_sweep(records: Sequence[dict[str, Any]], out_dir: Path) -> dict[str, Any]:
    """Paired deltas of each of the sweep's configurations vs the baseline per (model, suite), pooling seeds.

    Only the records' configurations and their baseline (`baseline_config_id`) are read from the save_dirs.
    Writes `summary.csv`, `paired_deltas.csv` and plots; returns the paths, frames and the tasks lacking a baseline.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for record in records:
        key = (record["model"], record["suite"], record.get("baseline_config_id", "baseline"))
        groups.setdefault(key, []).append(record)
    all_deltas, lacking = [], []
    for (model, suite, baseline_id), group in sorted(groups.items()):
        save_dirs = {str(r["seed"]): Path(r["save_dir"]) for r in group}
        config_ids = {r["config_id"] for r in group} | {baseline_id}
        names: dict[str, str] = {}
        for save_dir in save_dirs.values():
            names.update({k: v for k, v in arm_names(save_dir).items() if k in config_ids})
        names.update({r["config_id"]: r["arm"] for r in group})
        frames, cells = pooled_samples(save_dirs, names, config_ids, suite=suite)
        missing = tasks_without_baseline(cells, baseline_id) if not cells.empty else []
        lacking += [f"{model}/{task}" for task in missing]
        deltas = deltas_for(frames, baseline_id)
        if deltas.empty:
            logger.warning(
                "Sweep aggregate: no baseline (config_id %s) evaluated for model %s, suite %s in %s; run it once "
                "(arm=baseline) to get paired deltas.",
                baseline_id,
                model,
                suite,
                sorted(map(str, save_dirs.values())),
            )
            continue
        all_deltas.append(app_columns(deltas).assign(model=model, seeds=",".join(sorted(save_dirs))))
    metrics = pd.DataFrame(
        [
            {
                "arm": r["arm"],
                "config_id": r["config_id"],
                "model": r["model"],
                "suite": r["suite"],
                "seed": r["seed"],
                "metric": k,
                "value": v,
            }
            for r in records
            for k, v in r["metrics"].items()
        ]
    )
    summary = (
        metrics.groupby(["model", "suite", "arm", "config_id", "metric"], sort=True)["value"]
        .agg(mean="mean", std="std", n_seeds="count")
        .reset_index()
        if not metrics.empty
        else metrics
    )
    write_csv(summary, out_dir / "summary.csv")
    deltas = pd.concat(all_deltas, ignore_index=True) if all_deltas else pd.DataFrame()
    paths: dict[str, Path] = {"summary": out_dir / "summary.csv"}
    if not deltas.empty:
        write_csv(deltas, out_dir / "paired_deltas.csv")
        paths["paired_deltas"] = out_dir / "paired_deltas.csv"
        parts = metrics["metric"].str.rsplit("/", n=3, expand=True)
        results = metrics.assign(suite=parts[0], task=parts[1], scorer=parts[2], metric=parts[3])
        paths.update({f"plot_{k}": v for k, v in plot_job(results, deltas, out_dir).items()})
    return {"paths": paths, "summary": summary, "deltas": deltas, "tasks_without_baseline": lacking}


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
    logger.info("Sweep aggregate of %d job(s) written to %s", len(records), out_dir)
    logger_cfg = to_plain(OmegaConf.select(config, "logger") or {"kind": "none"})
    if track and logger_cfg.get("kind") != "none":
        _track(config, logger_cfg, out_dir, records, out)
    return out


def _track(
    config: DictConfig, logger_cfg: dict, out_dir: Path, records: Sequence[Mapping], out: Mapping[str, Any]
) -> None:
    tracker = Tracker.from_logger(
        logger_cfg,
        directory=out_dir,
        name=f"{config.experiment_name}-sweep",
        group=str(config.experiment_name),
        job_type="sweep_summary",
        tags=["sweep_summary", *map(str, config.tags)],
        config={"jobs": len(records), "missing_jobs": len(out["missing"]), "baseline_arm": str(config.baseline_arm)},
    ).start()
    exit_code = 1
    try:
        deltas = out["deltas"]
        summary = {
            "/".join(["delta", r.model, r.arm, r.suite, r.task.replace("/", "."), r.metric]): r.delta
            for r in deltas.itertuples(index=False)
        }
        tracker.summary({"jobs": len(records), "missing_jobs": len(out["missing"]), **summary})
        tracker.table("paired_deltas", deltas)
        tracker.table("summary", out["summary"])
        tracker.images({k: v for k, v in out["paths"].items() if k.startswith("plot_")})
        exit_code = 0
    finally:
        tracker.finish(exit_code)


class SweepAggregator(Callback):
    """Aggregate the sweep at `on_multirun_end`, or at exit when a failed job made Hydra skip that hook."""

    def __init__(self) -> None:
        self._pending: tuple[str, DictConfig] | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._pending = (str(config.hydra.sweep.dir), config)
        atexit.register(self._after_failure)

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
