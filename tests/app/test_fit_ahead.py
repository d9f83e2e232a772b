"""Fitting ahead (`app.prefit`): a run's or sweep's vectors fitted on one Hugging Face load before any engine
starts, cached where the jobs look, and equal to what a job fits on its own. On the tiny model, no vLLM needed:
the engine backends' fit runs on Hugging Face."""

from __future__ import annotations

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import open_dict
from transformers import AutoModelForCausalLM

from steer_hydra.app.plan import build_controls
from steer_hydra.app.prefit import FitAhead, fits_ahead, planned_jobs
from steer_hydra.app.schema import register_configs
from steer_hydra.backends.vllm.fit import fitted_for_engine, vector_path
from steer_hydra.backends.vllm.offline import VLLMBackend
from steer_hydra.core.source import ModelSource
from steer_hydra.models import resolve_model_reference

STUDY = ["experiment=concept_steering", "model=tiny", "backend=vllm"]
ARMS = ("baseline", "prompt_concept", "caa_concept", "caa_concept_random", "caa_concept_negated")
STUDY_GRID = [
    f"hydra.sweeper.arms=[{','.join(ARMS)}]",
    "hydra.sweeper.layers=[0,1]",
    "hydra.sweeper.attention_methods=[]",
]
STUDY_SWEEP = ["concept=weddings,joy", "strength=0.5,1.0"]


@pytest.fixture
def app(tmp_path, monkeypatch):
    """`app(*overrides)` -> the composed config with its hydra node, inside an initialized app; Hugging Face model
    loads are counted in `app.loads` (paths) and the vector cache is the test's own."""
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "cache"))
    loads: list[str] = []
    original = AutoModelForCausalLM.from_pretrained

    def counted(path, *args, **kwargs):
        loads.append(str(path))
        return original(path, *args, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", counted)
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="steer_hydra.conf", version_base="1.3"):

        def factory(*overrides, sweep=()):
            """The config; with `sweep`, a multirun's: those arguments reach the sweeper as on the command line."""
            config = compose("config", overrides=list(overrides), return_hydra_config=True)
            if sweep:
                with open_dict(config):
                    config.hydra.overrides.task = [*(o for o in overrides if not o.startswith("hydra.")), *sweep]
            return config

        factory.loads = loads
        yield factory
    GlobalHydra.instance().clear()


def _vectors(tmp_path):
    return sorted((tmp_path / "cache" / "vectors").glob("*.safetensors"))


def test_a_studys_vectors_are_fitted_on_one_load_before_any_job(app, tmp_path):
    config = app(*STUDY, *STUDY_GRID, sweep=STUDY_SWEEP)
    jobs = planned_jobs(config)
    assert len(jobs) == 2 * (2 + 3 * 2)  # per concept: the baseline, the prompt, each CAA arm at each layer
    assert {next(o for o in job if o.startswith("arm=")) for job in jobs} == {f"arm={arm}" for arm in ARMS}
    assert not any("strength=1.0" in job for job in jobs)  # a strength never changes a fit: the gentlest stands in

    FitAhead().on_multirun_start(config)
    assert len(_vectors(tmp_path)) == 2 * 2  # one per concept and layer: the negated and random arms share CAA's
    tiny = resolve_model_reference("steer_hydra:tiny")
    assert app.loads == [tiny]  # every fit on one load

    FitAhead().on_multirun_start(config)  # a second study on the same checkpoint finds them all
    assert app.loads == [tiny]


def test_planning_the_fit_leaves_the_warning_about_unusable_concepts_to_the_sweeper(app, monkeypatch, tmp_path):
    import logging

    from steer_hydra.app.study import plan_study

    warned: list[str] = []
    concepts = logging.getLogger("steer_hydra.tasks.concepts")
    monkeypatch.setattr(concepts, "handle", lambda record: warned.append(record.getMessage()))
    missing = tmp_path / "missing.yaml"  # left out of the study, with a warning
    config = app(*STUDY, *STUDY_GRID, sweep=[f"concept=weddings,{missing}"])
    assert len(planned_jobs(config)) == 2 + 3 * 2 and warned == []
    spec = {k: v for k, v in config.hydra.sweeper.items() if k != "_target_"}
    plan_study(spec, list(config.hydra.overrides.task), config)  # what the sweeper does next: the one warning
    assert len(warned) == 1 and "no such concept file" in warned[0]


def test_a_vector_fitted_ahead_is_the_one_a_job_would_fit_and_finds(app, tmp_path, monkeypatch):
    config = app(*STUDY, *STUDY_GRID, sweep=STUDY_SWEEP)
    FitAhead().on_multirun_start(config)
    job = app(*STUDY, "concept=joy", "model.steering_layer=0")
    (control,) = build_controls(job.arm.controls)
    tiny = resolve_model_reference("steer_hydra:tiny")
    ahead = vector_path(control, tiny)
    assert ahead in _vectors(tmp_path)  # where the job's `steer_control` looks (float32: the model group's default)

    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "alone"))  # the job fitting it itself, from nothing
    tokenizer = VLLMBackend._client_tokenizer(None, tiny, False)
    alone = fitted_for_engine(control, tiny, tokenizer)
    fitted = control.load_vector(ahead)
    assert fitted.layer == alone.layer == 0 and dict(fitted.metadata) == dict(alone.metadata)
    assert torch.equal(fitted.tensor, alone.tensor)  # bit-exact: fits sharing one load leak nothing into each other


def test_the_fit_uses_the_dtype_and_tokenizer_a_job_of_the_backend_uses(app, tmp_path):
    job = app(*STUDY, "+model.hf_model_kwargs.dtype=bfloat16")
    controls = build_controls(job.arm.controls)
    source = ModelSource.from_config(dict(job.model))
    (written,) = VLLMBackend.fit_ahead(controls, source, dict(job.backend.options))
    tiny = resolve_model_reference("steer_hydra:tiny")
    assert written == vector_path(controls[0], tiny, dtype="bfloat16") != vector_path(controls[0], tiny)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["backend=vllm"], True),
        (["backend=vllm", "fit_ahead=false"], False),
        (["backend=huggingface"], False),  # fits in the job's own model: nothing to fit ahead
        (["backend=vllm_serve"], False),  # a server elsewhere: its checkpoint may not be this one
        (["backend=vllm_serve", "backend.options.launch=true"], True),
    ],
)
def test_which_runs_fit_ahead(app, overrides, expected):
    assert fits_ahead(app("model=tiny", *overrides)) is expected


def test_a_basic_sweeps_jobs_are_planned_and_fitted_and_a_job_that_does_not_compose_is_left_to_itself(app, tmp_path):
    config = app("model=tiny", "backend=vllm", sweep=["arm=caa_concept,no_such_arm", "model.steering_layer=0,1"])
    assert len(planned_jobs(config)) == 4
    FitAhead().on_multirun_start(config)
    assert len(_vectors(tmp_path)) == 2  # caa_concept at two layers; the arm that does not exist fails in its job


def test_a_failed_fit_is_one_warning_and_the_sweep_goes_on(app, tmp_path, monkeypatch, caplog):
    config = app("model=tiny", "backend=vllm", "arm=caa_concept")

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", broken)
    FitAhead().on_run_start(config)
    assert "Fitting ahead failed (out of memory); each job fits or trains its own" in caplog.text
    assert _vectors(tmp_path) == []


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers' renamed gradient-checkpointing flags, inside TRL
def test_a_trainers_adapters_are_trained_ahead_and_a_job_finds_its_own_without_loading_the_model(
    app, tmp_path, monkeypatch
):
    """SFT's adapter at each learning rate of the sweep is trained before any engine starts, both on one load of the
    checkpoint; the job's own preparation (`prepare_for_engine`, as `backend=vllm` calls it) then trains nothing and
    loads nothing."""
    pytest.importorskip("trl")
    fixed = ["model=tiny", "backend=vllm", "concept=weddings", "arm=sft_concept", "+arm.controls.sft.max_steps=2"]
    config = app(*fixed, sweep=["arm.controls.sft.learning_rate=1e-4,5e-4"])
    FitAhead().on_multirun_start(config)
    tiny = resolve_model_reference("steer_hydra:tiny")
    assert app.loads == [tiny]
    assert len([p for p in (tmp_path / "cache" / "adapters").iterdir() if (p / "artifact.json").is_file()]) == 2

    job = app(*fixed, "arm.controls.sft.learning_rate=5e-4")
    (control,) = build_controls(job.arm.controls)
    model_path, tokenizer, dtype = VLLMBackend._checkpoint_of(ModelSource.from_config(dict(job.model)), {})
    control.prepare_for_engine(model_path, tokenizer, dtype=dtype)
    assert control.trained_steps == 0 and app.loads == [tiny]
    assert control.export_lora().path == str(control.artifact_path)

    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "alone"))  # the job training it itself, from nothing
    (alone,) = build_controls(job.arm.controls)
    alone.prepare_for_engine(model_path, tokenizer, dtype=dtype)
    assert alone.trained_steps > 0 and alone.export_lora().sha256 == control.export_lora().sha256  # same bytes
