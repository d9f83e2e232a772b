"""ITI, CAST, angular steering and ActivationAdapter through the Hydra app: one sweep beside the baseline on the tiny
model (each arm changes some completion and the results table names it), and their concept arms in the study (own
strength axes: each grid point is its own configuration, overriding the control's own strength)."""

from __future__ import annotations

from pathlib import Path

import pytest
from app_helpers import SMALL, check_arms_beside_baseline, sweep_dir, write_arms
from hydra.utils import instantiate

from steer_hydra.app.compose import to_plain
from steer_hydra.app.plan import JobPlan
from steer_hydra.controls.state import CAST, ITI, ActivationAdapter, AngularSteering
from steer_hydra.study.plan import StudyPlan
from steer_hydra.tasks.concepts import concept_pairs

ARMS = ["iti", "cast_open", "angular_steering", "activation_adapter"]


def _cast_arm(root: Path) -> str:
    """A CAST arm whose gate is open for every prompt (threshold 0 with '>': a similarity is >= 0), so the one sample
    per task surely differs from the baseline's (the gating itself is tested in tests/controls/state/test_cast.py)."""
    body = "defaults:\n  - /control@controls.cast: cast\ncontrols:\n  cast: {threshold: 0.0, comparison: '>'}"
    return write_arms(root, {"cast_open": body})


@pytest.mark.slow
def test_each_new_state_control_runs_in_one_sweep_beside_the_baseline_on_tiny(run_main, tmp_path):
    search = _cast_arm(tmp_path)
    code, out, err = run_main("--multirun", "model=tiny", search, f"arm=baseline,{','.join(ARMS)}", *SMALL)
    assert code == 0, err[-3000:]
    check_arms_beside_baseline(sweep_dir(tmp_path), ARMS, out)


def _study_plan(study, arms: str) -> StudyPlan:
    """The concept study's plan (the preset's sweeper) with the command line's `arm=<arms>`."""
    plan = StudyPlan(**to_plain(instantiate(study(return_hydra_config=True).hydra.sweeper).spec))
    plan.take_arguments([f"arm={arms}"])
    return plan


def test_the_concept_arms_join_the_study_with_their_own_strength_axes(study):
    plan = _study_plan(study, "baseline,caa_concept,iti_concept,angular_concept,cast_concept")
    assert plan.methods() == ["caa_concept", "iti_concept", "angular_concept", "cast_concept"]
    expected = {
        "iti_concept": ("iti_alpha", "arm.controls.iti.alpha", ITI, "alpha"),
        "angular_concept": ("angle", "arm.controls.angular.angle", AngularSteering, "angle"),
        "cast_concept": ("cast_strength", "arm.controls.cast.multiplier", CAST, "multiplier"),
    }
    dev = plan.dev_jobs([])
    ids = set()
    for arm, (axis, key, control_class, field_name) in expected.items():
        points = plan.grid(arm)
        assert len(points) == 3 and [p.values[0][0] for p in points] == [axis] * 3
        values = [p.values[0][1] for p in points]
        assert values == sorted(values)  # the gentlest first: ties in the objective go to it
        jobs = [job for job in dev if job.arm_name == arm]
        assert [job.point for job in jobs] == points
        for job, value in zip(jobs, values, strict=True):
            assert f"{key}={value!r}" in job.overrides
            job_plan = JobPlan.from_config(study(f"arm={arm}", f"{key}={value!r}", "concept=joy"))
            (control,) = job_plan.controls
            assert isinstance(control, control_class) and getattr(control, field_name) == value
            ids.add(job_plan.config_id)
        assert list(control.data) == concept_pairs("joy")
    assert len(ids) == 9  # every point of every method is its own configuration
    cast = JobPlan.from_config(study("arm=cast_concept", "strength=0.3")).controls[0]
    assert cast.multiplier == 0.3 and cast.layer_id == 12 and cast.condition_open_for == "negative"
    assert list(cast.condition_data) == concept_pairs("weddings")
    chosen = {("weddings", arm): plan.grid(arm)[1] for arm in plan.methods()}
    report = {(j.arm_name, j.stage): j.point for j in plan.report_jobs([], chosen)}
    assert report[("angular_concept", "test")] == plan.grid("angular_concept")[1]


def test_the_study_refuses_a_grid_on_an_unknown_axis():
    with pytest.raises(ValueError, match=r"grids\['iti_concept'\] must map axes among .* Fix"):
        StudyPlan(arms=["baseline"], grids={"iti_concept": {"temperature": [1.0]}})
    with pytest.raises(ValueError, match="non-empty value lists"):
        StudyPlan(arms=["baseline"], grids={"iti_concept": {"iti_alpha": []}})


def test_the_adapter_option_is_caa_as_shipped(compose_cfg):
    (control,) = JobPlan.from_config(compose_cfg(["arm=activation_adapter"])).controls
    assert isinstance(control, ActivationAdapter) and control.transform == "add" and list(control.sites) == ["output"]


def test_the_trained_arms_choose_their_learning_rate_on_dev_and_report_at_it(study):
    from steer_hydra.controls.structural import DPOAdapter, SFTAdapter
    from steer_hydra.controls.trained import LoReFT

    plan = _study_plan(study, "baseline,caa_concept,sft_concept,dpo_concept,reft_concept")
    assert plan.methods() == ["caa_concept", "sft_concept", "dpo_concept", "reft_concept"]
    expected = {
        "sft_concept": ("sft_lr", "arm.controls.sft.learning_rate", SFTAdapter),
        "dpo_concept": ("dpo_lr", "arm.controls.dpo.learning_rate", DPOAdapter),
        "reft_concept": ("reft_lr", "arm.controls.reft.learning_rate", LoReFT),
    }
    dev = plan.dev_jobs([])
    for arm, (axis, key, control_class) in expected.items():
        points = plan.grid(arm)
        values = [p.values[0][1] for p in points]
        assert [p.values[0][0] for p in points] == [axis, axis] and values == sorted(values)  # the gentlest first
        jobs = [job for job in dev if job.arm_name == arm and job.suite == "concept_steering_dev"]
        assert [job.point for job in jobs] == points  # one adapter per learning rate, chosen on dev
        ids = set()
        for job, value in zip(jobs, values, strict=True):
            assert f"{key}={value!r}" in job.overrides
            (control,) = JobPlan.from_config(study(f"arm={arm}", f"{key}={value!r}", "concept=joy")).controls
            assert isinstance(control, control_class) and control.learning_rate == value
            assert list(control.data) == concept_pairs("joy")  # the training pairs, never dev or test rows
            ids.add(control.learning_rate)
        assert len(ids) == 2
    chosen = {("weddings", arm): plan.grid(arm)[1] for arm in plan.methods()}
    report = {(j.arm_name, j.stage): j.point for j in plan.report_jobs([], chosen)}
    assert report[("sft_concept", "test")] == report[("sft_concept", "cost")] == plan.grid("sft_concept")[1]
