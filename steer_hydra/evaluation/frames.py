"""Results frames: run records and `.eval` logs turned into tidy pandas frames, and paired deltas vs the baseline.

- `results_frame(results)`: one row per (config, trial, suite, task, metric key) of a run's records;
- `runs_frame`: one row per (configuration, trial) with chosen metrics as columns;
- `cells_frame(results)`: one row per (config, trial, suite, task) with its log, metrics or not;
- `samples_frame`: one row per sample, scores joined to sample metadata, read from the `.eval` logs of the cells
  (so a run without metrics, e.g. `score=False`, still gives its samples);
- `summarize_runs`: mean/std/sem over trials;
- `paired_deltas`: per-sample paired differences of each arm against the baseline on identical samples, with a
  seeded paired-bootstrap confidence interval;
- `results_from_logs` / `cells_from_logs`: the results and cells frames rebuilt from a `save_dir` alone, for all
  configurations or the given `config_ids` (the `success` log per task wins; superseded partial logs of an
  interrupted run are ignored).

Inspect is imported lazily (only when logs are read), so frames built from records need no Inspect.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from statistics import NormalDist
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pandas as pd

logger = logging.getLogger(__name__)

RESULT_COLUMNS = (
    *("config", "config_id", "trial", "seed", "suite", "task"),
    *("scorer", "metric", "value", "n", "failed", "log"),
)
CELL_COLUMNS = ("config", "config_id", "trial", "seed", "suite", "task", "log")
RUN_ID_COLUMNS = ("pipeline", "config_id", "trial_id", "seed")
SAMPLE_ID_COLUMNS = ("pipeline", "config_id", "trial_id", "seed", "suite", "task", "sample_id")
SCORE_LETTERS = frozenset({"C", "I", "P", "N"})
DELTA_METHODS = ("bootstrap", "normal")


# ---------------------------------------------------------------------------------------------- results frame
def results_frame(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> pd.DataFrame:
    """Flatten `{name: [record, ...]}` (as `SteeringEval.run()` returns) into the results frame.

    Columns are exactly `RESULT_COLUMNS`; each metric key is split at its first "/" into scorer and metric. `n` counts
    the scored samples the metric is over, `failed` the samples whose generation or scoring failed (no score).
    """
    rows = []
    for config, records in results.items():
        for record in records:
            for suite, tasks in (record.get("suites") or {}).items():
                for task, result in tasks.items():
                    for key, value in (result.get("metrics") or {}).items():
                        scorer, _, metric = key.partition("/")
                        if not metric:
                            scorer, metric = "", key
                        rows.append(
                            (
                                config,
                                record["config_id"],
                                record["trial_id"],
                                record.get("seed"),
                                suite,
                                task,
                                scorer,
                                metric,
                                value,
                                result.get("n"),
                                result.get("failed", 0),
                                result.get("log"),
                            )
                        )
    return pd.DataFrame(rows, columns=list(RESULT_COLUMNS))


def cells_frame(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> pd.DataFrame:
    """One row per (config, trial, suite, task) of `{name: [record, ...]}` with its log; columns `CELL_COLUMNS`.

    Unlike the results frame, a task that reported no metrics (run with `score=False`) still has its row.
    """
    rows = [
        (config, record["config_id"], record["trial_id"], record.get("seed"), suite, task, result.get("log"))
        for config, records in results.items()
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
    """One row per (configuration, trial): `pipeline, config_id, trial_id, seed`, then each metric as a column.

    A metric key with "/" matches `scorer/metric`; a bare key matches the metric column (and must be unique
    across scorers). With several suites or tasks in the results, select one with `suite=` / `task=`.
    """
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if not metrics:
        raise ValueError("runs_frame needs at least one metric key, e.g. metrics=['accuracy'].")
    selected = _select(results_df, suite, task)
    index = ["config", "config_id", "trial", "seed"]
    merged: pd.DataFrame | None = None
    for key in metrics:
        rows = _metric_rows(selected, key)
        duplicated = rows.duplicated(["config", "config_id", "trial"], keep=False)
        if duplicated.any():
            dupes = rows.loc[duplicated, ["config", "config_id", "trial"]].drop_duplicates().values.tolist()
            raise ValueError(f"Metric {key!r} has several rows for (config, config_id, trial) {dupes}.")
        part = rows[index + ["value"]].rename(columns={"value": key})
        merged = part if merged is None else merged.merge(part, on=index, how="outer")
    assert merged is not None
    merged = merged.rename(columns={"config": "pipeline", "trial": "trial_id"})
    merged = merged[[*RUN_ID_COLUMNS, *metrics]]
    return merged.sort_values(["pipeline", "config_id", "trial_id"], kind="stable").reset_index(drop=True)


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
    group_cols: Sequence[str] = ("pipeline", "config_id"),
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


# ---------------------------------------------------------------------------------------------- samples frame
def _read_eval_log(path: str) -> Any:
    """Read one `.eval` log with its samples (the tests replace this)."""
    from inspect_ai.log import read_eval_log

    return read_eval_log(path)


def resolve_log_path(log: str, log_root: str | Path | None) -> str:
    """A relative log location resolved under `log_root`; absolute paths and URIs unchanged."""
    if not log:
        raise ValueError("A results row has no log location; was the run completed?")
    if urlparse(log).scheme not in ("", "file") and not re.match(r"^[A-Za-z]:[\\/]", log):
        return log
    path = Path(log)
    if path.is_absolute() or log_root is None:
        return str(path)
    return str(Path(log_root) / path)


def _score_value(value: Any) -> Any:
    """Numbers, bools and the letters C/I/P/N through `value_to_float`; other values raw."""
    if isinstance(value, (bool, int, float)) or (isinstance(value, str) and value in SCORE_LETTERS):
        from inspect_ai.scorer import value_to_float

        return value_to_float()(value)
    return value


def _sample_score(sample: Any, key: str, log: str) -> Any:
    scores = getattr(sample, "scores", None) or {}
    if key in scores:
        return _score_value(scores[key].value)
    scorer, sep, dict_key = key.partition("/")
    if scorer not in scores:
        raise KeyError(f"Scorer {scorer!r} not found in {log} (sample {sample.id}); scorers: {sorted(scores)}.")
    value = scores[scorer].value
    if not sep:
        return _score_value(value)
    if not isinstance(value, Mapping) or dict_key not in value:
        raise KeyError(
            f"Score key {dict_key!r} is absent from scorer {scorer!r} in {log} (sample {sample.id}); "
            f"its value is {value!r}."
        )
    return _score_value(value[dict_key])


def _input_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(str(getattr(m, "text", m)) for m in value or [])


def _sort_samples(frame: pd.DataFrame, by: Sequence[str]) -> pd.DataFrame:
    def key(series: pd.Series) -> pd.Series:
        if series.name == "sample_id" and series.map(type).nunique() > 1:
            return series.astype(str)
        return series

    return frame.sort_values(list(by), kind="stable", key=key).reset_index(drop=True)


def _column_values(values: list[Any]) -> pd.Series:
    """Floats become a float column; anything else (None, lists, dicts, strings) is kept raw in an object column."""
    if values and all(isinstance(v, float) for v in values):
        return pd.Series(values, dtype=float)
    return pd.Series(values, dtype=object)


def samples_frame(
    results: pd.DataFrame,
    log_root: str | Path | None,
    *,
    scores: Sequence[str] | str | None,
    metadata_keys: Sequence[str] = (),
    suite: str | None = None,
    task: str | None = None,
    include_text: bool = False,
) -> pd.DataFrame:
    """One row per sample of the selected (suite, task), for every configuration and trial, read from the logs.

    `results` is a results frame or a cells frame (`cells_frame`, `cells_from_logs`): only its cells and their log
    locations are used. Columns: `pipeline, config_id, trial_id, seed, suite, task, sample_id`, then
    `metadata_keys` (None when a sample lacks one), then the score columns (`"scorer"` or `"scorer/dictkey"`;
    `scores=None` takes every scorer the samples hold, in first-seen order, and none for an unscored run), then
    `input` and `completion` with `include_text=True`. A sample that failed (its `error` is set) has None scores.
    Relative log locations resolve under `log_root`.
    """
    if scores is not None:
        scores = [scores] if isinstance(scores, str) else list(scores)
        if not scores:
            raise ValueError("samples_frame needs at least one score key, e.g. scores=['includes'] (or scores=None).")
    selected = _select(results, suite, task)
    cells = selected[list(CELL_COLUMNS)].drop_duplicates(["config", "config_id", "trial", "suite", "task"])
    rows = []
    found: dict[str, None] = {}
    for cell in cells.itertuples(index=False):
        path = resolve_log_path(cell.log, log_root)
        log = _read_eval_log(path)
        for sample in getattr(log, "samples", None) or []:
            metadata = getattr(sample, "metadata", None) or {}
            row: dict[str, Any] = {
                "pipeline": cell.config,
                "config_id": cell.config_id,
                "trial_id": cell.trial,
                "seed": cell.seed,
                "suite": cell.suite,
                "task": cell.task,
                "sample_id": sample.id,
            }
            for key in metadata_keys:
                row[key] = metadata.get(key)
            for key in scores if scores is not None else list(getattr(sample, "scores", None) or {}):
                found.setdefault(key)
                row[key] = _sample_score_or_none(sample, key, path)
            if include_text:
                output = getattr(sample, "output", None)
                row["input"] = _input_text(sample.input)
                row["completion"] = getattr(output, "completion", None)
            rows.append(row)
    score_columns = scores if scores is not None else list(found)
    columns = [*SAMPLE_ID_COLUMNS, *metadata_keys, *score_columns] + (["input", "completion"] if include_text else [])
    data = {c: pd.Series([row[c] for row in rows]) for c in SAMPLE_ID_COLUMNS}
    data.update({c: _column_values([row.get(c) for row in rows]) for c in columns[len(SAMPLE_ID_COLUMNS) :]})
    frame = pd.DataFrame(data, columns=columns)
    return _sort_samples(frame, ["pipeline", "config_id", "trial_id", "sample_id"])


def failed_samples(cells: pd.DataFrame, log_root: str | Path | None) -> pd.DataFrame:
    """One row per sample whose generation or scoring failed in the cells' logs: `config, config_id, trial, suite,
    task, sample_id, error` (the first line of Inspect's error message)."""
    rows = []
    for cell in cells[list(CELL_COLUMNS)].drop_duplicates(["config_id", "trial", "suite", "task"]).itertuples():
        log = _read_eval_log(resolve_log_path(cell.log, log_root))
        for sample in getattr(log, "samples", None) or []:
            error = getattr(sample, "error", None)
            if error is not None:
                message = str(getattr(error, "message", error)).strip().splitlines()
                rows.append(
                    (cell.config, cell.config_id, cell.trial, cell.suite, cell.task, sample.id, (message or [""])[0])
                )
    return pd.DataFrame(rows, columns=["config", "config_id", "trial", "suite", "task", "sample_id", "error"])


def _sample_score_or_none(sample: Any, key: str, log: str) -> Any:
    """`_sample_score`, with None where a failed sample has no score for `key`."""
    if getattr(sample, "error", None) is not None and key.partition("/")[0] not in (
        getattr(sample, "scores", None) or {}
    ):
        return None
    return _sample_score(sample, key, log)


# ---------------------------------------------------------------------------------------------- paired deltas
def _bootstrap_ci(diffs: np.ndarray, confidence: float, n_resamples: int, seed: int) -> tuple[float, float]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, diffs.size, size=(n_resamples, diffs.size))
    means = diffs[idx].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def _normal_ci(diffs: np.ndarray, confidence: float) -> tuple[float, float]:
    mean = float(diffs.mean())
    se = float(diffs.std(ddof=1) / math.sqrt(diffs.size))
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return mean - z * se, mean + z * se


def paired_deltas(
    samples: pd.DataFrame,
    scores: Sequence[str] | str,
    *,
    baseline: str = "baseline",
    confidence: float = 0.95,
    method: str = "bootstrap",
    n_resamples: int = 10_000,
    seed: int = 0,
    group_cols: Sequence[str] = ("suite", "task"),
) -> pd.DataFrame:
    """Paired per-sample differences of every arm against the baseline, per (suite, task, metric).

    Method: each sample's score is first averaged over the trials of its arm (trials are repeated measurements
    of the same sample, so trials and seeds are pooled per sample); the arm's per-sample means are then paired
    with the baseline's on the samples both hold (same `sample_id`), and `delta` is the mean of the paired
    differences. The confidence interval is a **paired percentile bootstrap** over samples (`n_resamples`
    resamples of the sample set with replacement, `numpy.random.default_rng(seed)`, fresh per row, so a row's
    interval does not depend on which other arms are present); `method="normal"` gives the normal-approximation
    interval `delta +/- z * sd / sqrt(n)` instead. With one pair the interval is NaN.

    Args:
        samples: a samples frame (`samples_frame`), possibly concatenated over several tasks or suites.
        scores: the numeric score columns to compare.
        baseline: the baseline arm, matched against `pipeline` (or else `config_id`).

    Returns:
        One row per (arm, config_id, *group_cols, metric): `n` (paired samples), `baseline_mean`, `arm_mean`,
        `delta`, `ci_low`, `ci_high`, `se` (sd of differences / sqrt(n)), `n_trials`, `n_trials_baseline`,
        `confidence` and `method`. Samples one side lacks are left out (and logged).
    """
    scores = [scores] if isinstance(scores, str) else list(scores)
    if not scores:
        raise ValueError("paired_deltas needs at least one score column.")
    if method not in DELTA_METHODS:
        raise ValueError(f"paired_deltas: method must be one of {DELTA_METHODS}; got {method!r}.")
    if not 0 < confidence < 1:
        raise ValueError(f"paired_deltas: confidence must be in (0, 1); got {confidence!r}.")
    group_cols = list(group_cols)
    missing = [c for c in ["pipeline", "config_id", "trial_id", "sample_id", *group_cols, *scores] if c not in samples]
    if missing:
        raise KeyError(f"paired_deltas: columns {missing} are missing from the samples frame.")
    is_base = samples["pipeline"] == baseline
    if not is_base.any():
        is_base = samples["config_id"] == baseline
    if not is_base.any():
        raise ValueError(
            f"paired_deltas: baseline {baseline!r} matches no pipeline or config_id; pipelines: "
            f"{sorted(samples['pipeline'].unique())}."
        )
    base_ids = sorted(samples.loc[is_base, "config_id"].unique())
    if len(base_ids) > 1:
        raise ValueError(f"paired_deltas: baseline {baseline!r} spans several configurations {base_ids}; pick one.")

    keys = ["pipeline", "config_id", *group_cols, "sample_id"]
    rows = []
    for metric in scores:
        values = _numeric_scores(samples[metric], metric)
        frame = samples[keys + ["trial_id"]].assign(_value=values)
        per_sample = (
            frame.groupby(keys, dropna=False, sort=True)
            .agg(_mean=("_value", "mean"), _trials=("trial_id", "nunique"))
            .reset_index()
        )
        base = per_sample[per_sample["config_id"] == base_ids[0]]
        arms = per_sample[per_sample["config_id"] != base_ids[0]]
        for (pipeline, config_id, *group), arm in arms.groupby(["pipeline", "config_id", *group_cols], sort=True):
            group_filter = np.ones(len(base), dtype=bool)
            for column, value in zip(group_cols, group, strict=True):
                group_filter &= (base[column] == value).to_numpy()
            paired = arm.merge(base[group_filter], on=[*group_cols, "sample_id"], suffixes=("", "_base"))
            paired = paired.dropna(subset=["_mean", "_mean_base"])
            dropped = len(arm) + int(group_filter.sum()) - 2 * len(paired)
            if dropped:
                logger.info(
                    "paired_deltas: %s/%s %s: %d sample(s) not held by both arms are left out.",
                    pipeline,
                    config_id,
                    dict(zip(group_cols, group, strict=True)),
                    dropped,
                )
            diffs = (paired["_mean"] - paired["_mean_base"]).to_numpy(dtype=float)
            n = diffs.size
            delta = float(diffs.mean()) if n else math.nan
            se = float(diffs.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
            if n > 1:
                low, high = (
                    _bootstrap_ci(diffs, confidence, n_resamples, seed)
                    if method == "bootstrap"
                    else _normal_ci(diffs, confidence)
                )
            else:
                low = high = math.nan
            rows.append(
                {
                    "pipeline": pipeline,
                    "config_id": config_id,
                    **dict(zip(group_cols, group, strict=True)),
                    "metric": metric,
                    "n": n,
                    "baseline_mean": float(paired["_mean_base"].mean()) if n else math.nan,
                    "arm_mean": float(paired["_mean"].mean()) if n else math.nan,
                    "delta": delta,
                    "ci_low": low,
                    "ci_high": high,
                    "se": se,
                    "n_trials": int(paired["_trials"].max()) if n else 0,
                    "n_trials_baseline": int(paired["_trials_base"].max()) if n else 0,
                    "confidence": confidence,
                    "method": method,
                }
            )
    columns = [
        "pipeline",
        "config_id",
        *group_cols,
        "metric",
        "n",
        "baseline_mean",
        "arm_mean",
        "delta",
        "ci_low",
        "ci_high",
        "se",
        "n_trials",
        "n_trials_baseline",
        "confidence",
        "method",
    ]
    return pd.DataFrame(rows, columns=columns)


def _numeric_scores(series: pd.Series, metric: str) -> pd.Series:
    def convert(value: Any) -> float:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return math.nan
        if isinstance(value, str) and value in SCORE_LETTERS:
            return {"C": 1.0, "I": 0.0, "P": 0.5, "N": 0.0}[value]
        if isinstance(value, (bool, int, float, np.number)):
            return float(value)
        raise TypeError(
            f"paired_deltas: score column {metric!r} holds a non-numeric value {value!r}; compare numeric scores "
            "(select a dict key as 'scorer/key' in samples_frame)."
        )

    return series.map(convert).astype(float)


# ---------------------------------------------------------------------------------------------- logs on disk
def _finished_logs(log_dir: Path) -> dict[str, tuple[str, Any]]:
    """`{task: (path, header)}` of the newest finished log per task in one directory: status `success`, or `error`
    from failed samples only (`is_partial`: the rest were scored)."""
    from inspect_ai.log import list_eval_logs, read_eval_log

    from steer_hydra.evaluation.suite import is_partial

    chosen: dict[str, tuple[str, Any]] = {}
    for info in list_eval_logs(str(log_dir), recursive=False):
        header = read_eval_log(info, header_only=True)
        if header.status != "success" and not is_partial(header):
            continue
        task = header.eval.task
        previous = chosen.get(task)
        if previous is None or str(header.eval.created) > str(previous[1].eval.created):
            chosen[task] = (info.name, header)
    return chosen


def _records_from_logs(
    save_dir: Path,
    names: Mapping[str, str] | None,
    seeds: Mapping[tuple[str, int], Any] | None,
    config_ids: Iterable[str] | None,
) -> dict[str, list[dict[str, Any]]]:
    root = save_dir / "inspect_logs"
    wanted = None if config_ids is None else set(config_ids)
    records: dict[str, list[dict[str, Any]]] = {}
    for config_dir in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if wanted is not None and config_dir.name not in wanted:
            continue
        for trial_dir in sorted(p for p in config_dir.iterdir() if p.is_dir() and p.name.startswith("trial_")):
            trial = int(trial_dir.name.removeprefix("trial_"))
            suites: dict[str, dict[str, Any]] = {}
            for suite_dir in sorted(p for p in trial_dir.iterdir() if p.is_dir()):
                tasks: dict[str, Any] = {}
                for log_dir in [suite_dir, *sorted(p for p in suite_dir.iterdir() if p.is_dir())]:
                    for task, (location, header) in _finished_logs(log_dir).items():
                        tasks[task] = _flatten_header(header, location, save_dir)
                if tasks:
                    suites[suite_dir.name] = tasks
            if suites:
                name = (names or {}).get(config_dir.name, config_dir.name)
                records.setdefault(name, []).append(
                    {
                        "config_id": config_dir.name,
                        "trial_id": trial,
                        "seed": (seeds or {}).get((config_dir.name, trial)),
                        "suites": suites,
                    }
                )
    return records


def results_from_logs(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seeds: Mapping[tuple[str, int], Any] | None = None,
    config_ids: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The results frame rebuilt from `save_dir/inspect_logs/<config_id>/trial_<t>/<suite>/` alone.

    Per (config, trial, suite) cell and task, the newest finished log is read (status `success`, or `error` from
    failed samples only); logs left by an interrupted run (status `started`) and superseded logs are ignored.
    `names` maps config_id to the pipeline name (default: the config_id); `seeds` maps (config_id, trial) to the
    trial seed (default None); `config_ids` keeps only those configurations (default: every one in the save_dir).
    Log locations are relative to `save_dir`.
    """
    return results_frame(_records_from_logs(Path(save_dir), names, seeds, config_ids))


def cells_from_logs(
    save_dir: str | Path,
    names: Mapping[str, str] | None = None,
    *,
    seeds: Mapping[tuple[str, int], Any] | None = None,
    config_ids: Iterable[str] | None = None,
) -> pd.DataFrame:
    """The cells frame (`cells_frame`) rebuilt from a save_dir's logs, with the arguments of `results_from_logs`."""
    return cells_frame(_records_from_logs(Path(save_dir), names, seeds, config_ids))


def _flatten_header(header: Any, location: str, save_dir: Path) -> dict[str, Any]:
    from steer_hydra.evaluation.suite import failed_count, normalize_location

    metrics = {}
    for score in getattr(header.results, "scores", None) or []:
        for name, metric in (score.metrics or {}).items():
            metrics[f"{score.name}/{name}"] = metric.value
    return {
        "metrics": metrics,
        "n": int(header.results.completed_samples) if header.results is not None else 0,
        "failed": failed_count(header),
        "log": normalize_location(location, save_dir),
    }


def concat_samples(frames: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Stack samples frames of several tasks (e.g. before `paired_deltas`)."""
    return pd.concat(list(frames), ignore_index=True)
