"""Model layout: decoder layers and attention modules found by inspection, across model families."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from steer_hydra.core.layout import resolve_layout
from steer_hydra.models.tiny import FAMILY_DEFAULTS, build_family_model

# (model_type, expected layers path, expected attention child)
FAMILIES = [
    ("llama", "model.layers", "self_attn"),
    ("qwen2", "model.layers", "self_attn"),
    ("mistral", "model.layers", "self_attn"),
    ("gemma", "model.layers", "self_attn"),
    ("gemma2", "model.layers", "self_attn"),
    ("gemma3_text", "model.layers", "self_attn"),
]


def _random_model(model_type: str, **overrides):
    return build_family_model(model_type, **{"num_hidden_layers": 3, **overrides})


@pytest.mark.parametrize(("model_type", "layers_path", "attention"), FAMILIES)
def test_layout_resolves_each_family(model_type, layers_path, attention):
    model = _random_model(model_type)
    layout = resolve_layout(model)
    assert layout.layers_path == layers_path
    assert layout.num_layers == 3
    assert layout.attention_paths == tuple(f"{layers_path}.{i}.{attention}" for i in range(3))
    assert (layout.num_heads, layout.num_key_value_heads, layout.head_dim, layout.hidden_size) == (4, 2, 8, 32)
    for i in range(3):
        # paths are usable by HookSet specs: get_submodule finds the modules, and they are the right ones
        assert model.get_submodule(layout.layer_path(i)) is model.get_submodule(layers_path)[i]
        assert model.get_submodule(layout.attention_path(i)).layer_idx == i


def test_layout_of_gpt2_style_model_uses_its_own_names():
    config = AutoConfig.for_model("gpt2", n_embd=32, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    layout = resolve_layout(AutoModelForCausalLM.from_config(config))
    assert layout.layers_path == "transformer.h"
    assert layout.attention_paths == ("transformer.h.0.attn", "transformer.h.1.attn")
    assert (layout.num_heads, layout.hidden_size, layout.head_dim) == (4, 32, 8)


def test_layout_of_tiny_model(tiny):
    model, _ = tiny
    layout = resolve_layout(model)
    assert layout.layers_path == "model.layers"
    assert layout.attention_paths == ("model.layers.0.self_attn", "model.layers.1.self_attn")
    assert layout.num_heads == 4 and layout.hidden_size == 64


def test_default_layer_heuristic_and_range_errors():
    model = _random_model("llama", num_hidden_layers=10)
    layout = resolve_layout(model)
    assert layout.default_layer(0.4) == 4
    assert layout.default_layer(0.0, minimum=1) == 1
    assert layout.default_layer(1.0) == 9
    assert layout.layer_path(-1) == "model.layers.9"
    with pytest.raises(ValueError, match="out of range; this model has 10 layers"):
        layout.attention_path(10)


def test_layout_refuses_a_model_without_decoder_layers():
    class NotADecoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = AutoConfig.for_model("llama", **FAMILY_DEFAULTS)
            self.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    with pytest.raises(ValueError, match="Could not find the decoder layers of NotADecoder"):
        resolve_layout(NotADecoder())
