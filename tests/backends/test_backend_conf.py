"""The `backend` config group: each option loads, names a valid kind, and its options parse for its backend."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import steer_hydra
from steer_hydra.backends.vllm import engine_kwargs
from steer_hydra.backends.vllm_serve import ServeOptions
from steer_hydra.core import BackendSpec

CONF = Path(steer_hydra.__file__).parent / "conf" / "backend"


def _load(name: str):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    return cfg, OmegaConf.to_container(cfg.options, resolve=True, throw_on_missing=False)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("huggingface", "huggingface"), ("vllm", "vllm"), ("vllm_serve", "vllm-serve")],
    ids=["hf", "engine", "server"],  # not "vllm": conftest skips tests carrying that keyword without a GPU
)
def test_each_option_names_a_registered_kind(name, kind):
    cfg, options = _load(name)
    assert BackendSpec.coerce({"kind": cfg.kind, "options": options}).kind == kind


def test_vllm_engine_kwargs_drop_unset_values():
    _, options = _load("vllm")
    kwargs = engine_kwargs(options, model_path="/m", trust_remote_code=False)
    assert kwargs["tensor_parallel_size"] == 1 and kwargs["gpu_memory_utilization"] == 0.85
    assert "max_model_len" not in kwargs and kwargs["model"] == "/m"


def test_vllm_serve_requires_base_url_and_mirrors_the_option_defaults():
    _, options = _load("vllm_serve")
    with pytest.raises(ValueError, match=r"needs options.base_url.*backend.options.base_url="):
        ServeOptions.from_mapping(options)
    parsed = ServeOptions.from_mapping({**options, "base_url": "http://localhost:8000"})
    defaults = {f.name: f.default for f in dataclasses.fields(ServeOptions) if f.name != "base_url"}
    assert {k: getattr(parsed, k) for k in defaults} == defaults
    assert "api_key" not in options


@pytest.mark.skipif(importlib.util.find_spec("steer_hydra.app.schema") is None, reason="no app schema yet")
@pytest.mark.parametrize("name", ["huggingface", "vllm", "vllm_serve"], ids=["hf", "engine", "server"])
def test_options_validate_against_the_app_schema(name):
    from steer_hydra.app.schema import BackendConfig

    merged = OmegaConf.merge(OmegaConf.structured(BackendConfig), OmegaConf.load(CONF / f"{name}.yaml"))
    assert BackendSpec.coerce({"kind": merged.kind.value, "options": {}}).kind.replace("-", "_") == name
