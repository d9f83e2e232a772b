"""`check()` verdicts on the vLLM backends: what runs there, and what is refused before any work, with the fix."""

from __future__ import annotations

import importlib
from collections.abc import Callable

import pytest
import torch

from steer_hydra.controls.input import FewShot, SystemPrompt
from steer_hydra.controls.output import StoppingRules
from steer_hydra.core import SteeringPipeline, UnsupportedPipelineError
from steer_hydra.core.backend import backend_class
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import DecodingDriver, StateControl
from steer_hydra.models import TINY_REF

ENGINES = ["vllm", "vllm_serve"]
ENGINE_IDS = ["offline-engine", "server"]  # not "vllm": conftest skips tests carrying that keyword without a GPU


# Stand-ins declaring what the real methods declare (spec section 3), so the verdicts are tested on their own.
class AttentionSteering(StateControl):
    """Like PASTA: in-process hooks (the default requirement, IN_PROCESS_TORCH)."""


class FittedVector(StateControl):
    """Like CAA fitted from pairs: hooks plus hidden-state capture at steer."""

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE})


class BeamSearchDriver(DecodingDriver):
    """Like DeAL: beam proposals."""

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.BEAM_PROPOSALS})


class SampledDriver(DecodingDriver):
    """Like BestOfN: sampled rollouts."""

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.SAMPLED_ROLLOUTS})


def _pipeline(controls, backend: str) -> SteeringPipeline:
    return SteeringPipeline(TINY_REF, controls=list(controls), backend=backend)


def test_engine_backends_advertise_rollouts_and_checkpoints_but_nothing_in_process():
    for kind in ENGINES:
        capabilities = backend_class(kind).capabilities
        assert capabilities == {Capability.SAMPLED_ROLLOUTS, Capability.SERVE_CHECKPOINT}
        assert backend_class(kind).native_n and backend_class(kind).batches_distinct_seeds
        assert not backend_class(kind).supports_refill
    assert backend_class("huggingface").supports_refill


@pytest.mark.parametrize("kind", ENGINES, ids=ENGINE_IDS)
def test_input_controls_stopping_rules_and_sampled_best_of_n_pass(kind):
    pool = [{"prompt": "Hi", "response": "Hello"}]
    controls = [
        SystemPrompt(text="Answer briefly."),
        FewShot(positive_example_pool=pool, k_positive=1),
        StoppingRules(stop_texts=["\n\n"], budget=16),
        SampledDriver(),
    ]
    report = _pipeline(controls, kind).check()
    assert report.ok, str(report)


@pytest.mark.parametrize("kind", ENGINES, ids=ENGINE_IDS)
@pytest.mark.parametrize(
    ("control", "atoms"),
    [
        (AttentionSteering, "in_process_torch"),
        (FittedVector, "hidden_capture, in_process_torch"),
        (BeamSearchDriver, "beam_proposals"),
    ],
)
def test_in_process_controls_and_beam_search_are_refused_naming_control_backend_and_fix(kind, control, atoms):
    report = _pipeline([SystemPrompt(text="Be brief."), control()], kind).check()
    assert not report.ok
    (failure,) = report.failures
    assert failure.control == control.__name__ and failure.phase == "generate"
    assert f"needs {atoms}, which backend {kind!r} does not offer" in failure.message
    assert "backend=huggingface" in failure.message
    assert control.__name__ in str(report) and kind in str(report)


def test_the_same_pipelines_pass_on_hugging_face():
    for control in (AttentionSteering, FittedVector, BeamSearchDriver, SampledDriver):
        assert _pipeline([control()], "huggingface").check().ok


def test_check_takes_a_backend_override_without_loading_anything():
    pipeline = _pipeline([AttentionSteering()], "huggingface")
    assert pipeline.check().ok
    assert not pipeline.check(backend="vllm_serve").ok
    assert pipeline.model is None and not pipeline.is_steered


def test_refusal_happens_before_any_work_on_the_server(serve_client, loopback):
    pipeline = serve_client([AttentionSteering()], steer=False)
    with pytest.raises(UnsupportedPipelineError, match=r"AttentionSteering.*backend=huggingface") as caught:
        pipeline.steer()
    assert loopback.requests == []  # not even /v1/models
    assert caught.value.report.backend == "vllm_serve"
    assert not pipeline.is_steered


def test_refusal_on_vllm_comes_before_the_missing_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "vllm", None)
    with pytest.raises(UnsupportedPipelineError, match="BeamSearchDriver"):
        _pipeline([BeamSearchDriver()], "vllm").steer()


# ---------------------------------------------------------------------- the real controls, where they exist
def _real(module: str, name: str, build: Callable[[type], object]) -> object:
    found = getattr(importlib.import_module(module), name, None) if importlib.util.find_spec(module) else None
    if found is None:
        pytest.skip(f"{module}.{name} is not available")
    return build(found)


def _score(prompt, continuations, params):
    return [0.0] * len(continuations)


REFUSED = [
    ("steer_hydra.controls.state.pasta", "PASTA", lambda cls: cls(head_config=[0], alpha=0.01)),
    ("steer_hydra.controls.state.caa", "CAA", lambda cls: cls(data=[{"positive": "yes", "negative": "no"}])),
    ("steer_hydra.controls.state.actadd", "ActAdd", lambda cls: cls(positive_prompt="Love", negative_prompt="Hate")),
    ("steer_hydra.controls.output.deal", "DeAL", lambda cls: cls(reward_func=_score)),
]


FITTED_HERE = {("vllm", "CAA"), ("vllm", "ActAdd")}  # the offline engine fits these on the Hugging Face model first


@pytest.mark.parametrize("kind", ENGINES, ids=ENGINE_IDS)
@pytest.mark.parametrize(("module", "name", "build"), REFUSED, ids=[r[1] for r in REFUSED])
def test_real_in_process_controls_are_refused_with_the_fix(kind, module, name, build):
    control = _real(module, name, build)
    report = _pipeline([control], kind).check()
    if (kind, name) in FITTED_HERE:
        assert report.ok, str(report)
        return
    assert [f.control for f in report.failures] == [name]
    assert "backend=huggingface" in report.failures[0].message and kind in report.failures[0].message


@pytest.mark.parametrize("kind", ENGINES, ids=ENGINE_IDS)
@pytest.mark.parametrize("name", ["CAA", "ActAdd"])
def test_layer_vectors_with_a_given_vector_run_inside_the_engine(kind, name):
    module = f"steer_hydra.controls.state.{name.lower()}"
    control = _real(module, name, lambda cls: cls(steering_vector=torch.ones(64), layer_id=1))
    assert _pipeline([SystemPrompt(text="Be brief."), control], kind).check().ok


@pytest.mark.parametrize("kind", ENGINES, ids=ENGINE_IDS)
def test_real_best_of_n_passes(kind):
    control = _real("steer_hydra.controls.output.best_of_n", "BestOfN", lambda cls: cls(n=4, scorer=_score))
    assert _pipeline([SystemPrompt(text="Be brief."), control], kind).check().ok
