"""Held-out strength selection: chosen on dev only, reported on test at that strength; sanity arms follow."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from steer_hydra.study.report import report_selected, write_study
from steer_hydra.study.selection import Objective, select_strengths, strength_of


def _frame():
    rows = []
    # dev: caa is best at 0.2; test: caa is best at 0.4 (a choice that read test would pick 0.4)
    table = {
        ("dev", 0.2): 0.6,
        ("dev", 0.4): 0.3,
        ("test", 0.2): 0.5,
        ("test", 0.4): 0.9,
    }
    for split, ids in (("dev", range(0, 10)), ("test", range(10, 30))):
        for i in ids:
            sid = f"cs-{i:03d}"
            rows.append(
                dict(
                    arm="baseline",
                    arm_name="baseline",
                    config_id="baseline",
                    strength=math.nan,
                    split=split,
                    sample_id=sid,
                    trial_id=0,
                    score=0.1,
                    completion="plain",
                )
            )
            rows.append(
                dict(
                    arm="prompt",
                    arm_name="prompt",
                    config_id="p",
                    strength=math.nan,
                    split=split,
                    sample_id=sid,
                    trial_id=0,
                    score=0.2,
                    completion="prompted",
                )
            )
            for strength in (0.2, 0.4):
                value = table[(split, strength)]
                rows.append(
                    dict(
                        arm="caa",
                        arm_name="caa",
                        config_id=f"c{strength}",
                        strength=strength,
                        split=split,
                        sample_id=sid,
                        trial_id=0,
                        score=value,
                        completion=f"caa {strength}",
                    )
                )
                rows.append(
                    dict(
                        arm="caa_random",
                        arm_name="caa_random",
                        config_id=f"r{strength}",
                        strength=strength,
                        split=split,
                        sample_id=sid,
                        trial_id=0,
                        score=0.1 + strength / 10,
                        completion="rand",
                    )
                )
    return pd.DataFrame(rows)  # fmt: skip


def test_the_choice_is_made_on_dev_and_never_reads_test():
    frame = _frame()
    dev = frame[frame["split"] == "dev"]
    choices = select_strengths(dev, Objective("score"), follows={"caa_random": "caa"}).set_index("arm_name")
    assert choices.loc["caa", "strength"] == 0.2 and choices.loc["caa", "objective"] == pytest.approx(0.6)
    assert choices.loc["caa_random", "strength"] == 0.2 and choices.loc["caa_random", "source"] == "caa"
    assert math.isnan(choices.loc["baseline", "strength"])
    # the function refuses test rows outright, so it cannot read them by accident
    with pytest.raises(ValueError, match="dev rows only"):
        select_strengths(frame, Objective("score"))
    # changing every test score changes nothing about the choice
    poisoned = frame.assign(score=frame["score"].where(frame["split"] == "dev", 100.0))
    again = select_strengths(poisoned[poisoned["split"] == "dev"], Objective("score"), follows={"caa_random": "caa"})
    assert again.equals(select_strengths(dev, Objective("score"), follows={"caa_random": "caa"}))


def test_ties_go_to_the_smaller_strength_and_minimizing_works():
    frame = _frame()
    dev = frame[frame["split"] == "dev"]
    flat = dev.assign(score=0.5)
    assert select_strengths(flat, Objective("score")).set_index("arm_name").loc["caa", "strength"] == 0.2
    assert select_strengths(dev, Objective("score", maximize=False)).set_index("arm_name").loc["caa", "strength"] == 0.4


def test_report_uses_the_test_split_at_the_chosen_strength():
    frame = _frame()
    choices = select_strengths(frame[frame["split"] == "dev"], Objective("score"), follows={"caa_random": "caa"})
    results = report_selected(frame[frame["split"] == "test"], choices, ["score"], fluency=None, n_resamples=200)
    by_arm = results.set_index("arm_name")
    assert by_arm.loc["caa", "strength"] == 0.2 and by_arm.loc["caa", "n"] == 20
    assert by_arm.loc["caa", "arm_mean"] == pytest.approx(0.5) and by_arm.loc["caa", "delta"] == pytest.approx(0.4)
    assert by_arm.loc["caa_random", "arm_mean"] == pytest.approx(0.12)
    assert by_arm.loc["prompt", "delta"] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="test rows only"):
        report_selected(frame, choices, ["score"])


def test_write_study_records_the_choice_and_both_splits(tmp_path):
    out = write_study(_frame(), tmp_path, objective=Objective("score"), scores=["score"], follows={"caa_random": "caa"})
    record = json.loads((tmp_path / "selection.json").read_text())
    assert record["objective"] == {"metric": "score", "maximize": True}
    assert len(record["dev_sample_ids"]) == 10 and len(record["test_sample_ids"]) == 20
    assert not set(record["dev_sample_ids"]) & set(record["test_sample_ids"])
    assert (tmp_path / "study_results.csv").is_file() and len(out["results"]) == 4
    assert (tmp_path / "study_deltas.png").stat().st_size > 0


def test_strength_of_reads_the_multiplier_of_canonical_controls():
    controls = [{"_target_": "CAA", "args": {"multiplier": 0.3, "layer_id": 12}}]
    assert strength_of(controls) == 0.3
    assert strength_of({"pasta": {"alpha": 0.01}}) == 0.01
    assert strength_of([]) is None
