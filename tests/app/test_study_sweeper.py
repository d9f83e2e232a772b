"""The study sweeper: dev jobs only before the choice, the choice from dev rows only, then every arm at its
method's chosen strength on test and the cost suites; the whole preset end to end on the tiny model."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from app_helpers import FAST

from hydra_plugins.steer_hydra_study.study_sweeper import StudySweeper
from steer_hydra.app import study as study_module
from steer_hydra.app.study import StudySelection
from steer_hydra.study import LAUNCHED_FILE
from steer_hydra.study.selection import strength_of

ARMS = ["baseline", "prompt_concept", "caa_concept", "caa_concept_random", "caa_concept_negated"]
FOLLOWS = {"caa_concept_random": "caa_concept", "caa_concept_negated": "caa_concept"}


def _sweeper(**kw) -> StudySweeper:
    args = dict(arms=ARMS, strengths=[0.6, 0.9], swept=[*FOLLOWS, "caa_concept"], follows=FOLLOWS)
    return StudySweeper(**{**args, "cost_suites": ["capability_offline"], **kw})


def _suite(job: list[str]) -> str:
    return next(o.split("=", 1)[1] for o in job if o.startswith("suite="))


def test_the_command_line_sets_arms_and_grid_and_reaches_every_job():
    sweeper = _sweeper()
    passthrough = sweeper.plan_arguments(
        ["experiment=concept_steering", "arm=baseline,caa_concept_random", "strength=0.9,0.3", "logger=none"]
    )
    assert passthrough == ["experiment=concept_steering", "logger=none"]
    assert sweeper.arms == ["baseline", "caa_concept_random"] and sweeper.strengths == [0.3, 0.9]
    assert sweeper.methods() == ["caa_concept"]  # a sanity arm alone still needs its method's choice
    assert all(job[:2] == passthrough for job in sweeper.dev_jobs(passthrough))
    with pytest.raises(ValueError, match="sweeps only `arm` and `strength`.*Fix"):
        _sweeper().plan_arguments(["seed=1,2"])


def test_dev_jobs_touch_only_the_dev_suite_and_report_jobs_use_the_choice():
    sweeper = _sweeper()
    dev = sweeper.dev_jobs([])
    assert {_suite(job) for job in dev} == {"concept_steering_dev"}
    assert dev[0] == ["arm=baseline", "suite=concept_steering_dev"]
    assert sorted(tuple(job[:2]) for job in dev[1:]) == [
        ("arm=caa_concept", "strength=0.6"),
        ("arm=caa_concept", "strength=0.9"),
    ]
    report = sweeper.report_jobs([], {"caa_concept": 0.9})
    assert {_suite(job) for job in report} == {"concept_steering_test", "capability_offline"}
    assert len(report) == 2 * len(ARMS)
    for job in report:
        arm = job[0].split("=", 1)[1]
        strengths = [o for o in job if o.startswith("strength=")]
        assert strengths == (["strength=0.9"] if arm.startswith("caa") else [])  # sanity arms at CAA's choice
    assert sweeper.report_jobs([], {})[0] == ["arm=baseline", "suite=concept_steering_test"]


def test_choose_reads_dev_rows_only(monkeypatch):
    """Poisoning every test (and off-grid dev) row changes nothing: the choice is a function of the grid's dev rows."""
    rows = []
    for split, best in (("dev", 0.6), ("test", 0.9)):
        for i in range(6):
            for strength in (0.6, 0.9, 2.0):
                value = 1.0 if strength == best else 0.2
                rows.append(dict(arm_name="caa_concept", config_id=f"c{strength}", strength=strength, split=split,
                                 sample_id=f"{split}-{i}", trial_id=0, task="t", concept_harmonic=value))  # fmt: skip
                rows.append(dict(arm_name="caa_concept_random", config_id=f"r{strength}", strength=strength,
                                 split=split, sample_id=f"{split}-{i}", trial_id=0, task="t",
                                 concept_harmonic=5.0))  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.loc[(frame["split"] == "dev") & (frame["strength"] == 2.0), "concept_harmonic"] = 9.0  # off the grid
    study = StudySelection(swept=["caa_concept", "caa_concept_random"], follows=FOLLOWS, task="t")
    monkeypatch.setattr(study_module, "study_frame", lambda *a, **k: frame)
    assert study.choose("unused", strengths=[0.6, 0.9]) == {"caa_concept": 0.6}
    poisoned = frame.assign(concept_harmonic=frame["concept_harmonic"].where(frame["split"] == "dev", -1.0))
    monkeypatch.setattr(study_module, "study_frame", lambda *a, **k: poisoned)
    assert study.choose("unused", strengths=[0.6, 0.9]) == {"caa_concept": 0.6}
    assert study.choose("unused") == {"caa_concept": 2.0}  # without the grid, every dev strength is a candidate


@pytest.mark.slow
def test_the_study_runs_in_one_command(run_app, tmp_path):
    proc = run_app(
        "--multirun",
        "experiment=concept_steering",
        "arm=baseline,caa_concept_random",  # the method itself is chosen on dev, not reported
        "strength=0.5,1.0",
        "logger=none",
        *FAST,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Sweep: 7/7 job(s) done" in proc.stdout + proc.stderr  # progress counts the jobs the sweeper launched
    (sweep,) = (tmp_path / "outputs" / "concept_steering" / "multiruns").iterdir()
    launched = json.loads((sweep / LAUNCHED_FILE).read_text())
    suites = [_suite(job) for job in launched]
    assert suites[:3] == ["concept_steering_dev"] * 3  # baseline + CAA at 0.5 and 1.0, all before any test job
    assert sorted(suites[3:]) == ["capability_offline"] * 2 + ["concept_steering_test"] * 2

    study = sweep / "study"
    record = json.loads((study / "selection.json").read_text())
    (caa,) = [c for c in record["choices"] if c["arm_name"] == "caa_concept"]
    (rnd,) = [c for c in record["choices"] if c["arm_name"] == "caa_concept_random"]
    assert caa["candidates"] == 2 and rnd["strength"] == caa["strength"]
    assert rnd["strength"] in (0.5, 1.0) and rnd["source"] == "caa_concept"  # the sanity arm takes CAA's choice
    assert len(record["dev_sample_ids"]) == 2 and len(record["test_sample_ids"]) == 2
    assert not set(record["dev_sample_ids"]) & set(record["test_sample_ids"])

    # the test split was generated only at the chosen strength: the unchosen one never reached it
    save_dir = tmp_path / "outputs" / "concept_steering" / "tiny" / "seed_0"
    configs = [json.loads(p.read_text()) for p in (save_dir / "configs").glob("*.json")]
    on_test = {p.parts[-3] for p in (save_dir / "inspect_logs").glob("*/trial_0/concept_steering_test")}
    strengths = {c["config_id"]: strength_of(c.get("controls")) for c in configs}
    assert len(on_test) == 2 and {strengths[c] for c in on_test} - {None} == {rnd["strength"]}

    results = pd.read_csv(study / "study_results.csv")
    assert set(results["arm_name"]) == {"baseline", "caa_concept_random"}
    assert (results.loc[results["arm_name"] != "baseline", "strength"] == rnd["strength"]).all()
    costs = pd.read_csv(study / "capability_costs.csv")
    assert set(costs["task"]) == {"steer_hydra/short_answer", "steer_hydra/arithmetic", "steer_hydra/mcqa"}
    assert set(costs["arm_name"]) == {"baseline", "caa_concept_random"} and (costs["n"] == 2).all()
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []
    assert not math.isnan(results.loc[results["metric"] == "concept_score", "delta"].iloc[0])
    assert Path(study / "study_deltas.png").stat().st_size > 0
