"""The concept-steering preset composes: arms, swept strength, SmolLM2, the suite with both splits, the selection."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate

from steer_hydra.app.plan import JobPlan
from steer_hydra.app.schema import register_configs
from steer_hydra.app.selection import StudySelection
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.state import CAA, PASTA, concept_pairs, concept_system_prompt

STUDY_ARMS = ("baseline", "prompt_weddings", "pasta", "caa_weddings", "caa_weddings_random", "caa_weddings_negated")


@pytest.fixture
def study():
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
        yield lambda *overrides, **kw: compose("config", overrides=["experiment=concept_steering", *overrides], **kw)
    GlobalHydra.instance().clear()


def test_the_sweep_covers_every_arm_and_strength_and_ends_in_selection(study):
    cfg = study(return_hydra_config=True)
    params = cfg.hydra.sweeper.params
    assert tuple(params.arm.split(",")) == STUDY_ARMS
    assert [float(s) for s in params.strength.split(",")] == sorted(float(s) for s in params.strength.split(","))
    callback = instantiate(cfg.hydra.callbacks.study_selection)
    assert isinstance(callback, StudySelection) and callback.objective.metric == "concept_harmonic"
    assert callback.follows == {"caa_weddings_random": "caa_weddings", "caa_weddings_negated": "caa_weddings"}
    assert set(callback.swept) == {"caa_weddings", "caa_weddings_random", "caa_weddings_negated"}
    assert cfg.model.model_name_or_path == "steer_hydra:smollm2" and cfg.suite.tasks == ["steer_hydra/concept_steering"]


@pytest.mark.parametrize("arm", STUDY_ARMS)
def test_every_arm_builds_with_the_swept_strength(study, arm):
    plan = JobPlan.from_config(study(f"arm={arm}", "strength=0.25"))
    again = JobPlan.from_config(study(f"arm={arm}", "strength=0.75"))
    if arm.startswith("caa"):
        (control,) = plan.controls
        assert isinstance(control, CAA) and control.multiplier == 0.25 and control.layer_id == 12
        assert control.direction == {"caa_weddings": "vector"}.get(arm, arm.rsplit("_", 1)[-1])
        assert control.accumulate == "completion" and control.strength_unit == "median_norm"
        assert list(control.data) == concept_pairs("weddings")
        assert plan.config_id != again.config_id  # each strength is its own configuration
    else:
        assert plan.config_id == again.config_id  # arms without ${strength} are evaluated once
    if arm == "pasta":
        assert isinstance(plan.controls[0], PASTA) and plan.controls[0].head_config == [10, 11, 12, 13]
    if arm == "prompt_weddings":
        assert isinstance(plan.controls[0], SystemPrompt)
        assert plan.controls[0].text == concept_system_prompt("weddings")


def test_sanity_arms_differ_from_the_method_only_in_direction(study):
    ids = {arm: JobPlan.from_config(study(f"arm={arm}")).config_id for arm in STUDY_ARMS[3:]}
    assert len(set(ids.values())) == 3
