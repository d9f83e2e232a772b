"""The vLLM backends' preparation hook (`LoRAServing.steer_control`): a control with `prepare_for_engine` builds what it
serves on the Hugging Face model of the engine's checkpoint before the engine boots: a trainer's adapter, then served
per request through `export_lora`; a prompt optimizer's instruction, then applied with no live model. No engine runs:
a stub backend stands in for the engine half."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import transformers

from steer_hydra.backends.vllm.offline import LoRAServing, VLLMBackend
from steer_hydra.controls.optimizers import PRewrite
from steer_hydra.controls.structural import SFTAdapter
from steer_hydra.core import ModelSource, resident
from steer_hydra.models import TINY_REF, build_tiny_model, resolve_model_reference

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"), pytest.mark.filterwarnings("ignore::FutureWarning")]


class _Engine:
    """The engine half: a control that is not a LoRA is steered without a model (as `EngineSteering` does)."""

    kind = "vllm"

    def steer_control(self, control: Any, tokenizer: Any, **steer_kwargs: Any) -> Any:
        return control.steer(None, tokenizer=tokenizer, backend=self.kind, **steer_kwargs)


class StubBackend(LoRAServing, _Engine):
    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.prepared: list[Any] = []

    def _prepare_lora(self, artifact: Any, control: Any) -> None:
        self.prepared.append(artifact)


def test_a_trainer_is_trained_before_the_engine_and_its_adapter_served(tmp_path):
    pytest.importorskip("trl")
    _, tokenizer = build_tiny_model()
    rows = [{"prompt": "tell me about the cat", "response": "the cat is kind"}] * 4
    control = SFTAdapter(data=rows, max_steps=2, learning_rate=1e-2, save_steps=100, cache_dir=str(tmp_path))
    backend = StubBackend(resolve_model_reference("steer_hydra:tiny"))
    assert backend.steer_control(control, tokenizer) is None
    (artifact,) = backend.prepared
    assert control.trained_steps == 2 and artifact.path == str(control.artifact_path)
    assert backend._lora is artifact and artifact.name.startswith("sft-")


def _prewrite(cache_dir: Path) -> PRewrite:
    """A prompt optimizer that runs in seconds on the tiny model (one proposed rewrite, no RL)."""
    return PRewrite(
        initial="Answer the question.",
        data=[{"input": "what is the capital of france", "reference": "paris"}] * 2,
        scorer=lambda response, row: float(len(response) % 3),
        proposer=lambda prompt: "Say paris.",
        rl_steps=0,
        num_rewrites=1,
        max_new_tokens=4,
        cache_dir=str(cache_dir),
    )


def test_a_prompt_optimizer_chooses_before_the_engine_and_rewrites_without_a_model(tmp_path):
    _, tokenizer = build_tiny_model()
    control = _prewrite(tmp_path)
    backend = StubBackend(resolve_model_reference("steer_hydra:tiny"))
    backend.steer_control(control, tokenizer)
    assert backend.prepared == [] and control.text in ("Answer the question.", "Say paris.")
    (chat,) = control.adapt_messages([[{"role": "user", "content": "hi"}]], {})
    assert chat[0] == {"role": "system", "content": control.text}


def test_a_trainer_frees_the_resident_engine_only_when_it_trains(tmp_path):
    """Training loads the checkpoint's model: the engine a previous job left resident is freed first (never two
    models in memory). A cached adapter loads nothing, and the resident engine stays for the next job."""
    pytest.importorskip("trl")
    _, tokenizer = build_tiny_model()
    path = resolve_model_reference("steer_hydra:tiny")
    rows = [{"prompt": "tell me about the cat", "response": "the cat is kind"}] * 4
    closed: list[Any] = []
    resident.configure(True)
    resident.keep("engine", "a booted engine", label="engine", close=closed.append)
    first = SFTAdapter(data=rows, max_steps=2, learning_rate=1e-2, save_steps=100, cache_dir=str(tmp_path))
    first.prepare_for_engine(path, tokenizer)
    assert first.trained_steps == 2 and closed == ["a booted engine"] and not resident.holds()

    resident.keep("engine", "another engine", label="engine", close=closed.append)
    again = SFTAdapter(data=rows, max_steps=2, learning_rate=1e-2, save_steps=100, cache_dir=str(tmp_path))
    again.prepare_for_engine(path, tokenizer)
    assert again.trained_steps == 0 and resident.holds("engine") and closed == ["a booted engine"]


def test_a_prompt_optimizer_chosen_ahead_is_found_by_the_job_without_loading_the_model(tmp_path, monkeypatch):
    """Ahead of the jobs (`fit_ahead`), the checkpoint's model is loaded (freeing anything resident), the instruction
    chosen and the model's digest memoised; the job's own preparation then finds the instruction cached, loads
    nothing and leaves the engine resident."""
    _, tokenizer = build_tiny_model()
    path = resolve_model_reference("steer_hydra:tiny")
    resident.configure(True)
    closed: list[Any] = []
    resident.keep("engine", "a booted engine", label="engine", close=closed.append)
    first = _prewrite(tmp_path)
    (entry,) = VLLMBackend.fit_ahead([first], ModelSource(TINY_REF), {})
    assert entry.parent.name == "prompts" and closed == ["a booted engine"]
    assert VLLMBackend.fit_ahead([_prewrite(tmp_path)], ModelSource(TINY_REF), {}) == []  # chosen already

    def no_load(*args, **kwargs):
        raise AssertionError("a cached instruction must not load the model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_load)
    resident.keep("engine", "another engine", label="engine", close=closed.append)
    again = _prewrite(tmp_path)
    assert again.prepare_for_engine(path, tokenizer) is None
    assert again.reused and again.text == first.text and resident.holds("engine")
