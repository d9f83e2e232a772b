"""backend=vllm: the engine plumbing through a stand-in `vllm` module (the real engine: test_vllm_engine.py)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
import types
from typing import Any

import pytest
import torch

from steer_hydra.backends.vllm.lowering import sampling_fields
from steer_hydra.backends.vllm.offline import INSTALL_HINT, VLLMBackend, engine_kwargs
from steer_hydra.backends.vllm.steering import ENV_FLAG, RUNNER_ENV, XARGS_KEY, XARGS_START, lower
from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.state import CAA
from steer_hydra.core import BackendSpec, GenerationParams, ModelSource, SteeringPipeline
from steer_hydra.core.backend import backend_class
from steer_hydra.core.identity import derive_item_seed
from steer_hydra.models import TINY_REF, build_tiny_model


class _SamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


class _Engine:
    """The `LLMEngine` surface the backend's loop drives: every request added before a step finishes in it."""

    def __init__(self, llm: _LLM) -> None:
        self.llm = llm
        self.added: list[tuple[str, dict, _SamplingParams]] = []
        self.engine_core = types.SimpleNamespace(shutdown=llm.shutdown)

    def add_request(self, request_id: str, prompt: dict, params: _SamplingParams) -> None:
        self.added.append((request_id, prompt, params))

    def has_unfinished_requests(self) -> bool:
        return bool(self.added)

    def step(self) -> list:
        batch, self.added = self.added, []
        results = self.llm.generate([p for _, p, _ in batch], [s for *_, s in batch], use_tqdm=False)
        for (request_id, _, _), result in zip(batch, results, strict=True):
            result.request_id, result.finished = request_id, True
        return results

    def abort_request(self, request_ids: list[str]) -> None:
        pass


class _LLM:
    """Records the engine kwargs and the requests of each engine step; candidate j of request r of a step is
    `[100+r, 200+j]` (+ tail)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.environ = {name: os.environ.get(name) for name in (ENV_FLAG, RUNNER_ENV)}  # what its processes inherit
        self.calls: list[tuple[list, list, bool]] = []
        self.shut_down = False
        self.llm_engine = _Engine(self)

    def shutdown(self) -> None:
        self.shut_down = True

    def generate(self, requests, sampling_params, use_tqdm=True):
        self.calls.append((requests, sampling_params, use_tqdm))
        results = []
        for r, params in enumerate(sampling_params):
            outputs = [
                types.SimpleNamespace(index=j, token_ids=(100 + r, 200 + j, *([7] * j)))
                for j in range(params.kwargs["n"])
            ]
            results.append(types.SimpleNamespace(outputs=list(reversed(outputs))))  # engines need not sort
        return results


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType("vllm")
    module.LLM = _LLM
    module.SamplingParams = _SamplingParams
    module.sampling_params = types.ModuleType("vllm.sampling_params")
    module.sampling_params.RequestOutputKind = types.SimpleNamespace(FINAL_ONLY="final_only")
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", module.sampling_params)
    return module


def test_engine_gets_token_prompts_one_sampling_params_per_row_and_returns_grouped_candidates(fake_vllm):
    spec = BackendSpec("vllm", {"gpu_memory_utilization": 0.5, "max_model_len": None, "tensor_parallel_size": 1})
    pipeline = SteeringPipeline(TINY_REF, backend=spec).steer()
    engine = pipeline._backend.engine
    assert engine.kwargs["model"] == engine.kwargs["tokenizer"] == pipeline._backend.model_path
    assert {k: engine.kwargs[k] for k in ("gpu_memory_utilization", "tensor_parallel_size", "trust_remote_code")} == {
        "gpu_memory_utilization": 0.5,
        "tensor_parallel_size": 1,
        "trust_remote_code": False,
    }
    assert "max_model_len" not in engine.kwargs  # None means vLLM's default
    assert pipeline.model is None

    pad = pipeline.tokenizer.pad_token_id
    ids = torch.tensor([[pad, pad, 1, 50, 60], [1, 70, 80, 90, 95]])
    mask = (ids != pad).long()
    out = pipeline.generate(input_ids=ids, attention_mask=mask, do_sample=True, n=2, seed=4, max_new_tokens=5)

    ((requests, sampling, use_tqdm),) = engine.calls
    assert use_tqdm is False
    assert requests == [{"prompt_token_ids": [1, 50, 60]}, {"prompt_token_ids": [1, 70, 80, 90, 95]}]
    params = GenerationParams.from_kwargs(do_sample=True, n=2, seed=4, max_new_tokens=5)
    assert [s.kwargs for s in sampling] == [
        sampling_fields(params, seed=derive_item_seed(4, "generate", i)) for i in range(2)
    ]
    assert out.tolist() == [[100, 200, pad], [100, 201, 7], [101, 200, pad], [101, 201, 7]]
    backend = pipeline._backend
    pipeline.release()
    assert engine.shut_down and backend.engine is None


def test_the_engine_boots_with_the_plugin_on_and_vllms_v1_runner_and_the_protocol_says_so(fake_vllm, monkeypatch):
    monkeypatch.delenv(ENV_FLAG, raising=False)
    monkeypatch.setenv(RUNNER_ENV, "0")  # a user's explicit V1 is kept
    pipeline = SteeringPipeline(TINY_REF, backend="vllm").steer()
    assert pipeline._backend.engine.environ == {ENV_FLAG: "1", RUNNER_ENV: "0"}
    assert pipeline.backend_identity() == {"model_runner": "v1"}
    assert ENV_FLAG not in os.environ and os.environ[RUNNER_ENV] == "0"  # this process's environment as it was
    monkeypatch.delenv(RUNNER_ENV)
    other = SteeringPipeline(TINY_REF, backend="vllm").steer()
    assert other._backend.engine.environ == {ENV_FLAG: "1", RUNNER_ENV: "0"} and RUNNER_ENV not in os.environ


@pytest.mark.parametrize("value", ["1", "true"])
def test_a_forced_v2_runner_is_refused_in_one_line_before_the_engine_loads(value, fake_vllm, monkeypatch):
    monkeypatch.setenv(RUNNER_ENV, value)
    booted = []
    monkeypatch.setattr(fake_vllm, "LLM", lambda **kwargs: booted.append(kwargs))
    with pytest.raises(ValueError) as info:
        SteeringPipeline(TINY_REF, backend="vllm").steer()
    message = str(info.value)
    assert "\n" not in message and f"{RUNNER_ENV}={value} forces vLLM's V2 model runner" in message
    assert f"Fix: unset {RUNNER_ENV}" in message and booted == []


def test_greedy_candidates_are_one_engine_sample_copied(fake_vllm):
    pipeline = SteeringPipeline(TINY_REF, backend="vllm").steer()
    out = pipeline.generate(input_ids=[[1, 50, 60]], n=3, max_new_tokens=4)
    ((_, sampling, _),) = pipeline._backend.engine.calls
    assert sampling[0].kwargs["n"] == 1 and sampling[0].kwargs["temperature"] == 0.0
    assert out.tolist() == [[100, 200]] * 3
    pipeline.release()


def test_missing_extra_raises_an_import_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now raises ImportError
    pipeline = SteeringPipeline(TINY_REF, backend="vllm")
    with pytest.raises(ImportError, match=r"pip install 'steer_hydra\[vllm\]'.*scripts/setup_vllm.sh"):
        pipeline.steer()
    assert not pipeline.is_steered
    assert "setup_vllm.sh" in INSTALL_HINT


def test_check_and_the_module_never_import_vllm(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # any `import vllm` now raises ImportError
    source = importlib.import_module("steer_hydra.backends.vllm.offline").__file__
    spec = importlib.util.spec_from_file_location("_vllm_backend_probe", source)
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)  # a fresh execution of the module, without vllm
    assert probe.VLLMBackend.capabilities == backend_class("vllm").capabilities
    pipeline = SteeringPipeline(TINY_REF, controls=[SystemPrompt(text="Be brief.")], backend="vllm")
    assert pipeline.check().ok


def test_a_preloaded_model_cannot_be_handed_to_the_engine(fake_vllm):
    model, tokenizer = build_tiny_model()
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, backend="vllm")
    with pytest.raises(ValueError, match=r"cannot adopt a preloaded model=.*model_name_or_path"):
        pipeline.steer()


def test_engine_kwargs_drop_nones_and_refuse_pipeline_owned_keys():
    kwargs = engine_kwargs({"dtype": "auto", "max_model_len": None}, model_path="/m", trust_remote_code=True)
    assert kwargs == {"dtype": "auto", "model": "/m", "tokenizer": "/m", "trust_remote_code": True}
    with pytest.raises(ValueError, match=r"may not set \['model'\]"):
        engine_kwargs({"model": "/other"}, model_path="/m", trust_remote_code=False)


def test_the_engine_takes_the_model_groups_dtype_where_its_options_leave_it_to_vllm(fake_vllm):
    def dtype_of(options, model_dtype):
        return engine_kwargs(options, model_path="/m", trust_remote_code=False, model_dtype=model_dtype).get("dtype")

    assert dtype_of({"dtype": "auto"}, "float32") == dtype_of({}, "float32") == "float32"
    assert dtype_of({"dtype": "bfloat16"}, "float32") == "bfloat16"  # the backend's own setting wins
    assert dtype_of({"dtype": "auto"}, None) == "auto"
    source = ModelSource(TINY_REF, device_map=None, hf_model_kwargs={"dtype": "float32"})
    pipeline = SteeringPipeline(source, backend=BackendSpec("vllm", {"dtype": "auto"})).steer()
    assert pipeline._backend.engine.kwargs["dtype"] == "float32"
    pipeline.release()


def test_generate_before_load_says_how_to_start():
    with pytest.raises(RuntimeError, match="call steer"):
        VLLMBackend()._complete([[1]], [{"n": 1}])


def test_lowered_caa_travels_as_extra_args_and_a_cache_salt_on_steered_rows_only(fake_vllm):
    vector = torch.arange(64, dtype=torch.float32) / 64
    caa = CAA(steering_vector=vector, layer_id=1, multiplier=2.0, token_scope="last_k", last_k=2)
    with pytest.raises(ValueError, match=r"enforce_eager is None.*Fix: set backend.options.enforce_eager=true"):
        SteeringPipeline(TINY_REF, controls=[caa], backend="vllm").steer()
    spec = BackendSpec("vllm", {"enforce_eager": True})
    pipeline = SteeringPipeline(TINY_REF, controls=[caa], backend=spec).steer()
    assert caa.layer == 1
    pad = pipeline.tokenizer.pad_token_id
    ids = torch.tensor([[pad, pad, 1, 50, 60], [1, 70, 80, 90, 95]])
    pipeline.generate(input_ids=ids, attention_mask=(ids != pad).long(), max_new_tokens=3)
    (probe, _, _), (requests, sampling, _) = pipeline._backend.engine.calls  # the probe checks steering works
    assert [r["prompt_token_ids"] for r in probe] == [[1, 50, 60]] * 3 and "cache_salt" not in probe[0]
    payloads = [json.loads(s.kwargs["extra_args"][XARGS_KEY]) for s in sampling]
    assert payloads[0] == payloads[1] and payloads[0][0]["layer"] == 1 and payloads[0][0]["site"] == "output"
    assert torch.allclose(torch.tensor(payloads[0][0]["rows"][0]), 2.0 * vector)
    assert [s.kwargs["extra_args"][XARGS_START] for s in sampling] == [[1], [3]]  # prompt length - last_k
    salts = [r["cache_salt"] for r in requests]
    assert all(s.startswith("steer_hydra-") for s in salts) and salts[0] != salts[1]  # starts differ per row
    assert "vllm_xargs" not in sampling[0].kwargs
    pipeline.release()

    plain = SteeringPipeline(TINY_REF, backend="vllm").steer()
    plain.generate(input_ids=[[1, 50, 60]], max_new_tokens=3)
    ((requests, sampling, _),) = plain._backend.engine.calls
    assert "extra_args" not in sampling[0].kwargs and "cache_salt" not in requests[0]
    plain.release()


def test_an_engine_that_ignores_steering_is_caught_before_any_steered_row(fake_vllm, monkeypatch):
    def same_for_all(self, requests, sampling_params, use_tqdm=True):
        self.calls.append((requests, sampling_params, use_tqdm))
        return [types.SimpleNamespace(outputs=[types.SimpleNamespace(index=0, token_ids=(5, 6))]) for _ in requests]

    monkeypatch.setattr(_LLM, "generate", same_for_all)
    caa = CAA(steering_vector=torch.ones(64), layer_id=0)
    pipeline = SteeringPipeline(TINY_REF, controls=[caa], backend=BackendSpec("vllm", {"enforce_eager": True})).steer()
    with pytest.raises(RuntimeError, match=r"ignored steering.*STEER_HYDRA_VLLM_STEERING=1.*--enforce-eager"):
        pipeline.generate(input_ids=[[1, 50, 60]], max_new_tokens=3)
    assert len(pipeline._backend.engine.calls) == 1  # only the probe ran
    pipeline.release()


PAIRS = [
    {"prompt": "Answer:", "positive": "yes, gladly", "negative": "no, never"},
    {"prompt": "Reply:", "positive": "of course", "negative": "certainly not"},
]


def test_a_vector_to_fit_is_fitted_on_the_hf_model_before_the_engine_boots_and_cached(fake_vllm, monkeypatch, tmp_path):
    import transformers

    events: list[str] = []
    load = transformers.AutoModelForCausalLM.from_pretrained
    boot = fake_vllm.LLM
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: events.append("hf model") or load(*a, **k)
    )
    monkeypatch.setattr(fake_vllm, "LLM", lambda **kwargs: events.append("engine") or boot(**kwargs))
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "cache"))
    spec = BackendSpec("vllm", {"enforce_eager": True})
    vectors = tmp_path / "cache" / "vectors"

    caa = CAA(data=PAIRS, layer_id=1, multiplier=2.0)
    assert SteeringPipeline(TINY_REF, controls=[caa], backend=spec).check().ok  # no longer refused on vllm
    pipeline = SteeringPipeline(TINY_REF, controls=[caa], backend=spec).steer()
    assert events == ["hf model", "engine"]  # fitted (and that model dropped) before the engine started
    pipeline.release()
    reference = CAA(data=PAIRS, layer_id=1, multiplier=2.0)
    SteeringPipeline(TINY_REF, controls=[reference]).steer().release()  # fitted in process, on Hugging Face
    assert torch.allclose(lower(caa)[0].rows, reference.residual_addition().rows)
    assert len(list(vectors.glob("*.safetensors"))) == 1

    events.clear()
    again = CAA(data=PAIRS, layer_id=1, multiplier=-1.0)  # another multiplier: the same fit, read from the cache
    SteeringPipeline(TINY_REF, controls=[again], backend=spec).steer().release()
    assert events == ["engine"] and again.vector_hash == caa.vector_hash
    events.clear()
    other = CAA(data=PAIRS[:1], layer_id=1)  # other pairs: another fit
    SteeringPipeline(TINY_REF, controls=[other], backend=spec).steer().release()
    assert events == ["hf model", "engine"] and len(list(vectors.glob("*.safetensors"))) == 2
    assert other.vector_hash != caa.vector_hash

    serve = BackendSpec("vllm_serve", {"base_url": "http://127.0.0.1:1"})  # a server's checkpoint may live elsewhere
    report = SteeringPipeline(TINY_REF, controls=[CAA(data=PAIRS)], backend=serve).check()
    assert not report.ok and "hidden_capture" in report.failures[0].message
    launched = BackendSpec("vllm_serve", {"launch": True})  # a launched server runs the model group's checkpoint here
    assert SteeringPipeline(TINY_REF, controls=[CAA(data=PAIRS)], backend=launched).check().ok


def test_a_resident_engine_serves_cached_vectors_and_is_shut_before_a_new_fit(fake_vllm, monkeypatch, tmp_path):
    """With residency on, the next pipeline with the same engine settings reuses the booted engine when its vector is
    in the cache, and a vector still to fit shuts the engine first: the fit's model never sits beside an engine."""
    import transformers

    from steer_hydra.backends.vllm import offline
    from steer_hydra.core import resident

    events: list[str] = []
    load, boot, shutdown = transformers.AutoModelForCausalLM.from_pretrained, fake_vllm.LLM, offline._shutdown_engine
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: events.append("hf model") or load(*a, **k)
    )
    monkeypatch.setattr(fake_vllm, "LLM", lambda **kwargs: events.append("engine") or boot(**kwargs))
    monkeypatch.setattr(offline, "_shutdown_engine", lambda held: events.append("shutdown") or shutdown(held))
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "cache"))
    spec = BackendSpec("vllm", {"enforce_eager": True})
    resident.configure(True)

    SteeringPipeline(TINY_REF, controls=[CAA(data=PAIRS, layer_id=1)], backend=spec).steer().release()
    assert events == ["hf model", "engine"] and resident.holds()
    events.clear()
    again = SteeringPipeline(TINY_REF, controls=[CAA(data=PAIRS, layer_id=1, multiplier=-1.0)], backend=spec).steer()
    assert again.residency == "resident"
    again.release()
    assert events == []  # the cached vector, on the resident engine
    SteeringPipeline(TINY_REF, controls=[CAA(data=PAIRS[:1], layer_id=1)], backend=spec).steer().release()
    assert events == ["shutdown", "hf model", "engine"]
