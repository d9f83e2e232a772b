"""Hydra callbacks: at the end of a multirun, aggregate every job of the sweep into paired deltas vs the baseline."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from steer_hydra.app.analysis import deltas_for, plot_job, pooled_samples
from steer_hydra.app.job import JOB_RECORD
from steer_hydra.app.plan import arm_names, to_plain
from steer_hydra.app.tracking import Tracker

logger = logging.getLogger(__name__)

AGGREGATE_DIR = "aggregate"


def aggregate_sweep(records: Sequence[dict[str, Any]], out_dir: Path, *, baseline: str) -> dict[str, Any]:
    """Paired deltas of each arm vs `baseline` per (model, suite), pooling seeds; writes CSVs and plots.

    The baseline may come from this sweep or from an earlier run into the same save_dirs. Returns the written
    paths and the per-arm summary for tracking.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], dict[str, Path]] = {}
    for record in records:
        groups.setdefault((record["model"], record["suite"]), {})[str(record["seed"])] = Path(record["save_dir"])
    all_deltas = []
    for (model, suite), save_dirs in sorted(groups.items()):
        names: dict[str, str] = {}
        for save_dir in save_dirs.values():
            names.update(arm_names(save_dir))
        frames = [f[f["suite"] == suite] for f in pooled_samples(save_dirs, names)]
        deltas = deltas_for([f for f in frames if not f.empty], baseline)
        if deltas.empty:
            logger.warning(
                "Sweep aggregate: no %r arm evaluated for model %s, suite %s in %s; run it once "
                "(arm=%s) to get paired deltas.",
                baseline,
                model,
                suite,
                sorted(map(str, save_dirs.values())),
                baseline,
            )
            continue
        all_deltas.append(deltas.assign(model=model, seeds=",".join(sorted(save_dirs))))
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
    summary.to_csv(out_dir / "summary.csv", index=False)
    deltas = pd.concat(all_deltas, ignore_index=True) if all_deltas else pd.DataFrame()
    paths: dict[str, Path] = {"summary": out_dir / "summary.csv"}
    if not deltas.empty:
        deltas.to_csv(out_dir / "paired_deltas.csv", index=False)
        paths["paired_deltas"] = out_dir / "paired_deltas.csv"
        results = metrics.rename(columns={"arm": "config"})
        parts = results["metric"].str.rsplit("/", n=3, expand=True)
        results = results.assign(suite=parts[0], task=parts[1], scorer=parts[2], metric=parts[3])
        paths.update({f"plot_{k}": v for k, v in plot_job(results, deltas, out_dir).items()})
    return {"paths": paths, "summary": summary, "deltas": deltas}


class SweepAggregator(Callback):
    """`on_multirun_end`: read every job record of the sweep, write `<sweep dir>/aggregate/`, log one W&B run."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        records = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob(f"*/{JOB_RECORD}"))]
        if not records:
            logger.warning("Sweep aggregate: no finished job under %s; nothing to aggregate.", sweep_dir)
            return
        out = aggregate_sweep(records, sweep_dir / AGGREGATE_DIR, baseline=str(config.baseline_arm))
        logger.info("Sweep aggregate of %d job(s) written to %s", len(records), sweep_dir / AGGREGATE_DIR)
        logger_cfg = to_plain(config.logger)
        if logger_cfg["kind"] == "none":
            return
        tracker = Tracker(
            project=logger_cfg["project"],
            entity=logger_cfg.get("entity"),
            mode=logger_cfg.get("mode"),
            directory=sweep_dir / AGGREGATE_DIR,
            name=f"{config.experiment_name}-sweep",
            group=str(config.experiment_name),
            job_type="sweep_summary",
            tags=["sweep_summary", *map(str, config.tags)],
            config={"jobs": len(records), "baseline_arm": str(config.baseline_arm)},
        ).start()
        exit_code = 1
        try:
            deltas = out["deltas"]
            summary = (
                {
                    "/".join(["delta", r.model, r.pipeline, r.suite, r.task.replace("/", "."), r.metric]): r.delta
                    for r in deltas.itertuples(index=False)
                }
                if not deltas.empty
                else {}
            )
            tracker.summary({"jobs": len(records), **summary})
            tracker.table("paired_deltas", deltas)
            tracker.table("summary", out["summary"])
            tracker.images({k: v for k, v in out["paths"].items() if k.startswith("plot_")})
            exit_code = 0
        finally:
            tracker.finish(exit_code)
