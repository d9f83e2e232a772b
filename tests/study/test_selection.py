"""Held-out selection: each method's grid point chosen per concept on dev rows only (never test), ties to the
point launched first, sanity arms at their method's choice; the plan's grids and jobs."""

from __future__ import annotations

import pandas as pd
import pytest

from steer_hydra.study.plan import Point, StudyPlan, concept_list
from steer_hydra.study.selection import Objective, chosen_points, select_points
from steer_hydra.tasks.concepts import concept_yaml, load_concept

# (strength, layer) -> dev objective of every sample; (0.6, 8) wins on dev, (1.2, 12) would win on test
DEV = {(0.6, 8): 0.7, (0.6, 12): 0.4, (1.2, 8): 0.2, (1.2, 12): 0.5}


def _frame(stage: str = "dev", table=DEV, concept: str = "weddings") -> pd.DataFrame:
    rows = []
    for job, ((strength, layer), value) in enumerate(table.items()):
        point = Point((("strength", strength), ("layer", layer)))
        for i in range(4):
            rows.append(dict(stage=stage, concept=concept, arm_name="caa", point=point.label, **point.columns(),
                             job=job, config_id=f"c{job}", sample_id=f"s{i}", trial_id=0,
                             score=value + (0.01 if i == 0 else 0)))  # fmt: skip
    return pd.DataFrame(rows)


def test_every_dev_point_is_listed_and_the_best_is_chosen_per_concept():
    frame = pd.concat([_frame(), _frame(table={k: 1 - v for k, v in DEV.items()}, concept="joy")])
    table = select_points(frame, Objective("score"), methods=["caa"], follows={"caa_random": "caa"})
    assert len(table) == 2 * 4 + 2  # every point of both concepts, plus the follower's two choices
    choices = chosen_points(table)
    assert choices[("weddings", "caa")] == Point((("strength", 0.6), ("layer", 8)))
    assert choices[("joy", "caa")] == Point((("strength", 1.2), ("layer", 8)))
    assert choices[("joy", "caa_random")] == choices[("joy", "caa")]  # the sanity arm takes its method's point
    weddings = table[(table["concept"] == "weddings") & (table["arm_name"] == "caa")].set_index("point")
    assert weddings.loc["strength=0.6 layer=8", "objective"] == pytest.approx(0.7025)
    assert weddings["n"].tolist() == [4, 4, 4, 4]
    assert Point.from_columns(table.iloc[0].to_dict()).overrides() == ["strength=0.6", "model.steering_layer=8"]


def test_the_choice_never_reads_test_rows():
    with pytest.raises(ValueError, match="dev rows only"):
        select_points(pd.concat([_frame(), _frame("test")]), Objective("score"), methods=["caa"])
    poisoned_test = _frame("test", table={k: 1 - v for k, v in DEV.items()})
    both = pd.concat([_frame(), poisoned_test])
    alone = select_points(_frame(), Objective("score"), methods=["caa"])
    assert select_points(both[both["stage"] == "dev"], Objective("score"), methods=["caa"]).equals(alone)


def test_ties_go_to_the_point_launched_first_and_minimizing_works():
    flat = _frame(table=dict.fromkeys(DEV, 0.5))
    first = chosen_points(select_points(flat, Objective("score"), methods=["caa"]))[("weddings", "caa")]
    assert first.label == "strength=0.6 layer=8"
    lowest = chosen_points(select_points(_frame(), Objective("score", maximize=False), methods=["caa"]))
    assert lowest[("weddings", "caa")].label == "strength=1.2 layer=8"


def _plan(**kw) -> StudyPlan:
    args = dict(arms=["baseline", "prompt_concept", "pasta", "caa_concept", "caa_concept_random"],
                concepts=["weddings", "joy"], vector_methods=["caa_concept", "caa_concept_random"],
                attention_methods=["pasta"], strengths=[1.2, 0.6], layers=[12, 8], alphas=[0.05, 0.01],
                follows={"caa_concept_random": "caa_concept"}, cost_suites=["capability_offline"])  # fmt: skip
    return StudyPlan(**{**args, **kw})


def test_grids_run_gentlest_first_and_dev_jobs_only_touch_the_dev_suite():
    plan = _plan()
    assert plan.methods() == ["pasta", "caa_concept"]
    assert [p.label for p in plan.grid("caa_concept")] == [
        "strength=0.6 layer=8", "strength=0.6 layer=12", "strength=1.2 layer=8", "strength=1.2 layer=12",
    ]  # fmt: skip
    assert [p.overrides() for p in plan.grid("pasta")] == [
        ["arm.controls.pasta.alpha=0.01"],
        ["arm.controls.pasta.alpha=0.05"],
    ]
    assert _plan(layers=[]).grid("caa_concept")[0].overrides() == ["strength=0.6"]  # the model's layer
    dev = plan.dev_jobs(["model=tiny"])
    assert len(dev) == 2 * (1 + 2 + 4)  # per concept: baseline, PASTA's alphas, CAA's strength x layer
    assert {job.suite for job in dev} == {"concept_steering_dev"}
    assert dev[0].overrides == ("model=tiny", "concept=weddings", "arm=baseline", "suite=concept_steering_dev")


def test_report_jobs_put_every_arm_at_its_methods_chosen_point_per_concept():
    plan = _plan()
    choices = {(c, m): plan.grid(m)[i] for c, i in (("weddings", 0), ("joy", 1)) for m in plan.methods()}
    jobs = plan.report_jobs([], choices)
    assert len(jobs) == 2 * 2 * 5  # concepts x (test, cost) x arms
    for job in jobs:
        expected = choices.get((job.concept, {"caa_concept_random": "caa_concept"}.get(job.arm_name, job.arm_name)))
        assert job.point == (expected or Point())
        assert f"concept={job.concept}" in job.overrides and job.stage in ("test", "cost")
    with pytest.raises(ValueError, match="needs alphas"):
        _plan(alphas=[])


def test_the_command_line_sets_arms_grid_and_concepts(tmp_path):
    plan = _plan()
    passthrough = plan.take_arguments(
        ["model=tiny", "arm=baseline,caa_concept", "strength=0.9,-0.3", "concept=joy,pirate"]
    )
    assert passthrough == ["model=tiny", "plots=false"]  # the study draws its own plots
    assert _plan().take_arguments(["plots=true", "model=tiny"]) == ["plots=true", "model=tiny"]  # unless asked
    assert plan.arms == ["baseline", "caa_concept"] and plan.strengths == [-0.3, 0.9]
    assert plan.concepts == ["joy", "pirate"]
    listing = tmp_path / "concepts.txt"
    listing.write_text("weddings\n# a comment\njoy  # trailing\n\n")
    assert concept_list([str(listing)]) == ["weddings", "joy"]
    concept_file = tmp_path / "mine.yaml"
    concept_file.write_text(concept_yaml(load_concept("joy")).replace("name: joy", "name: mine", 1))
    assert concept_list([str(concept_file)]) == [str(concept_file)]  # one concept file, not a list
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\n")
    assert concept_list(["joy", str(broken), str(concept_file)]) == ["joy", str(concept_file)]  # checked, left out
    with pytest.raises(ValueError, match="sweeps only"):
        _plan().take_arguments(["seed=1,2"])


def test_a_concept_file_is_keyed_by_its_name_and_an_unswept_layer_is_recorded(tmp_path):
    concept_file = tmp_path / "mine.yaml"
    concept_file.write_text(concept_yaml(load_concept("joy")).replace("name: joy", "name: mine", 1))
    plan = _plan(layers=[])
    plan.default_layer = 7  # the model's steering_layer
    plan.take_arguments([f"concept={concept_file}"])
    jobs = plan.dev_jobs([])
    assert {job.concept for job in jobs} == {"mine"}  # every study file keys it by its name, not its path
    assert all(f"concept={concept_file}" in job.overrides for job in jobs)  # the jobs still read the file
    caa = [job for job in jobs if job.arm_name == "caa_concept"]
    assert [job.row()["point"] for job in caa] == ["strength=0.6 layer=7", "strength=1.2 layer=7"]
    assert {job.row()["layer"] for job in caa} == {7}
    assert not any("layer" in o for job in caa for o in job.overrides)  # recorded, never overridden
    pasta = next(job for job in jobs if job.arm_name == "pasta")
    assert pasta.row()["layer"] is None  # not a vector method: no layer to record


def test_a_concept_file_with_a_syntax_error_is_refused_naming_the_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\npairs: [\n  - prompt: a\n")
    with pytest.raises(ValueError, match=r"broken\.yaml.*line"):
        _plan().take_arguments([f"concept={broken}"])
