"""Statistics over concepts: the two-stage bootstrap equals a hand computation, every concept weighs the same,
and `concept_deltas` pairs each concept's samples with its own baseline rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from steer_hydra.analysis.stats import concept_deltas, concept_interval

VALUES = {"weddings": [1.0, 0.0, 1.0, 1.0], "joy": [0.0, 0.5, 0.0], "pirate": [1.0, 0.5]}


def test_the_concept_bootstrap_equals_a_hand_computation():
    resamples, seed = 40, 3
    estimate, low, high = concept_interval(VALUES, n_resamples=resamples, seed=seed, confidence=0.9)

    names = sorted(VALUES)  # joy, pirate, weddings
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, 3, size=(resamples, 3))
    draws = {name: rng.integers(0, len(VALUES[name]), size=(resamples, 3, len(VALUES[name]))) for name in names}
    by_hand = []
    for b in range(resamples):
        slots = []
        for j in range(3):
            name = names[picks[b, j]]
            slots.append(sum(VALUES[name][i] for i in draws[name][b, j]) / len(VALUES[name]))
        by_hand.append(sum(slots) / 3)
    assert estimate == pytest.approx((0.75 + 1 / 6 + 0.75) / 3)  # each concept's mean weighs the same
    assert (low, high) == pytest.approx(tuple(np.quantile(by_hand, [0.05, 0.95])))
    assert low < estimate < high


def test_the_interval_is_seeded_and_collapses_without_spread():
    spread = {"a": [0.11, 0.52, 0.93], "b": [0.27, 0.64], "c": [0.05, 0.38, 0.71, 0.99]}
    assert concept_interval(spread, seed=1) == concept_interval(spread, seed=1)
    assert concept_interval(spread, seed=1) != concept_interval(spread, seed=2)
    assert concept_interval({"a": [0.5, 0.5], "b": [0.5]}) == (0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="per concept"):
        concept_interval({"a": [1.0], "b": []})


def test_concept_deltas_pair_within_each_concept_and_average_over_concepts():
    rows = []
    for concept, arm_scores in (("weddings", [1.0, 1.0]), ("joy", [0.0, 1.0, 1.0, 1.0])):
        for i, score in enumerate(arm_scores):
            sid = f"s{i}"  # the same sample ids in both concepts: pairs never cross concepts
            rows.append(dict(concept=concept, arm_name="baseline", config_id="baseline", sample_id=sid, trial_id=0,
                             score=0.0 if concept == "joy" else 0.5))  # fmt: skip
            rows.append(dict(concept=concept, arm_name="caa", config_id=f"caa-{concept}", sample_id=sid, trial_id=0,
                             score=score))  # fmt: skip
    out = concept_deltas(pd.DataFrame(rows), ["score"], baseline_config_id="baseline", n_resamples=200)
    caa = out.set_index("arm_name").loc["caa"]
    assert caa["n_concepts"] == 2 and caa["n"] == 6
    assert caa["arm_mean"] == pytest.approx((1.0 + 0.75) / 2)  # not the pooled 5/6
    assert caa["delta"] == pytest.approx((0.5 + 0.75) / 2)
    base = out.set_index("arm_name").loc["baseline"]
    assert base["delta"] == 0 and base["baseline_mean"] == pytest.approx(0.25)


def test_the_win_rate_counts_concepts_where_an_arm_beats_prompting_and_a_tie_as_half():
    from steer_hydra.study.report import win_rates

    means = {("a", "caa"): 0.3, ("a", "prompt"): 0.1, ("b", "caa"): 0.2, ("b", "prompt"): 0.2,
             ("c", "caa"): 0.0, ("c", "prompt"): 0.4, ("a", "baseline"): 0.5}  # fmt: skip
    results = pd.DataFrame(
        [{"concept": c, "arm_name": arm, "metric": "h", "arm_mean": v} for (c, arm), v in means.items()]
        + [{"concept": "a", "arm_name": "caa", "metric": "other", "arm_mean": 9.0}]
    )
    (row,) = win_rates(results, objective="h", versus="prompt").to_dict("records")
    assert row == {"arm_name": "caa", "win_rate": 0.5, "win_rate_concepts": 3}  # none for the baseline
