"""What a job or a sweep logs to W&B from a comparison (`analysis.compare`): summary keys that equal the results
table's rows, and the tables and plots themselves."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from steer_hydra.analysis.table import delta_rows
from steer_hydra.app.tracking import Tracker, wandb_key


def summary_metrics(results: pd.DataFrame) -> dict[str, float]:
    """Each (suite, task, scorer, metric) averaged over the runs in `results`, keyed `<suite>/<task>/<scorer>/<metric>`
    (`tracking.wandb_key`)."""
    if results.empty:
        return {}
    means = results.groupby(["suite", "task", "scorer", "metric"], sort=True)["value"].mean()
    return {wandb_key(None, *key): float(value) for key, value in means.items() if value is not None}


def delta_summary(deltas: pd.DataFrame, results: pd.DataFrame) -> dict[str, float]:
    """`delta/<key>`, `delta_ci_low/<key>`, `delta_ci_high/<key>` of each paired delta, located on the metric it
    moves (`table.delta_rows`), so W&B keys equal the results table's rows."""
    out: dict[str, float] = {}
    for row in delta_rows(deltas, results).to_dict("records"):
        parts = (row["suite"], row["task"], row["scorer"], row["metric"])
        for section, column in (("delta", "delta"), ("delta_ci_low", "ci_low"), ("delta_ci_high", "ci_high")):
            out[wandb_key(section, *parts)] = float(row[column])
    return out


def track(tracker: Tracker | None, table: pd.DataFrame, deltas: pd.DataFrame, files: Mapping[str, Path]) -> None:
    """Log the results table, the paired deltas and the plots among `files` to W&B (nothing without a tracker)."""
    if tracker is None:
        return
    tracker.table(wandb_key("tables", "results"), table)
    tracker.table(wandb_key("tables", "paired_deltas"), deltas)
    plots = {name.removeprefix("plot_"): path for name, path in files.items() if name.startswith("plot_")}
    tracker.images({wandb_key("plots", name): path for name, path in plots.items()})
