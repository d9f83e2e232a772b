"""The study folder's strength curves (values by hand on a tiny dev frame, intervals from the statistics module) and
its page (each table, links to the plots that exist, the logs' bundle command, escaped text); the plan's job count
per phase, known before any job."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from steer_hydra.analysis.stats import confidence_interval
from steer_hydra.study.curves import CURVE_COLUMNS, strength_curves
from steer_hydra.study.page import bundle_command, write_page
from steer_hydra.study.plan import Point, StudyPlan

# (concept, strength) -> the objective of samples s0, s1, s2
SCORES = {
    ("weddings", 0.5): [0.2, 0.4, 0.9],
    ("weddings", 1.0): [0.1, 0.3, 0.2],
    ("joy", 0.5): [0.6, 0.0, 0.3],
    ("joy", 1.0): [0.5, 0.7, 0.6],
}
RESAMPLES = 400


def _dev(layers: dict[float, int] | None = None) -> pd.DataFrame:
    """Dev rows of CAA (one layer, 12, unless `layers` maps a strength's points to other layers), the baseline (no
    strength) and PASTA (alpha only); two trials of each sample whose mean is its `SCORES` value."""
    rows = []
    for job, ((concept, strength), values) in enumerate(SCORES.items()):
        layer = (layers or {}).get(strength, 12)
        point = Point((("strength", strength), ("layer", layer)))
        for i, value in enumerate(values):
            for trial, shift in ((0, -0.05), (1, 0.05)):
                rows.append(dict(stage="dev", concept=concept, arm_name="caa", point=point.label, **point.columns(),
                                 job=job, config_id=f"caa{job}", sample_id=f"s{i}", trial_id=trial,
                                 harmonic=value + shift))  # fmt: skip
    for concept in ("weddings", "joy"):
        for name, point in (("baseline", Point()), ("pasta", Point((("alpha", 0.01),)))):
            rows += [dict(stage="dev", concept=concept, arm_name=name, point=point.label, **point.columns(), job=9,
                          config_id=name, sample_id=f"s{i}", trial_id=0, harmonic=0.0) for i in range(3)]  # fmt: skip
    return pd.DataFrame(rows)


def test_each_concept_and_strength_has_its_mean_and_the_stats_modules_interval():
    curves = strength_curves(_dev(), "harmonic", n_resamples=RESAMPLES)
    assert list(curves.columns) == list(CURVE_COLUMNS)
    assert set(curves["arm_name"]) == {"caa"}  # the baseline and PASTA have no strength
    assert curves["layer"].isna().all()  # one layer: not swept, one line per method
    per_concept = curves[curves["concept"] != "all"].set_index(["concept", "strength"])
    assert len(per_concept) == 4
    for (concept, strength), values in SCORES.items():
        row = per_concept.loc[(concept, strength)]
        assert row["mean"] == pytest.approx(sum(values) / 3)  # each sample's two trials averaged first
        assert row["n"] == 3
        low, high = confidence_interval(np.array(values), n_resamples=RESAMPLES, seed=0)
        assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high), abs=1e-12)
        assert row["ci_low"] <= row["mean"] <= row["ci_high"] and row["ci_low"] < row["ci_high"]


def test_the_over_concepts_row_averages_concept_means_and_resamples_concepts():
    curves = strength_curves(_dev(), "harmonic", n_resamples=RESAMPLES)
    over = curves[curves["concept"] == "all"].set_index("strength")
    assert list(over.index) == [0.5, 1.0] and (over["n"] == 2).all()  # n: the concepts
    assert over.loc[0.5, "mean"] == pytest.approx((0.5 + 0.3) / 2)
    assert over.loc[1.0, "mean"] == pytest.approx((0.2 + 0.6) / 2)
    concept_means = np.array([0.6, 0.2])  # joy, weddings: the bootstrap resamples concepts
    expected = confidence_interval(concept_means, n_resamples=RESAMPLES, seed=0)
    assert tuple(over.loc[1.0, ["ci_low", "ci_high"]]) == pytest.approx(expected, abs=1e-12)
    assert over.loc[1.0, "ci_low"] <= over.loc[1.0, "mean"] <= over.loc[1.0, "ci_high"]


def test_swept_layers_are_separate_lines_and_the_csv_leaves_an_unswept_layer_empty(tmp_path):
    swept = strength_curves(_dev(layers={0.5: 8, 1.0: 16}), "harmonic", n_resamples=RESAMPLES)
    lines = swept.groupby(["concept", "layer"])["strength"].apply(list).to_dict()
    assert lines[("weddings", 8)] == [0.5] and lines[("weddings", 16)] == [1.0] and lines[("all", 16)] == [1.0]
    path = tmp_path / "curves.csv"
    strength_curves(_dev(), "harmonic", n_resamples=RESAMPLES).to_csv(path, index=False)
    assert pd.read_csv(path)["layer"].isna().all()
    assert strength_curves(_dev()[lambda f: f["arm_name"] != "caa"], "harmonic").empty  # no strength on dev


def test_the_page_holds_each_table_the_existing_plots_and_the_bundle_command_escaped(tmp_path):
    (tmp_path / "pareto.png").write_bytes(b"png")
    (tmp_path / "strength_curves.png").write_bytes(b"png")
    odd = "<b>tea & cakes</b>"
    tables = {
        "selection": pd.DataFrame({"concept": [odd], "arm_name": ["caa"], "objective": [0.25]}),
        "study_summary": pd.DataFrame({"arm_name": ["caa"], "delta": [0.125]}),
        "costs_summary": pd.DataFrame({"task": ["mcqa"], "delta": [-0.5]}),
        "study_results": pd.DataFrame({"concept": [odd], "metric": ["harmonic"], "ci_low": [math.nan]}),
    }
    path = write_page(tmp_path, concepts=[odd, "joy"], tables=tables, objective="harmonic", save_dir="/runs/save dir")
    page = path.read_text()
    assert path == tmp_path / "index.html" and page.startswith("<!doctype html>")
    for name in tables:
        assert f"<summary>{name}, 1 row(s)" in page
    assert "0.125" in page and "-0.500" in page and "mcqa" in page
    assert odd not in page and "&lt;b&gt;tea &amp; cakes&lt;/b&gt;" in page  # in the concepts line and the tables
    assert '<img src="pareto.png"' in page and '<img src="strength_curves.png"' in page
    assert "study_deltas.png" not in page  # not written: no link
    command = bundle_command("/runs/save dir", tmp_path)
    assert command == (
        f"inspect view bundle --log-dir '/runs/save dir/inspect_logs' --output-dir {tmp_path}/logs_bundle --overwrite"
    )
    assert command.replace("'", "&#x27;") in page
    assert "<script" not in page and "http://" not in page and "https://" not in page
    bare = write_page(tmp_path / "bare", concepts=["joy"], tables={}, objective="harmonic").read_text()
    assert "inspect view bundle" not in bare and "<img" not in bare  # no save_dir, no plots


def test_the_plan_counts_each_phases_jobs_before_any_choice():
    plan = StudyPlan(
        arms=["baseline", "caa", "caa_random"], concepts=["weddings", "joy"], vector_methods=["caa", "caa_random"],
        strengths=[0.5], layers=[0, 1], follows={"caa_random": "caa"}, cost_suites=["capability_offline"],
    )  # fmt: skip
    counts = plan.job_counts(["model=tiny"])
    assert counts == {"dev": 2 * (1 + 2), "report": 2 * 2 * 3}  # concepts x (baseline + grid); x (test, cost) x arms
    chosen = {(c, "caa"): plan.grid("caa")[1] for c in plan.concepts}
    assert counts["report"] == len(plan.report_jobs([], chosen))  # whatever dev chooses


def test_write_study_writes_the_curves_their_plot_and_the_page(tmp_path):
    from steer_hydra.study.report import write_study
    from steer_hydra.study.selection import Objective

    out = write_study(_dev(), tmp_path, objective=Objective("harmonic"), methods=["caa"], n_resamples=RESAMPLES,
                      save_dir=tmp_path / "save")  # fmt: skip
    written = pd.read_csv(tmp_path / "strength_curves.csv")
    assert len(written) == len(out["strength_curves"]) == 6 and list(written.columns) == list(CURVE_COLUMNS)
    assert (tmp_path / "strength_curves.png").stat().st_size > 0
    page = (tmp_path / "index.html").read_text()
    assert out["paths"]["page"] == tmp_path / "index.html" and '<img src="strength_curves.png"' in page
    assert "<summary>selection, 4 row(s)" in page and f"--log-dir {tmp_path}/save/inspect_logs" in page
