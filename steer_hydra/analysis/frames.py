"""Results frames: run records turned into tidy pandas tables (one row per metric, cell, run or summary).

- `results_frame(results)`: one row per (arm, trial, suite, task, metric key) of a run's records;
- `runs_frame`: one row per (configuration, trial) with chosen metrics as columns;
- `cells_frame(results)`: one row per (arm, trial, suite, task) with its log, metrics or not;
- `summarize_runs`: mean/std/sem over trials.

Every frame names a run with the same columns (`RUN_ID_COLUMNS`): `arm` (the configuration's display name),
`config_id` (the key every selection and join uses), `trial_id`, `seed` (the seed the run was launched with) and
`trial_seed` (the seed derived per configuration and trial). Reading `.eval` logs (samples, results rebuilt from a
save_dir) is `analysis.logs`; paired statistics against the baseline are `analysis.stats`. Nothing here imports
Inspect.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

RUN_ID_COLUMNS = ("arm", "config_id", "trial_id", "seed", "trial_seed")
RESULT_COLUMNS = (*RUN_ID_COLUMNS, "suite", "task", "scorer", "metric", "value", "n", "failed", "log")
CELL_COLUMNS = (*RUN_ID_COLUMNS, "suite", "task", "log")
SAMPLE_ID_COLUMNS = (*RUN_ID_COLUMNS, "suite", "task", "sample_id")
SCORE_LETTERS = frozenset({"C", "I", "P", "N"})


def _run_ids(arm: str, record: Mapping[str, Any]) -> tuple[Any, ...]:
    """The `RUN_ID_COLUMNS` values of one run record."""
    return (arm, record["config_id"], record["trial_id"], record.get("seed"), record.get("trial_seed"))


# ---------------------------------------------------------------------------------------------- results frame
def results_frame(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> pd.DataFrame:
    """Flatten `{arm: [record, ...]}` (as `SteeringEval.run()` returns) into the results frame.

    Columns are exactly `RESULT_COLUMNS`; each metric key is split at its first "/" into scorer and metric. `n` counts
    the scored samples the metric is over, `failed` the samples whose generation or scoring failed (no score).
    """
    rows = []
    for arm, records in results.items():
        for record in records:
            for suite, tasks in (record.get("suites") or {}).items():
                for task, result in tasks.items():
                    for key, value in (result.get("metrics") or {}).items():
                        scorer, _, metric = key.partition("/")
                        if not metric:
                            scorer, metric = "", key
                        rows.append(
                            (
                                *_run_ids(arm, record),
                                *(suite, task, scorer, metric, value),
                                *(result.get("n"), result.get("failed", 0), result.get("log")),
                            )
                        )
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def cells_frame(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> pd.DataFrame:
    """One row per (arm, trial, suite, task) of `{arm: [record, ...]}` with its log; columns `CELL_COLUMNS`.

    Unlike the results frame, a task that reported no metrics (run with `score=False`) still has its row.
    """
    rows = [
        (*_run_ids(arm, record), suite, task, result.get("log"))
        for arm, records in results.items()
        for record in records
        for suite, tasks in (record.get("suites") or {}).items()
        for task, result in tasks.items()
    ]
    return pd.DataFrame(rows, columns=list(CELL_COLUMNS))


def _select(frame: pd.DataFrame, suite: str | None, task: str | None) -> pd.DataFrame:
    """Apply the suite/task filters, then require exactly one suite and one task."""
    selected = frame
    if suite is not None:
        selected = selected[selected["suite"] == suite]
    if task is not None:
        selected = selected[selected["task"] == task]
    if selected.empty:
        raise ValueError(
            f"No rows match suite={suite!r}, task={task!r}; available suites {sorted(frame['suite'].unique())}, "
            f"tasks {sorted(frame['task'].unique())}."
        )
    for column, given in (("suite", suite), ("task", task)):
        values = sorted(selected[column].unique())
        if given is None and len(values) > 1:
            raise ValueError(f"The results hold several {column}s {values}; select one with {column}=.")
    return selected


# ---------------------------------------------------------------------------------------------- runs frame
def _metric_rows(selected: pd.DataFrame, key: str) -> pd.DataFrame:
    keys = selected["scorer"].where(selected["scorer"] == "", selected["scorer"] + "/") + selected["metric"]
    available = sorted(keys.unique())
    if "/" in key:
        rows = selected[keys == key]
    else:
        rows = selected[selected["metric"] == key]
        scorers = sorted(rows["scorer"].unique())
        if len(scorers) > 1:
            options = [f"{s}/{key}" for s in scorers]
            raise KeyError(f"Metric {key!r} is ambiguous: several scorers report it; use one of {options}.")
    if rows.empty:
        raise KeyError(f"Metric {key!r} not found; available metric keys: {available}.")
    return rows


def runs_frame(
    results_df: pd.DataFrame, metrics: Sequence[str] | str, *, suite: str | None = None, task: str | None = None
) -> pd.DataFrame:
    """One row per run (a configuration's seed and trial): `RUN_ID_COLUMNS`, then each metric as a column.

    A metric key with "/" matches `scorer/metric`; a bare key matches the metric column (and must be unique
    across scorers). With several suites or tasks in the results, select one with `suite=` / `task=`.
    """
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if not metrics:
        raise ValueError("runs_frame needs at least one metric key, e.g. metrics=['accuracy'].")
    selected = _select(results_df, suite, task)
    index = list(RUN_ID_COLUMNS)
    merged: pd.DataFrame | None = None
    for key in metrics:
        rows = _metric_rows(selected, key)
        duplicated = rows.duplicated(index, keep=False)  # one run: a configuration's (seed, trial_id)
        if duplicated.any():
            dupes = rows.loc[duplicated, index].drop_duplicates().values.tolist()
            raise ValueError(f"Metric {key!r} has several rows for the run {tuple(index)} {dupes}.")
        part = rows[index + ["value"]].rename(columns={"value": key})
        merged = part if merged is None else merged.merge(part, on=index, how="outer")
    assert merged is not None
    merged = merged[[*RUN_ID_COLUMNS, *metrics]]
    return merged.sort_values(["arm", "config_id", "seed", "trial_id"], kind="stable").reset_index(drop=True)


def attach_params(
    frame: pd.DataFrame,
    params_by_config: Mapping[str, Mapping[str, Mapping[str, Any]]],
    params: Mapping[str, tuple[str, str]] | None,
) -> pd.DataFrame:
    """Add `{column: (spec, arg)}` columns mapping each row's config_id to `params[spec][arg]` (NaN when absent).

    A column whose present values are all numbers gets a numeric dtype; other values (lists...) stay raw.
    """
    if not params:
        return frame
    frame = frame.copy()
    for column, pair in params.items():
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise ValueError(f"params[{column!r}] must be a (spec_name, arg_name) pair; got {pair!r}.")
        spec, arg = pair
        values = [((params_by_config.get(cid) or {}).get(spec) or {}).get(arg, math.nan) for cid in frame["config_id"]]
        present = [v for v in values if not (isinstance(v, float) and math.isnan(v))]
        numeric = bool(present) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)
        frame[column] = pd.Series(values, index=frame.index, dtype=float if numeric else object)
    return frame


def summarize_runs(
    runs: pd.DataFrame,
    metric_cols: Sequence[str],
    group_cols: Sequence[str] = ("arm", "config_id"),
    param_cols: Sequence[str] = (),
) -> pd.DataFrame:
    """Mean, std (ddof=1), sem and `n_trials` of each metric per group; param columns carry their first value.

    Single-trial std and sem are 0.0. Param columns absent from `runs` are ignored.
    """
    metric_cols = list(metric_cols)
    if not metric_cols:
        raise ValueError("summarize_runs needs at least one metric column.")
    group_cols = list(group_cols)
    grouped = runs.groupby(group_cols, dropna=False, sort=True)
    parts = {}
    for metric in metric_cols:
        values = pd.to_numeric(runs[metric], errors="coerce")
        by = values.groupby([runs[c] for c in group_cols], dropna=False, sort=True)
        count = by.count()
        std = by.std(ddof=1).where(count > 1, 0.0).fillna(0.0)
        parts[f"{metric}_mean"] = by.mean()
        parts[f"{metric}_std"] = std
        parts[f"{metric}_sem"] = (std / np.sqrt(count.clip(lower=1))).where(count > 1, 0.0)
    summary = pd.DataFrame(parts)
    first = pd.to_numeric(runs[metric_cols[0]], errors="coerce")
    summary["n_trials"] = first.groupby([runs[c] for c in group_cols], dropna=False, sort=True).count()
    for column in param_cols:
        if column in runs.columns:
            summary[column] = grouped[column].first()
    summary = summary.reset_index()
    summary.columns = [*group_cols, *summary.columns[len(group_cols) :]]
    return summary
