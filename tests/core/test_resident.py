"""The resident base: handing the same base back (a rebuilt tuple of the same objects) closes nothing; another base
under the key, or another key, closes the one held first."""

from __future__ import annotations

import logging

from steer_hydra.core import resident


def test_handing_the_base_back_closes_nothing_and_a_new_one_closes_the_old(caplog):
    closed = []
    engine, loop = object(), object()
    resident.configure(True)
    with caplog.at_level(logging.INFO, logger="steer_hydra.core.resident"):
        resident.keep("k", (engine, loop), label="engine", close=closed.append)
        held = resident.take("k")
        assert held == (engine, loop)
        resident.keep("k", (held[0], held[1]), label="engine", close=closed.append)  # a job hands it back
        assert closed == [] and resident.holds("k")
        assert not any("Freeing" in r.getMessage() for r in caplog.records)
        resident.keep("k", (object(), loop), label="engine", close=closed.append)  # another engine, same key
        assert closed == [(engine, loop)]
        assert resident.take("other") is None and len(closed) == 2 and not resident.holds()


def test_a_sweep_leaves_the_resident_engine_to_a_backend_that_keeps_its_own_and_drops_it_for_one_that_does_not():
    """Building a pipeline that does not run on the shared Hugging Face base frees the resident base first (never two
    models), unless its backend keeps its own resident (vLLM's engine, which `take` reuses or frees itself)."""
    from steer_hydra.backends.vllm.offline import VLLMBackend
    from steer_hydra.core import ModelSource
    from steer_hydra.core.sweeps import PipelineFactory
    from steer_hydra.models import TINY_REF

    assert VLLMBackend.keeps_resident
    closed = []
    resident.configure(True)
    resident.keep("engine", "a booted engine", label="engine", close=closed.append)
    PipelineFactory(ModelSource(TINY_REF), backend="vllm").build([])  # builds only: no engine boots here
    assert resident.holds("engine") and closed == []
    PipelineFactory(ModelSource(TINY_REF), share_base=False).build([])  # a model of its own on Hugging Face
    assert not resident.holds() and closed == ["a booted engine"]


def test_a_model_loaded_to_fit_or_train_on_frees_the_resident_base_first_and_is_freed_itself():
    """`on_checkpoint_model`: the resident engine is closed before the checkpoint's model loads (never two models in
    memory), `work` gets the model in eval mode, and nothing keeps the model alive once `work` returns."""
    import gc
    import weakref

    import torch

    from steer_hydra.models import resolve_model_reference

    closed, seen = [], []
    resident.configure(True)
    resident.keep("engine", "a booted engine", label="engine", close=closed.append)

    def work(model):
        seen.append((list(closed), resident.holds(), model.training, next(model.parameters()).dtype))
        return weakref.ref(model)

    path = resolve_model_reference("steer_hydra:tiny")
    model_ref = resident.on_checkpoint_model(path, work, purpose="Fitting 1 vector(s)", dtype="bfloat16")
    gc.collect()
    assert seen == [(["a booted engine"], False, False, torch.bfloat16)]
    assert model_ref() is None


def test_a_checkpoint_that_does_not_load_names_the_work_and_the_fix(tmp_path):
    import pytest

    with pytest.raises(ValueError, match=r"SFTAdapter trains on the Hugging Face model of .*Fix: make model\."):
        resident.on_checkpoint_model(str(tmp_path / "missing"), lambda model: None, purpose="SFTAdapter trains")
