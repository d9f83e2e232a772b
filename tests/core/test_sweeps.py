"""Sweeps: configuration expansion and identity, preflight, and PipelineFactory (shared base, tripwire, release)."""

from __future__ import annotations

import gc
import logging
import re
from dataclasses import dataclass

import pytest
import torch

from steer_hydra.controls.input import SystemPrompt
from steer_hydra.core import BaseArgs, InputControl, ModelSource, StructuralControl
from steer_hydra.core.specs import ControlSpec, Factory
from steer_hydra.core.sweeps import PipelineFactory, expand_configurations, preflight
from steer_hydra.models import TINY_REF

HEX12 = re.compile(r"^[0-9a-f]{12}$")


@pytest.fixture(autouse=True)
def _no_full_gc(monkeypatch):
    """Releasing a pipeline runs gc.collect() (~0.5 s in a full test process); these tests need no real freeing."""
    monkeypatch.setattr(gc, "collect", lambda *args: 0)


class Knob(InputControl):
    @dataclass(frozen=True)
    class Args(BaseArgs):
        alpha: float = 1.0
        layer: int = 0

    supports_batching = True
    cleanups = 0

    def cleanup(self) -> None:
        type(self).cleanups += 1


class Picky(InputControl):
    supports_batching = True

    def constraint_failures(self, backend_kind, hf_model_kwargs):
        if hf_model_kwargs.get("attn_implementation") != "eager":
            return ["needs attn_implementation='eager'. Fix: pass hf_model_kwargs={'attn_implementation': 'eager'}."]
        return []


class Vandal(InputControl):
    """Edits the model's weights in place at steer() and never restores them."""

    supports_batching = True

    def steer(self, model, tokenizer=None, **kwargs):
        with torch.no_grad():
            next(model.parameters()).add_(1.0)


class Careful(InputControl):
    """Edits the weights at steer() and restores them in cleanup()."""

    supports_batching = True

    def steer(self, model, tokenizer=None, **kwargs):
        self._param = next(model.parameters())
        self._saved = self._param.detach().clone()
        with torch.no_grad():
            self._param.add_(1.0)

    def cleanup(self):
        with torch.no_grad():
            self._param.copy_(self._saved)


class Hooker(InputControl):
    """Leaves a forward hook registered on the model."""

    supports_batching = True

    def steer(self, model, tokenizer=None, **kwargs):
        model.model.norm.register_forward_hook(lambda *a: None)


class Rebuild(StructuralControl):
    def steer(self, model, tokenizer=None, **kwargs):
        from steer_hydra.models import build_tiny_model

        return build_tiny_model()[0]


# ------------------------------------------------------------------------------------------ expansion
def test_baseline_and_fixed_controls():
    sp = SystemPrompt(text="Be brief.")
    points = expand_configurations({"baseline": [], "sys": [sp]}, TINY_REF)
    assert [p.arm for p in points] == ["baseline", "sys"]
    assert points[0].config_id == "baseline" and points[0].controls_factory() == [] and points[0].is_baseline
    assert HEX12.match(points[1].config_id)
    assert points[1].params == {}
    assert points[1].controls_factory()[0] is sp  # fixed controls are the same instances


def test_config_ids_are_stable_and_content_addressed():
    a = expand_configurations({"a": [SystemPrompt(text="x")]})[0].config_id
    same = expand_configurations({"other": [SystemPrompt(text="x")]})[0].config_id
    different = expand_configurations({"a": [SystemPrompt(text="y")]})[0].config_id
    disabled = expand_configurations({"a": [SystemPrompt(text="x", enabled=False)]})[0].config_id
    assert a == same
    assert len({a, different, disabled}) == 3


def test_spec_pipelines_take_the_product_of_spec_points():
    specs = [
        ControlSpec(Knob, params={"layer": 1}, vars={"alpha": [0.1, 0.2]}, name="knob"),
        ControlSpec(SystemPrompt, vars={"text": ["a", "b", "c"]}),
    ]
    points = expand_configurations({"sweep": specs}, TINY_REF)
    assert len(points) == 6
    assert len({p.config_id for p in points}) == 6
    assert all(HEX12.match(p.config_id) for p in points)
    assert points[0].params == {"knob": {"layer": 1, "alpha": 0.1}, "SystemPrompt": {"text": "a"}}
    first, again = points[4].controls_factory(), points[4].controls_factory()
    assert first[0] is not again[0]  # fresh instances per call
    assert (first[0].alpha, first[0].layer, first[1].text) == (0.2, 1, "b")
    # the same sweep expands to the same ids
    assert [p.config_id for p in expand_configurations({"sweep": specs})] == [p.config_id for p in points]


def test_factories_see_the_point_context():
    seen = []
    spec = ControlSpec(Knob, params={"layer": Factory(lambda ctx: seen.append(dict(ctx)) or 3)}, vars={"alpha": [1.0]})
    point = expand_configurations({"arm": [spec]}, "base-model")[0]
    assert point.controls_factory()[0].layer == 3
    assert seen[0]["arm"] == "arm"
    assert seen[0]["base_model_name_or_path"] == "base-model"
    assert seen[0]["combo_id"] == 0
    assert seen[0]["search_params"] == {"alpha": 1.0}


@pytest.mark.parametrize(
    ("pipelines", "error", "match"),
    [
        ([SystemPrompt(text="x")], TypeError, "dict"),
        ({"a": SystemPrompt(text="x")}, TypeError, "must be a list"),
        ({"a": [SystemPrompt(text="x"), ControlSpec(Knob)]}, ValueError, "mixes"),
        ({"a": [ControlSpec(Knob), ControlSpec(Knob)]}, ValueError, "distinct name"),
        ({"a": ["SystemPrompt"]}, TypeError, "controls or ControlSpecs"),
        ({"": []}, ValueError, "non-empty"),
    ],
)
def test_expansion_errors(pipelines, error, match):
    with pytest.raises(error, match=match):
        expand_configurations(pipelines)


def test_identical_configurations_under_two_names_are_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="steer_hydra.core.sweeps"):
        points = expand_configurations({"a": [SystemPrompt(text="x")], "b": [SystemPrompt(text="x")]})
    assert points[0].config_id == points[1].config_id
    assert "share one set of logs" in caplog.text


# ------------------------------------------------------------------------------------------ preflight
def test_preflight_reports_each_point_without_loading_anything():
    points = expand_configurations({"baseline": [], "picky": [Picky()], "ok": [Knob()]}, TINY_REF)
    reports = preflight(points, source=TINY_REF)
    assert [r.ok for r in reports] == [True, False, True]
    assert "Picky" in reports[1].failures[0] and "eager" in reports[1].failures[0]
    eager = preflight(points, source=ModelSource(TINY_REF, hf_model_kwargs={"attn_implementation": "eager"}))
    assert all(r.ok for r in eager)


def test_preflight_records_a_point_that_cannot_be_built():
    spec = ControlSpec(Knob, vars={"alpha": ["not a float"]})
    reports = preflight(expand_configurations({"bad": [spec]}), source=TINY_REF)
    assert not reports[0].ok
    assert "cannot build" in reports[0].failures[0] and "alpha" in reports[0].failures[0]


def test_preflight_collects_declared_runtime_kwargs():
    class Declares(InputControl):
        RUNTIME_KWARGS_SCHEMA = [{"name": "substrings", "type": "list", "scope": "row"}]

    reports = preflight(expand_configurations({"d": [Declares()], "b": []}), source=TINY_REF)
    assert reports[0].runtime_kwargs == frozenset({"substrings"})
    assert reports[1].runtime_kwargs == frozenset()


# ------------------------------------------------------------------------------------------ factory
def test_shared_base_is_loaded_once_and_reused():
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    assert factory.backend_kind == "huggingface" and factory.shared_base_fingerprint is None
    with factory.steered([]) as first:
        model_a = first.model
        assert first.is_steered
    fingerprint = factory.shared_base_fingerprint
    assert fingerprint is not None
    with factory.steered([SystemPrompt(text="x")]) as second:
        assert second.model is model_a
    assert not first.is_steered and not second.is_steered  # released on exit
    assert factory.shared_base_fingerprint == fingerprint
    factory.release()
    with factory.steered([]) as third:
        assert third.model is not model_a  # released base is reloaded
    factory.release()


def test_structural_configurations_do_not_share_the_base():
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    assert factory.uses_shared_base([SystemPrompt(text="x")])
    assert not factory.uses_shared_base([Rebuild()])
    assert factory.uses_shared_base([Rebuild(enabled=False)])
    assert not PipelineFactory(TINY_REF, backend="vllm").uses_shared_base([])
    assert not PipelineFactory(TINY_REF, share_base=False).uses_shared_base([])
    with factory.steered([Rebuild()]) as pipeline:
        assert pipeline.model is not None
    assert factory._base_model is None  # nothing was shared
    factory.release()


def test_a_structural_configuration_drops_the_shared_base_first_and_release_forgets_it():
    def live_models():  # whole models (a causal LM holds its base model as a second PreTrainedModel)
        gc.collect()
        return sum(1 for o in gc.get_objects() if type(o).__name__.endswith("ForCausalLM"))

    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    before = live_models()
    with factory.steered([SystemPrompt(text="x")]):
        pass
    assert factory.shared_base_fingerprint is not None and live_models() == before + 1  # the shared base
    with factory.steered([Rebuild()]) as pipeline:
        assert factory._base_model is None and factory.shared_base_fingerprint is None
        assert live_models() == before + 1  # peak: one model, its own
        assert pipeline.model is not None
    factory.release()
    assert factory.shared_base_fingerprint is None and live_models() == before


@pytest.mark.parametrize("culprit", [Vandal, Hooker])
def test_tripwire_drops_a_base_left_changed(culprit, caplog):
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    with factory.steered([]) as pipeline:
        original = pipeline.model
    with caplog.at_level(logging.WARNING, logger="steer_hydra.core.sweeps"), factory.steered([culprit()]):
        pass
    assert culprit.__name__ in caplog.text and "fresh base" in caplog.text
    with factory.steered([]) as pipeline:
        assert pipeline.model is not original
        fresh = next(pipeline.model.parameters()).detach().clone()
    # exact: a fresh load of the base, and Vandal's add_(1.0) rounds as this sum does
    assert torch.equal(fresh + (1.0 if culprit is Vandal else 0.0), next(original.parameters()).detach())
    factory.release()


def test_tripwire_samples_weights_when_the_fingerprint_does_not_hash_them(monkeypatch, caplog):
    import steer_hydra.core.sweeps as sweeps

    monkeypatch.setattr(sweeps, "model_fingerprint", lambda model: "config-only")  # as for a large model
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    with caplog.at_level(logging.WARNING, logger="steer_hydra.core.sweeps"), factory.steered([Vandal()]):
        pass
    assert "Vandal" in caplog.text and factory._base_model is None
    factory.release()


def test_tripwire_keeps_a_base_restored_by_cleanup(caplog):
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    with caplog.at_level(logging.WARNING, logger="steer_hydra.core.sweeps"):
        with factory.steered([Careful()]) as pipeline:
            model = pipeline.model
        with factory.steered([]) as pipeline:
            assert pipeline.model is model
    assert "fresh base" not in caplog.text
    factory.release()


def test_steered_releases_and_cleans_up_once_when_the_body_fails():
    Knob.cleanups = 0
    factory = PipelineFactory(ModelSource(TINY_REF, device_map=None))
    with pytest.raises(RuntimeError, match="boom"), factory.steered([Knob()]) as pipeline:
        raise RuntimeError("boom")
    assert Knob.cleanups == 1
    assert not pipeline.is_steered
    factory.release()
