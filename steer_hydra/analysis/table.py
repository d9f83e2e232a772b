"""The results table's rows (terminal, CSV and W&B alike): one row per (model, suite, task, scorer, metric, arm).

Each row holds the arm's value (mean over its trials and seeds), the scorer's stderr, `n` samples, and for every
arm but the baseline the paired delta vs the baseline with its 95% CI and the changed share (`analysis.stats`). The
rows come from the results frame (the logs' metrics) and the paired-deltas frame (`analysis.compare`); `delta_rows`
is the one place a delta's score column is matched to the metric it moves, so the table and the W&B keys agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd

SPREAD_METRICS = ("stderr", "std")
HEADLINE_METRICS = ("accuracy", "mean")  # what a per-sample score's mean is reported as by Inspect's scorers
TABLE_COLUMNS = (
    "model",
    "suite",
    "task",
    "scorer",
    "metric",
    "arm",
    "config_id",
    "value",
    "stderr",
    "n",
    "runs",
    "delta",
    "ci_low",
    "ci_high",
    "changed",
)


def _headline_metric(metrics: Sequence[str]) -> str | None:
    for name in HEADLINE_METRICS:
        if name in metrics:
            return name
    candidates = [m for m in metrics if m not in SPREAD_METRICS]
    return candidates[0] if candidates else None


def delta_rows(deltas: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Each paired delta located as `(suite, task, scorer, metric)` of the results it moves.

    A delta's score column is a scorer (`includes`: its per-sample mean is the scorer's `accuracy` or `mean`
    metric) or `scorer/key` for a dict-valued score (metric `key`). Returns columns `[model,] suite, task, scorer,
    metric, arm, config_id, delta, ci_low, ci_high, n_paired, changed`.
    """
    columns = ["suite", "task", "scorer", "metric", "arm", "config_id", "delta", "ci_low", "ci_high"]
    if deltas.empty:
        return pd.DataFrame(columns=[*columns, "n_paired", "changed"])
    keys = ["model", "suite", "task"] if "model" in deltas.columns and "model" in results.columns else ["suite", "task"]
    metrics_of: dict[tuple, list[str]] = {}
    for key, rows in results.groupby([*keys, "scorer"], sort=False) if not results.empty else []:
        metrics_of[tuple(key)] = list(dict.fromkeys(rows["metric"]))
    out = []
    for row in deltas.to_dict("records"):
        column = str(row["metric"])
        if "/" in column:
            scorer, metric = column.split("/", 1)
        else:
            scorer = column
            metric = _headline_metric(metrics_of.get((*[row[k] for k in keys], scorer), [])) or "mean"
        out.append(
            {
                **({"model": row["model"]} if "model" in keys else {}),
                "suite": row["suite"],
                "task": row["task"],
                "scorer": scorer,
                "metric": metric,
                "arm": row["arm"],
                "config_id": row["config_id"],
                "delta": row["delta"],
                "ci_low": row["ci_low"],
                "ci_high": row["ci_high"],
                "n_paired": row["n"],
                "changed": row.get("changed", math.nan),
            }
        )
    return pd.DataFrame(out)


def results_table(results: pd.DataFrame, deltas: pd.DataFrame, baseline_config_id: str) -> pd.DataFrame:
    """The results table (columns `TABLE_COLUMNS`, `model` only when `results` has it), baseline rows first.

    `results`: a results frame in the app's columns (`arm`, `config_id`, `suite`, `task`, `scorer`, `metric`,
    `value`, `n`), possibly several trials or seeds per arm (averaged; `runs` counts them). `deltas`: paired deltas
    (`analysis.stats.paired_deltas`).
    """
    keys = (["model"] if "model" in results.columns else []) + ["suite", "task", "scorer"]
    columns = [c for c in TABLE_COLUMNS if c != "model" or "model" in keys]
    if results.empty:
        return pd.DataFrame(columns=columns)
    main = results[~results["metric"].isin(SPREAD_METRICS)]
    values = (
        main.groupby([*keys, "metric", "arm", "config_id"], sort=False, dropna=False)
        .agg(value=("value", "mean"), n=("n", "max"), runs=("value", "count"))
        .reset_index()
    )
    spread = results[results["metric"] == "stderr"]
    stderr = spread.groupby([*keys, "arm", "config_id"], dropna=False)["value"].mean().rename("stderr").reset_index()
    table = values.merge(stderr, on=[*keys, "arm", "config_id"], how="left")
    located = delta_rows(deltas, results)
    if not located.empty:
        located = located.drop(columns=["arm", "n_paired"])
        table = table.merge(located, on=[*keys, "metric", "config_id"], how="left")
    for column in ("delta", "ci_low", "ci_high", "changed"):
        if column not in table.columns:
            table[column] = math.nan
    table["_base"] = table["config_id"] != baseline_config_id
    table = table.sort_values([*keys, "metric", "_base", "arm"], kind="stable").drop(columns="_base")
    return table[columns].reset_index(drop=True)
