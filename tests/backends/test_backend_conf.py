"""The `backend` config group: each option loads, names a valid kind, and its options parse for its backend."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import steer_hydra
from steer_hydra.backends.vllm.offline import engine_kwargs
from steer_hydra.backends.vllm.serve import ServeOptions
from steer_hydra.core import BackendSpec
from steer_hydra.core.backend import BACKENDS

CONF = Path(steer_hydra.__file__).parent / "conf" / "backend"


def _load(name: str):
    cfg = OmegaConf.load(CONF / f"{name}.yaml")
    return cfg, OmegaConf.to_container(cfg.options, resolve=True, throw_on_missing=False)


@pytest.mark.parametrize(
    ("name", "kind"),
    [("huggingface", "huggingface"), ("vllm", "vllm"), ("vllm_serve", "vllm_serve")],
    ids=["hf", "engine", "server"],  # not "vllm": conftest skips tests carrying that keyword without a GPU
)
def test_each_option_names_a_registered_kind(name, kind):
    cfg, options = _load(name)
    assert BackendSpec.coerce({"kind": cfg.kind, "options": options}).kind == kind


def test_kinds_are_spelled_as_the_options_and_older_inputs_normalize_to_them():
    assert set(BACKENDS) == {p.stem for p in CONF.glob("*.yaml")}
    assert BackendSpec("vllm-serve", {"base_url": "http://h:1"}).kind == "vllm_serve"
    assert BackendSpec.coerce("hf") == BackendSpec("huggingface")
    with pytest.raises(ValueError, match=r"Unknown backend kind 'vllm_server'. Fix: use one of \['huggingface'"):
        BackendSpec("vllm_server")


PROTOCOL_IMPORTS = """
import sys
from steer_hydra.core.backend import BackendSpec
served = BackendSpec("vllm_serve", {"base_url": "http://h:1", "request_timeout": 5, "model": "m"}).protocol_options()
engine = BackendSpec("vllm", {"dtype": "half"}).protocol_options()
print(served, engine, sorted(m for m in ("vllm", "httpx", "transformers") if m in sys.modules))
"""


def test_protocol_options_of_the_engine_backends_import_no_engine_client_or_transformers():
    proc = subprocess.run([sys.executable, "-c", PROTOCOL_IMPORTS], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "{'model': 'm'} {'dtype': 'half'} []"


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
    assert BackendSpec.coerce({"kind": merged.kind.value, "options": {}}).kind == name


def test_pre_flight_imports_exactly_the_backends_that_check_their_options():
    from steer_hydra.core.backend import CHECKS_OPTIONS, Backend, backend_class

    base = Backend.check_options.__func__
    overriding = {kind for kind in BACKENDS if backend_class(kind).check_options.__func__ is not base}
    assert overriding == set(CHECKS_OPTIONS)
    assert BackendSpec("huggingface").check_options() == []  # nothing to check: its module is not imported
    bad = BackendSpec("vllm", {"dtype": "fp7"}).check_options()
    assert any("backend.options.dtype='fp7' is not a vLLM dtype" in problem for problem in bad)
