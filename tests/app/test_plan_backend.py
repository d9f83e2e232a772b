"""The job plan's save_dir protocol records the backend options the backend says bear on generation, no others; the
protocol and the cell key derive from one evaluation setting, so what leaves one unchanged leaves both."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from steer_hydra.app.plan import JobPlan
from steer_hydra.app.schema import register_configs


@pytest.fixture
def plan_for():
    """`plan_for(*overrides, backend="vllm_serve")`: the `JobPlan` of the app's config for the tiny model."""
    register_configs()

    def factory(*overrides: str, backend: str = "vllm_serve") -> JobPlan:
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):
            cfg = compose("config", overrides=["model=tiny", "logger=none", f"backend={backend}", *overrides])
        return JobPlan.from_config(cfg)

    yield factory
    GlobalHydra.instance().clear()


def cell_key_of(plan: JobPlan, trial: int = 0) -> str | None:
    return plan.runner()._cell_key(plan.config_id, trial, plan.suite)


def test_server_address_and_timeouts_leave_the_protocol_unchanged(plan_for):
    first = plan_for("backend.options.base_url=http://10.0.0.1:8000", "backend.options.request_timeout=60")
    second = plan_for(
        "backend.options.base_url=http://10.0.0.2:9000/v1",
        "backend.options.request_timeout=5",
        "backend.options.request_deadline=20",
        "backend.options.max_concurrency=2",
    )
    assert first.backend.kind == second.backend.kind == "vllm_serve"
    assert first.backend.options["base_url"] != second.backend.options["base_url"]
    assert first.protocol() == second.protocol()
    assert first.protocol()["backend"] == {"kind": "vllm_serve", "options": {"model": None}}
    # a moved server keeps the cells too: their key derives from the same setting
    assert first.runner().setting(first.suite) == second.runner().setting(second.suite)
    assert cell_key_of(first) == cell_key_of(second)


def test_the_served_model_changes_the_protocol(plan_for):
    named = plan_for("backend.options.base_url=http://10.0.0.1:8000", "backend.options.model=tiny-a")
    other = plan_for("backend.options.base_url=http://10.0.0.1:8000", "backend.options.model=tiny-b")
    assert named.protocol()["backend"]["options"] == {"model": "tiny-a"}
    assert named.protocol() != other.protocol()
    assert cell_key_of(named) != cell_key_of(other)


def test_the_protocol_is_the_setting_with_the_seed_and_the_cell_key_adds_the_trial_seed(plan_for):
    plan = plan_for("seed=3", backend="huggingface")
    setting = plan.runner().setting(plan.suite)
    assert plan.protocol() == {**setting, "seed": 3}
    assert cell_key_of(plan, trial=0) != cell_key_of(plan, trial=1)  # trials have their own seeds
    assert cell_key_of(plan_for("seed=4", backend="huggingface")) != cell_key_of(plan)
    assert plan_for("seed=4", backend="huggingface").runner().setting(plan.suite) == setting


def test_an_engine_backend_records_all_its_options(plan_for):
    eager = plan_for("backend.options.enforce_eager=true", backend="vllm")
    compiled = plan_for("backend.options.enforce_eager=false", backend="vllm")
    assert eager.protocol()["backend"]["options"]["enforce_eager"] is True
    assert eager.protocol() != compiled.protocol()
