"""Study statistics: trials averaged per sample before a sample-level paired bootstrap; changed and degenerate rates."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from steer_hydra.evaluation.stats import arm_statistics, changed_fraction, degenerate_rate, paired_bootstrap


def _rows(pipeline, config_id, values, *, trials=1, completions=None, fluency=None):
    rows = []
    for t in range(trials):
        for i, value in enumerate(values):
            rows.append(
                {
                    "pipeline": pipeline,
                    "config_id": config_id,
                    "trial_id": t,
                    "sample_id": f"s{i:02d}",
                    "score": value[t] if isinstance(value, tuple) else value,
                    "completion": (completions or [f"text {i}"] * len(values))[i],
                    "fluency": (fluency or [1.0] * len(values))[i],
                }
            )
    return rows


def test_trials_are_averaged_per_sample_before_the_bootstrap():
    # two trials per sample: the arm scores (1, 0) on every sample -> per-sample mean 0.5, no spread across samples
    base = _rows("baseline", "baseline", [0.0] * 10, trials=2)
    arm = _rows("caa", "c1", [(1.0, 0.0)] * 10, trials=2)
    stats = arm_statistics(pd.DataFrame(base + arm), ["score"], baseline_config="baseline", n_resamples=500)
    row = stats[stats["config_id"] == "c1"].iloc[0]
    assert row["n"] == 10 and row["n_trials"] == 2
    assert row["delta"] == pytest.approx(0.5)
    # samples are the clusters: all per-sample differences equal, so the interval collapses to the delta
    assert row["ci_low"] == pytest.approx(0.5) and row["ci_high"] == pytest.approx(0.5)


def test_bootstrap_matches_an_independent_resampling():
    rng = np.random.default_rng(1)
    arm, base = rng.random(40), rng.random(40)
    delta, low, high = paired_bootstrap(arm, base, n_resamples=2000, seed=3)
    diffs = arm - base
    again = np.random.default_rng(3)
    means = diffs[again.integers(0, 40, size=(2000, 40))].mean(axis=1)
    assert delta == pytest.approx(diffs.mean())
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert low < delta < high


def test_changed_fraction_counts_samples_with_a_different_completion():
    base = _rows("baseline", "baseline", [0, 0, 0, 0], completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [0, 0, 0, 0], completions=["a", "B!", "c", "D!"])
    changed = changed_fraction(pd.DataFrame(base + arm), "baseline")
    assert changed.set_index("config_id").loc["c1", "changed_fraction"] == 0.5


def test_degenerate_rate_from_fluency_or_a_text_rule():
    rows = pd.DataFrame(
        _rows("caa", "c1", [0, 0, 0, 0], fluency=[1.0, 0.2, 0.9, 0.0], completions=["a", "b", "c", "x"])
    )
    assert degenerate_rate(rows, fluency="fluency").iloc[0]["degenerate_rate"] == 0.5
    assert degenerate_rate(rows, is_degenerate=lambda text: text == "x").iloc[0]["degenerate_rate"] == 0.25
    with pytest.raises(ValueError, match="fluency"):
        degenerate_rate(rows)


def test_arm_statistics_reports_every_arm_with_rates():
    base = _rows("baseline", "baseline", [0, 0, 1, 1], completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [1, 1, 1, 1], completions=["a", "x", "y", "z"], fluency=[1, 1, 0.1, 1])
    stats = arm_statistics(pd.DataFrame(base + arm), ["score"], baseline_config="baseline", fluency="fluency")
    row = stats.set_index("config_id").loc["c1"]
    assert row["delta"] == 0.5 and row["changed_fraction"] == 0.75 and row["degenerate_rate"] == 0.25
    assert stats.set_index("config_id").loc["baseline", "delta"] == 0.0
    with pytest.raises(ValueError, match="baseline"):
        arm_statistics(pd.DataFrame(arm), ["score"], baseline_config="baseline")
