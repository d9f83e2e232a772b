"""Study statistics over per-sample frames: cluster-paired bootstrap deltas, changed-output and degenerate rates.

Invariants (what the numbers mean):
- samples are the clusters: every score is first averaged per (configuration, sample) over all its trials and
  seeds, then arm and baseline are paired on `sample_id`, and the bootstrap resamples samples (never single
  generations), so repeated trials narrow the interval only as far as they reduce per-sample noise;
- `changed_fraction`: the share of paired samples where the arm's completion differs from the baseline's in at
  least one common trial (same `trial_id`) - how often the method changed the output at all;
- `degenerate_rate`: the share of an arm's generations flagged degenerate (`fluency < threshold` when a fluency
  column is given, else by the caller's `is_degenerate(text)`).
All functions are pure: frames in, frames out, a fixed bootstrap seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

SAMPLE_KEYS = ("pipeline", "config_id", "sample_id")


def per_sample_means(samples: pd.DataFrame, score: str, keys: Sequence[str] = SAMPLE_KEYS) -> pd.DataFrame:
    """`keys + [score, n_trials]`: the score averaged over trials and seeds of each (configuration, sample)."""
    values = pd.to_numeric(samples[score], errors="coerce")
    frame = samples[list(keys)].assign(_value=values, _trial=samples.get("trial_id", 0))
    grouped = frame.groupby(list(keys), sort=True, dropna=False)
    out = grouped.agg(**{score: ("_value", "mean"), "n_trials": ("_trial", "nunique")}).reset_index()
    return out


def paired_bootstrap(
    arm: np.ndarray, base: np.ndarray, *, n_resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """`(delta, ci_low, ci_high)` of mean(arm - base) over paired samples; a percentile bootstrap over samples."""
    diffs = np.asarray(arm, dtype=float) - np.asarray(base, dtype=float)
    if diffs.size == 0:
        return math.nan, math.nan, math.nan
    delta = float(diffs.mean())
    if diffs.size == 1:
        return delta, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = diffs[rng.integers(0, diffs.size, size=(n_resamples, diffs.size))].mean(axis=1)
    alpha = 1.0 - confidence
    low, high = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return delta, float(low), float(high)


def changed_fraction(samples: pd.DataFrame, baseline_config: str) -> pd.DataFrame:
    """Per configuration: share of samples whose completion differs from the baseline's in a common trial."""
    base = samples[samples["config_id"] == baseline_config][["sample_id", "trial_id", "completion"]]
    rows = []
    for (pipeline, config_id), arm in samples[samples["config_id"] != baseline_config].groupby(
        ["pipeline", "config_id"], sort=True
    ):
        paired = arm.merge(base, on=["sample_id", "trial_id"], suffixes=("", "_base"))
        if paired.empty:
            rows.append({"pipeline": pipeline, "config_id": config_id, "changed_fraction": math.nan})
            continue
        changed = (paired["completion"] != paired["completion_base"]).groupby(paired["sample_id"]).any()
        rows.append({"pipeline": pipeline, "config_id": config_id, "changed_fraction": float(changed.mean())})
    return pd.DataFrame(rows, columns=["pipeline", "config_id", "changed_fraction"])


def degenerate_rate(
    samples: pd.DataFrame,
    *,
    fluency: str | None = None,
    threshold: float = 0.5,
    is_degenerate: Callable[[str], bool] | None = None,
) -> pd.DataFrame:
    """Per configuration: share of generations that are degenerate (see the module docstring)."""
    if fluency is not None:
        flags = pd.to_numeric(samples[fluency], errors="coerce") < threshold
    elif is_degenerate is not None:
        flags = samples["completion"].fillna("").map(is_degenerate).astype(bool)
    else:
        raise ValueError("degenerate_rate needs fluency=<score column> or is_degenerate=<function of the text>.")
    frame = samples[["pipeline", "config_id"]].assign(_flag=flags.astype(float))
    out = frame.groupby(["pipeline", "config_id"], sort=True)["_flag"].mean().rename("degenerate_rate")
    return out.reset_index()


def arm_statistics(
    samples: pd.DataFrame,
    scores: Sequence[str],
    *,
    baseline_config: str,
    fluency: str | None = None,
    degenerate_threshold: float = 0.5,
    n_resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per (configuration, score): means, the paired delta vs the baseline with its bootstrap CI.

    Columns: `pipeline, config_id, metric, n, n_trials, baseline_mean, arm_mean, delta, ci_low, ci_high`, and
    `changed_fraction` / `degenerate_rate` when the frame has completions / the fluency column. The baseline's
    own rows (delta 0) are included so its degenerate rate is reported too.
    """
    if not (samples["config_id"] == baseline_config).any():
        raise ValueError(f"arm_statistics: no rows of the baseline configuration {baseline_config!r}.")
    rows = []
    for score in scores:
        means = per_sample_means(samples, score)
        base = means[means["config_id"] == baseline_config].set_index("sample_id")[score]
        for (pipeline, config_id), arm in means.groupby(["pipeline", "config_id"], sort=True):
            arm = arm.set_index("sample_id")[score]
            common = arm.index.intersection(base.index)
            pair = pd.DataFrame({"arm": arm.loc[common], "base": base.loc[common]}).dropna()
            delta, low, high = paired_bootstrap(
                pair["arm"].to_numpy(),
                pair["base"].to_numpy(),
                n_resamples=n_resamples,
                confidence=confidence,
                seed=seed,
            )
            trials = means[(means["config_id"] == config_id)]["n_trials"]
            rows.append(
                {
                    "pipeline": pipeline,
                    "config_id": config_id,
                    "metric": score,
                    "n": len(pair),
                    "n_trials": int(trials.max()) if len(trials) else 0,
                    "baseline_mean": float(pair["base"].mean()) if len(pair) else math.nan,
                    "arm_mean": float(pair["arm"].mean()) if len(pair) else math.nan,
                    "delta": delta,
                    "ci_low": low,
                    "ci_high": high,
                }
            )
    out = pd.DataFrame(rows)
    if "completion" in samples:
        changed = changed_fraction(samples, baseline_config)
        out = out.merge(changed, on=["pipeline", "config_id"], how="left")
        out.loc[out["config_id"] == baseline_config, "changed_fraction"] = 0.0
    if fluency is not None and fluency in samples:
        degenerate = degenerate_rate(samples, fluency=fluency, threshold=degenerate_threshold)
        out = out.merge(degenerate, on=["pipeline", "config_id"], how="left")
    return out
