"""analysis.stats: scores as numbers, per-sample means over runs, paired deltas against the baseline with their
interval (samples are the clusters), the changed share (per sample over its (seed, trial_id) runs) and the
degenerate rate."""

from __future__ import annotations

import logging
import math
import statistics
from statistics import NormalDist

import numpy as np
import pandas as pd
import pytest

from steer_hydra.analysis.stats import (
    DELTA_COLUMNS,
    changed_share,
    confidence_interval,
    degenerate_rate,
    numeric_scores,
    paired_deltas,
    per_sample_means,
    run_keys,
)


def _rows(arm, config_id, values, *, trials=1, seed=0, completions=None, fluency=None):
    """One row per (trial, sample) of one configuration; a tuple value or completion gives one entry per trial."""
    rows = []
    for t in range(trials):
        for i, value in enumerate(values):
            completion = (completions or [f"text {i}"] * len(values))[i]
            rows.append(
                {
                    "arm": arm,
                    "config_id": config_id,
                    "trial_id": t,
                    "seed": seed,
                    "suite": "s",
                    "task": "t",
                    "sample_id": f"s{i:02d}",
                    "score": value[t] if isinstance(value, tuple) else value,
                    "completion": completion[t] if isinstance(completion, tuple) else completion,
                    "fluency": (fluency or [1.0] * len(values))[i],
                }
            )
    return rows


def _frame(*parts):
    return pd.DataFrame([row for part in parts for row in part])


# ------------------------------------------------------------------------------------------ numbers and runs
def test_numeric_scores_turn_letters_and_bools_into_floats():
    out = numeric_scores(pd.Series(["C", "I", "P", "N", True, 2, None, 0.25], dtype=object), "x")
    assert out.tolist()[:6] == [1.0, 0.0, 0.5, 0.0, 1.0, 2.0] and math.isnan(out.iloc[6]) and out.iloc[7] == 0.25
    with pytest.raises(TypeError, match="'x' holds a non-numeric value 'maybe'"):
        numeric_scores(pd.Series(["maybe"]), "x")


def test_per_sample_means_average_every_run_of_a_sample_and_count_them():
    # seeds pool as further trials: sample s00 has runs (0, 0), (0, 1), (1, 0) -> three runs
    samples = _frame(
        _rows("a", "c", [1.0, 0.0], trials=2, seed=0),
        _rows("a", "c", [0.0, "C"], seed=1),
    )
    assert run_keys(samples) == ["seed", "trial_id"]
    assert run_keys(samples.drop(columns="seed")) == ["trial_id"]
    means = per_sample_means(samples, "score")
    assert list(means.columns) == ["arm", "config_id", "sample_id", "score", "n_trials"]
    assert means["score"].tolist() == pytest.approx([2 / 3, 1 / 3])
    assert means["n_trials"].tolist() == [3, 3]
    # without the seed column, seed 1's trial 0 is the same run as seed 0's
    assert per_sample_means(samples.drop(columns="seed"), "score")["n_trials"].tolist() == [2, 2]


# ------------------------------------------------------------------------------------------ confidence intervals
def test_bootstrap_matches_an_independent_resampling_and_is_reproducible():
    rng = np.random.default_rng(1)
    diffs = rng.random(40) - rng.random(40)
    low, high = confidence_interval(diffs, n_resamples=2000, seed=3)
    again = np.random.default_rng(3)
    means = diffs[again.integers(0, 40, size=(2000, 40))].mean(axis=1)
    assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert low < diffs.mean() < high
    assert confidence_interval(diffs, n_resamples=2000, seed=3) == (low, high)
    assert confidence_interval(diffs, n_resamples=2000, seed=4) != (low, high)
    narrow = confidence_interval(diffs, confidence=0.5, n_resamples=2000, seed=3)
    assert low < narrow[0] < narrow[1] < high
    assert all(math.isnan(v) for v in confidence_interval(np.array([0.5])))


def test_paired_deltas_bootstrap_interval_is_reproducible_with_the_same_seed():
    rng = np.random.default_rng(0)
    base = rng.random(25).round(2).tolist()
    arm = (np.array(base) + rng.normal(0.1, 0.3, 25)).round(2).tolist()
    samples = _frame(_rows("baseline", "baseline", base), _rows("arm", "a1", arm))
    first = paired_deltas(samples, "score", seed=11, n_resamples=3000).iloc[0]
    again = paired_deltas(samples, "score", seed=11, n_resamples=3000).iloc[0]
    other = paired_deltas(samples, "score", seed=12, n_resamples=3000).iloc[0]
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    assert (first.ci_low, first.ci_high) != (other.ci_low, other.ci_high)
    diffs = np.array(arm) - np.array(base)
    assert (first.ci_low, first.ci_high) == confidence_interval(diffs, n_resamples=3000, seed=11)
    assert first.delta == pytest.approx(diffs.mean()) and first.method == "bootstrap"


def test_normal_interval_is_delta_plus_minus_z_sd_over_sqrt_n_by_hand():
    base = [0.0, 0.5, 1.0, 0.25, 0.5]
    arm = [0.5, 0.25, 2.0, 0.25, 1.25]  # differences 0.5, -0.25, 1.0, 0.0, 0.75
    samples = _frame(_rows("baseline", "baseline", base), _rows("arm", "a1", arm))
    row = paired_deltas(samples, "score", method="normal", confidence=0.9).iloc[0]
    diffs = [0.5, -0.25, 1.0, 0.0, 0.75]
    delta, sd = sum(diffs) / 5, statistics.stdev(diffs)
    z = NormalDist().inv_cdf(0.95)  # two-sided 90%
    assert z == pytest.approx(1.6448536, abs=1e-6)
    assert (row.n, row.delta, row.se) == (5, pytest.approx(0.4), pytest.approx(sd / math.sqrt(5)))
    assert delta == pytest.approx(0.4)
    assert (row.ci_low, row.ci_high) == pytest.approx((delta - z * sd / math.sqrt(5), delta + z * sd / math.sqrt(5)))
    assert (row.confidence, row.method) == (0.9, "normal")


# ------------------------------------------------------------------------------------------ paired deltas
def test_paired_deltas_columns_and_means():
    samples = _frame(_rows("baseline", "baseline", [0, 1, 1, 0]), _rows("caa", "c1", [1, 1, 1, 0]))
    out = paired_deltas(samples, "score", method="normal")
    assert list(out.columns) == ["arm", "config_id", "suite", "task", *DELTA_COLUMNS]
    row = out.iloc[0]
    assert (row.arm, row.config_id, row.suite, row.task, row.metric) == ("caa", "c1", "s", "t", "score")
    assert (row.baseline_mean, row.arm_mean, row.delta) == (0.5, 0.75, 0.25)
    assert (row.n_trials, row.n_trials_baseline, row.changed) == (1, 1, 0.0)  # same completions: nothing changed


def test_trials_are_averaged_per_sample_before_the_bootstrap():
    # two trials per sample: the arm scores (1, 0) on every sample -> per-sample mean 0.5, no spread across samples
    base = _rows("baseline", "baseline", [0.0] * 10, trials=2)
    arm = _rows("caa", "c1", [(1.0, 0.0)] * 10, trials=2)
    row = paired_deltas(_frame(base, arm), "score", n_resamples=500).iloc[0]
    assert row["n"] == 10 and row["n_trials"] == 2 and row["n_trials_baseline"] == 2
    assert row["delta"] == pytest.approx(0.5)
    # samples are the clusters: all per-sample differences equal, so the interval collapses to the delta
    assert row["ci_low"] == pytest.approx(0.5) and row["ci_high"] == pytest.approx(0.5)


def test_include_baseline_gives_the_baseline_a_row_with_delta_zero_and_changed_zero():
    base = _rows("baseline", "baseline", [0, 0, 1, 1], completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [1, 1, 1, 1], completions=["a", "x", "y", "z"])
    out = paired_deltas(_frame(base, arm), "score", include_baseline=True).set_index("config_id")
    assert out.index.tolist() == ["baseline", "c1"]
    own = out.loc["baseline"]
    assert (own.arm, own.n, own.delta, own.changed) == ("baseline", 4, 0.0, 0.0)
    assert own.baseline_mean == own.arm_mean == 0.5 and (own.ci_low, own.ci_high) == (0.0, 0.0)
    assert (out.loc["c1", "delta"], out.loc["c1", "changed"]) == (0.5, 0.75)
    assert paired_deltas(_frame(base, arm), "score")["config_id"].tolist() == ["c1"]  # default: arms only
    # without completions the changed share is unknown for every row, the baseline's too
    no_text = paired_deltas(_frame(base, arm).drop(columns="completion"), "score", include_baseline=True)
    assert no_text["changed"].isna().all() and no_text["delta"].tolist() == [0.0, 0.5]


def test_deltas_report_every_arm_with_its_changed_share_and_degenerate_rate():
    base = _rows("baseline", "baseline", [0, 0, 1, 1], completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [1, 1, 1, 1], completions=["a", "x", "y", "z"], fluency=[1, 1, 0.1, 1])
    other = _rows("sys", "s1", [0, 0, 0, 1], completions=["a", "b", "c", "D"])
    samples = _frame(base, arm, other)
    deltas = paired_deltas(samples, "score").set_index("config_id")
    assert deltas.loc["c1", ["delta", "changed"]].tolist() == [0.5, 0.75]
    assert deltas.loc["s1", ["delta", "changed"]].tolist() == [-0.25, 0.25]
    rates = degenerate_rate(samples, fluency="fluency").set_index("config_id")["degenerate_rate"]
    assert rates.to_dict() == {"baseline": 0.0, "c1": 0.25, "s1": 0.0}
    with pytest.raises(ValueError, match="Baseline 'baseline' matches no arm or config_id"):
        paired_deltas(_frame(arm), "score")


def test_the_baseline_is_named_by_arm_first_and_the_changed_share_uses_the_same_baseline():
    base = _rows("ref", "baseline", [0, 1], completions=["a", "b"])
    named = _rows("baseline", "b2", [1, 1], completions=["a", "B"])  # an arm *named* "baseline"
    samples = _frame(base, named)
    columns = ["arm", "config_id", "delta", "changed"]
    assert paired_deltas(samples, "score", baseline="ref")[columns].values.tolist() == [["baseline", "b2", 0.5, 0.5]]
    # "baseline" matches an arm name before a config_id: the arm named "baseline" is the baseline, "ref" the arm
    by_name = paired_deltas(samples, "score", baseline="baseline")
    assert by_name[columns].values.tolist() == [["ref", "baseline", -0.5, 0.5]]
    assert paired_deltas(samples, "score", baseline="b2")[columns].values.tolist() == by_name[columns].values.tolist()


# ------------------------------------------------------------------------------------------ the changed share
def test_changed_share_counts_samples_with_a_different_completion():
    base = _rows("baseline", "baseline", [0, 0, 0, 0], completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [0, 0, 0, 0], completions=["a", "B!", "c", "D!"])
    changed = changed_share(_frame(base, arm), "baseline")
    assert list(changed.columns) == ["arm", "config_id", "suite", "task", "changed", "n_changed"]
    assert changed[["arm", "config_id", "changed", "n_changed"]].values.tolist() == [["caa", "c1", 0.5, 4]]


def test_a_sample_changed_in_one_of_two_trials_counts_half():
    # s00 changed in trial 0 only -> 0.5; s01 changed in both -> 1; s02, s03 unchanged -> 0; mean over samples
    base = _rows("baseline", "baseline", [0] * 4, trials=2, completions=["a", "b", "c", "d"])
    arm = _rows("caa", "c1", [0] * 4, trials=2, completions=[("A", "a"), "B", "c", "d"])
    changed = changed_share(_frame(base, arm), "baseline").iloc[0]
    assert (changed.changed, changed.n_changed) == (0.375, 4)
    # at temperature 0 the rule would say "changed in any run": that is 2 of 4 samples, not what is reported
    assert changed.changed != 0.5


def test_the_changed_share_averages_over_samples_not_over_runs():
    # s00 has two paired runs, one changed (0.5); s01 has one paired run (trial 1 is missing), changed (1.0):
    # the mean over samples is 0.75, the share of all paired runs would be 2/3
    base = _rows("baseline", "baseline", [0, 0], trials=2, completions=["a", "b"])
    arm = _rows("caa", "c1", [0, 0], trials=2, completions=[("A", "a"), "B"])
    arm = [r for r in arm if (r["trial_id"], r["sample_id"]) != (1, "s01")]
    changed = changed_share(_frame(base, arm), "baseline").iloc[0]
    assert changed.changed == pytest.approx(0.75) and changed.n_changed == 2


def test_runs_pair_on_seed_and_trial_id():
    # two seeds, one trial each: the arm's seed-0 run matches the baseline's seed-0 run, and so for seed 1; pairing
    # across seeds (trial_id alone) would compare "a" with "b" and report 0.5
    samples = _frame(
        _rows("baseline", "baseline", [0], completions=["a"], seed=0),
        _rows("baseline", "baseline", [0], completions=["b"], seed=1),
        _rows("caa", "c1", [0], completions=["a"], seed=0),
        _rows("caa", "c1", [0], completions=["b"], seed=1),
    )
    changed = changed_share(samples, "baseline").iloc[0]
    assert (changed.changed, changed.n_changed) == (0.0, 1)


def test_a_baseline_run_from_another_seed_never_pairs():
    base = _rows("baseline", "baseline", [0, 1], completions=["a", "b"], seed=0)
    arm = _rows("caa", "c1", [1, 1], completions=["x", "y"], seed=1)
    changed = changed_share(_frame(base, arm), "baseline").iloc[0]
    assert (changed.arm, changed.n_changed) == ("caa", 0) and math.isnan(changed.changed)
    # the scores still pair per sample (seeds pool as further trials); only the changed share needs the same run
    row = paired_deltas(_frame(base, arm), "score").iloc[0]
    assert (row.n, row.delta) == (2, 0.5) and math.isnan(row.changed)


# ------------------------------------------------------------------------------------------ degenerate rate
def test_degenerate_rate_from_fluency_or_a_text_rule():
    rows = _frame(_rows("caa", "c1", [0, 0, 0, 0], fluency=[1.0, 0.2, 0.9, 0.0], completions=["a", "b", "c", "x"]))
    assert degenerate_rate(rows, fluency="fluency").iloc[0]["degenerate_rate"] == 0.5
    assert degenerate_rate(rows, fluency="fluency", threshold=0.95).iloc[0]["degenerate_rate"] == 0.75
    assert degenerate_rate(rows, is_degenerate=lambda text: text == "x").iloc[0]["degenerate_rate"] == 0.25
    with pytest.raises(ValueError, match="fluency"):
        degenerate_rate(rows)


# ------------------------------------------------------------------------------------------ by hand, several tasks
def _samples(rows):
    return pd.DataFrame(rows, columns=["arm", "config_id", "trial_id", "suite", "task", "sample_id", "score"])


def _arm(arm, config_id, scores, trial=0, task="t"):
    return [(arm, config_id, trial, "s", task, i, v) for i, v in enumerate(scores)]


def test_paired_deltas_by_hand_normal_interval():
    samples = _samples(_arm("baseline", "baseline", [1, 0, 1, 0]) + _arm("arm", "a1", [1, 1, 1, 0]))
    out = paired_deltas(samples, "score", method="normal")
    row = out.iloc[0]
    # differences 0, 1, 0, 0: mean 0.25, sd 0.5, se 0.25
    z = NormalDist().inv_cdf(0.975)
    assert (row.arm, row.config_id, row.suite, row.task, row.metric, row.n) == ("arm", "a1", "s", "t", "score", 4)
    assert (row.baseline_mean, row.arm_mean, row.delta, row.se) == pytest.approx((0.5, 0.75, 0.25, 0.25))
    assert (row.ci_low, row.ci_high) == pytest.approx((0.25 - z * 0.25, 0.25 + z * 0.25))
    assert math.isnan(row.changed)  # no completion column


def test_paired_deltas_by_hand_bootstrap_interval():
    # two pairs with differences 0 and 1: resampled means are 0, 0.5, 1 with probability 1/4, 1/2, 1/4,
    # so the 95% percentile interval is [0, 1]; a constant difference gives a degenerate interval
    samples = _samples(_arm("baseline", "baseline", [0, 0]) + _arm("arm", "a1", [0, 1]) + _arm("flat", "f1", [1, 1]))
    out = paired_deltas(samples, "score", seed=7).set_index("arm")
    assert (out.loc["arm", "delta"], out.loc["arm", "ci_low"], out.loc["arm", "ci_high"]) == (0.5, 0.0, 1.0)
    assert (out.loc["flat", "delta"], out.loc["flat", "ci_low"], out.loc["flat", "ci_high"]) == (1.0, 1.0, 1.0)
    assert (out["method"] == "bootstrap").all()


def test_bootstrap_is_seeded_and_independent_of_other_arms():
    rng = np.random.default_rng(0)
    base = rng.random(30).round(2).tolist()
    arm = (np.array(base) + rng.normal(0.1, 0.2, 30)).round(2).tolist()
    one = _samples(_arm("baseline", "baseline", base) + _arm("arm", "a1", arm))
    two = _samples(_arm("baseline", "baseline", base) + _arm("arm", "a1", arm) + _arm("zz", "z", base[::-1]))
    first = paired_deltas(one, "score", seed=3).iloc[0]
    again = paired_deltas(two, "score", seed=3).set_index("arm").loc["arm"]
    assert (first.ci_low, first.ci_high) == (again.ci_low, again.ci_high)
    other = paired_deltas(one, "score", seed=4).iloc[0]
    assert (first.ci_low, first.ci_high) != (other.ci_low, other.ci_high)
    assert first.ci_low < first.delta < first.ci_high


def test_trials_are_averaged_per_sample_before_pairing():
    samples = _samples(
        _arm("baseline", "baseline", [1, 0, 0])
        + _arm("baseline", "baseline", [1, 0, 1], trial=1)
        + _arm("arm", "a1", [1, 1, 1])
        + _arm("arm", "a1", [0, 1, 1], trial=1)
    )
    row = paired_deltas(samples, "score", method="normal").iloc[0]
    # per-sample means: baseline 1, 0, .5; arm .5, 1, 1; differences -.5, 1, .5
    assert row.n == 3 and (row.n_trials, row.n_trials_baseline) == (2, 2)
    assert row.delta == pytest.approx(1 / 3)
    assert row.se == pytest.approx(np.std([-0.5, 1, 0.5], ddof=1) / math.sqrt(3))


def test_only_samples_both_arms_hold_are_paired_per_task_and_the_drops_said_once(caplog):
    samples = _samples(
        _arm("baseline", "baseline", [1, 0, 1, 1])
        + _arm("arm", "a1", [0, 0, 1])  # lacks sample 3
        + _arm("baseline", "baseline", [0, 0, 1], task="u")
        + _arm("arm", "a1", [1, 1], task="u")  # lacks sample 2
    )
    with caplog.at_level(logging.INFO, logger="steer_hydra.analysis.stats"):
        out = paired_deltas(samples, "score").set_index("task")
    assert out.loc["t", "n"] == 3 and out.loc["t", "delta"] == pytest.approx(-1 / 3)
    assert out.loc["u", "n"] == 2 and out.loc["u", "delta"] == 1.0
    (line,) = [r.getMessage() for r in caplog.records if "not held by both sides" in r.getMessage()]
    assert line.startswith("paired_deltas: 2 sample(s) not held by both sides are left out, in 2 group(s)")


def test_paired_deltas_with_one_pair_has_no_interval_and_letters_are_scores():
    samples = _samples(_arm("baseline", "baseline", ["I"]) + _arm("arm", "a1", ["C"]))
    row = paired_deltas(samples, "score").iloc[0]
    assert row.delta == 1.0 and row.n == 1 and math.isnan(row.ci_low) and math.isnan(row.ci_high)
    assert math.isnan(row.se)


def test_paired_deltas_errors():
    samples = _samples(_arm("baseline", "baseline", [1]) + _arm("arm", "a1", [0]))
    with pytest.raises(ValueError, match="matches no arm or config_id"):
        paired_deltas(samples, "score", baseline="ref")
    with pytest.raises(ValueError, match="method"):
        paired_deltas(samples, "score", method="t")
    with pytest.raises(ValueError, match="confidence"):
        paired_deltas(samples, "score", confidence=1.0)
    with pytest.raises(ValueError, match="at least one"):
        paired_deltas(samples, [])
    with pytest.raises(KeyError, match="missing"):
        paired_deltas(samples, "nope")
    bad = _samples(_arm("baseline", "baseline", [[1]]) + _arm("arm", "a1", [0]))
    with pytest.raises(TypeError, match="non-numeric"):
        paired_deltas(bad, "score")
    two_bases = _samples(_arm("baseline", "b1", [1]) + _arm("baseline", "b2", [1]) + _arm("arm", "a1", [0]))
    with pytest.raises(ValueError, match="several configurations"):
        paired_deltas(two_bases, "score")
