"""The concept-steering preset composes: the study sweeper (arms, strength grid, dev/test suites, costs), SmolLM2."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from hydra_plugins.steer_hydra_study.study_sweeper import StudySweeper
from steer_hydra.app.compose import to_plain
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.schema import register_configs
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.state import CAA, PASTA, DirectionalAblation
from steer_hydra.study.plan import StudyPlan
from steer_hydra.tasks.concepts import concept_pairs, concept_system_prompt

STUDY_ARMS = ("baseline", "prompt_concept", "pasta", "caa_concept", "caa_concept_random", "caa_concept_negated")


@pytest.fixture
def study():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
        yield lambda *overrides, **kw: compose("config", overrides=["experiment=concept_steering", *overrides], **kw)
    GlobalHydra.instance().clear()


def test_the_study_sweeper_covers_every_arm_and_grid_and_the_costs(study):
    cfg = study(return_hydra_config=True)
    sweeper = instantiate(cfg.hydra.sweeper)
    plan = StudyPlan(**to_plain(sweeper.spec))
    assert type(sweeper).__name__ == StudySweeper.__name__ and tuple(plan.arms) == STUDY_ARMS
    assert len(plan.strengths) >= 3 and plan.layers == [] and plan.concepts == ["weddings"]
    assert plan.objective == "concept_harmonic" and plan.maximize
    assert plan.follows == {"caa_concept_random": "caa_concept", "caa_concept_negated": "caa_concept"}
    assert plan.methods() == ["pasta", "caa_concept"] and plan.cost_suites == ["capability_offline"]
    assert cfg.model.model_name_or_path == "steer_hydra:smollm2"
    for suite, split in ((plan.dev_suite, "dev"), (plan.test_suite, "test")):
        composed = study(f"suite={suite}", "concept=joy")
        assert composed.suite.tasks == ["steer_hydra/concept_steering"]
        assert composed.suite.task_args == {"concept": "joy", "split": split}
        assert composed.suite.name == f"concept_steering_{split}_joy"  # each concept has its own cells
    assert study("suite=capability_offline").suite.limit >= 60


@pytest.mark.parametrize("arm", STUDY_ARMS)
def test_every_arm_builds_with_the_swept_strength(study, arm):
    plan = JobPlan.from_config(study(f"arm={arm}", "strength=0.25"))
    again = JobPlan.from_config(study(f"arm={arm}", "strength=0.75"))
    if arm.startswith("caa"):
        (control,) = plan.controls
        assert isinstance(control, CAA) and control.multiplier == 0.25 and control.layer_id == 12
        assert control.direction == {"caa_concept": "vector"}.get(arm, arm.rsplit("_", 1)[-1])
        assert control.accumulate == "completion" and control.strength_unit == "median_norm"
        assert list(control.data) == concept_pairs("weddings")
        assert plan.config_id != again.config_id  # each strength is its own configuration
    else:
        assert plan.config_id == again.config_id  # arms without ${strength} are evaluated once
    if arm == "pasta":
        assert isinstance(plan.controls[0], PASTA) and plan.controls[0].head_config == [10, 11, 12, 13]
    if arm == "prompt_concept":
        assert isinstance(plan.controls[0], SystemPrompt)
        assert plan.controls[0].text == concept_system_prompt("weddings")


def test_sanity_arms_differ_from_the_method_only_in_direction(study):
    ids = {arm: JobPlan.from_config(study(f"arm={arm}")).config_id for arm in STUDY_ARMS[3:]}
    assert len(set(ids.values())) == 3


def test_any_state_or_output_control_joins_the_study_as_an_arm_run_once_at_no_grid_point(study, tmp_path):
    """Directional ablation against CAA, plus an output control from an arm of the user's own: arms that are not
    methods (no strength, no alpha) get no dev jobs and are reported once, at no grid point."""
    arms = tmp_path / "arm"
    arms.mkdir()
    (arms / "contrastive_concept.yaml").write_text(
        "# @package arm\ndefaults:\n  - /control@controls.cd: contrastive_decoding\n"
        "name: contrastive_concept\ncontrols:\n  cd: {amateur: 'steer_hydra:tiny?seed=1&hidden_size=32'}\n"
    )
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    cfg = study(searchpath, return_hydra_config=True)
    plan = StudyPlan(**to_plain(instantiate(cfg.hydra.sweeper).spec))
    plan.take_arguments(["arm=baseline,caa_concept,ablation_concept,contrastive_concept"])
    assert plan.methods() == ["caa_concept"]
    dev = plan.dev_jobs([])
    assert {job.arm_name for job in dev} == {"baseline", "caa_concept"}
    chosen = {("weddings", "caa_concept"): plan.grid("caa_concept")[0]}
    report = plan.report_jobs([], chosen)
    points = {(job.arm_name, job.stage): job.point.label for job in report}
    assert points[("ablation_concept", "test")] == points[("contrastive_concept", "cost")] == "-"
    assert points[("caa_concept", "test")] == plan.grid("caa_concept")[0].label
    ablation = JobPlan.from_config(study("arm=ablation_concept", "concept=joy"))
    (control,) = ablation.controls
    assert isinstance(control, DirectionalAblation) and list(control.data) == concept_pairs("joy")
    assert control.layer_id == 12 and control.accumulate == "completion"
    contrastive = JobPlan.from_config(study("arm=contrastive_concept", searchpath))
    assert [type(c).__name__ for c in contrastive.controls] == ["ContrastiveDecoding"]
