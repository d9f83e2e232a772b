"""Paired statistics: per-sample differences of each arm against the baseline on identical samples, with a
seeded paired-bootstrap (or normal) confidence interval (`paired_deltas`)."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from steer_hydra.evaluation.frames import SCORE_LETTERS

logger = logging.getLogger(__name__)

DELTA_METHODS = ("bootstrap", "normal")


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
