"""Model layout: where a decoder's layers and their attention modules live, found by inspecting the model.

`resolve_layout(model)` finds the decoder-layer `ModuleList` (the list of identical blocks whose length is the
text config's `num_hidden_layers`) and, in each block, the self-attention module, and returns dotted paths that
`HookSet` specs and `model.get_submodule` accept. Nothing is hard-coded per family: Llama, Qwen2/3, Mistral,
Gemma 1-3, GPT-2 style (`transformer.h[i].attn`) and GPT-NeoX style (`layers[i].attention`) all resolve.

`config_int(config, keys)` reads one shape field (context window, layers, heads) from a model config, whether a
`config.json` mapping read without loading the model or a loaded model's config object.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger(__name__)

# A model config's context-window field, by family (the first one present counts).
CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def config_int(config: Any, keys: tuple[str, ...]) -> tuple[int, str] | None:
    """`(value, key)` of the first positive integer among `keys` in a model config (a mapping or a transformers
    config object), at its top level or else in a multimodal model's `text_config`; None when none is set."""

    def get(source: Any, key: str) -> Any:
        return source.get(key) if isinstance(source, Mapping) else getattr(source, key, None)

    text_config = get(config, "text_config")
    for key in keys:
        value = get(config, key)
        if value is None and text_config is not None:
            value = get(text_config, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None


# Attribute names a block commonly gives its self-attention module, most specific first.
_ATTENTION_NAMES = ("self_attn", "self_attention", "attn", "attention")
_NOT_ATTENTION = ("norm", "dropout", "rotary", "mlp")


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """Dotted module paths of a decoder stack, plus the head geometry controls need.

    Attributes:
        layers_path: the `ModuleList` of decoder layers (e.g. `model.layers`).
        attention_paths: one self-attention module path per layer.
        num_heads: query heads per layer; `num_key_value_heads` may be smaller (grouped-query attention).
        head_dim, hidden_size: per-head and residual-stream widths.
    """

    layers_path: str
    attention_paths: tuple[str, ...]
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int

    @property
    def num_layers(self) -> int:
        return len(self.attention_paths)

    def layer_path(self, index: int) -> str:
        """Dotted path of decoder layer `index` (negative indices count from the end)."""
        return f"{self.layers_path}.{self._check(index, 'layer')}"

    def attention_path(self, index: int) -> str:
        """Dotted path of the self-attention module of layer `index`."""
        return self.attention_paths[self._check(index, "layer")]

    def default_layer(self, fraction: float, minimum: int = 0) -> int:
        """The layer at `fraction` of the depth (rounded), clamped to `[minimum, num_layers - 1]`."""
        return max(min(minimum, self.num_layers - 1), min(self.num_layers - 1, round(fraction * self.num_layers)))

    def _check(self, index: int, what: str) -> int:
        n = self.num_layers
        if not -n <= index < n:
            raise ValueError(f"{what} index {index} is out of range; this model has {n} layers (0..{n - 1}).")
        return index % n


def text_config(model: torch.nn.Module) -> Any:
    """The model's text (decoder) config: `config.get_text_config()` when it exists, else `config`."""
    config = getattr(model, "config", None)
    if config is None:
        raise ValueError(f"{type(model).__name__} has no `config`; pass a Hugging Face PreTrainedModel.")
    getter = getattr(config, "get_text_config", None)
    return getter() if callable(getter) else config


def resolve_layout(model: torch.nn.Module) -> ModelLayout:
    """Inspect `model` and return its `ModelLayout`; raise ValueError naming what could not be found."""
    config = text_config(model)
    expected = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    candidates: list[tuple[str, torch.nn.ModuleList, list[str]]] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        if len({type(block) for block in module}) != 1:
            continue
        attention = [_attention_child(block) for block in module]
        if all(a is not None for a in attention):
            candidates.append((name, module, [f"{name}.{i}.{a}" for i, a in enumerate(attention)]))
    if not candidates:
        raise ValueError(
            f"Could not find the decoder layers of {type(model).__name__}: no ModuleList of identical blocks that "
            "each hold a self-attention module. Pass a decoder-only Hugging Face causal LM."
        )
    matching = [c for c in candidates if expected is not None and len(c[1]) == expected] or candidates
    # Prefer the language model's stack over e.g. a vision tower: the text-config length, then the shortest path.
    matching.sort(key=lambda c: ("language_model" not in c[0] and "text" not in c[0], c[0].count("."), c[0]))
    layers_path, layers, attention_paths = matching[0]
    first = model.get_submodule(attention_paths[0])
    num_heads = int(
        getattr(config, "num_attention_heads", None)
        or getattr(config, "n_head", None)
        or getattr(first, "num_heads", None)
        or 0
    )
    if num_heads <= 0:
        raise ValueError(f"Could not read the number of attention heads of {type(model).__name__} from its config.")
    hidden_size = int(getattr(config, "hidden_size", None) or getattr(config, "n_embd", 0))
    head_dim = int(getattr(first, "head_dim", None) or getattr(config, "head_dim", None) or hidden_size // num_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or num_heads)
    logger.debug("Layout of %s: %s (%d layers)", type(model).__name__, layers_path, len(layers))
    return ModelLayout(layers_path, tuple(attention_paths), num_heads, kv_heads, head_dim, hidden_size)


def _attention_child(block: torch.nn.Module) -> str | None:
    """Relative path of the self-attention module inside one decoder block, or None."""
    children = dict(block.named_children())
    for name in _ATTENTION_NAMES:
        if name in children:
            return name
    for name, module in block.named_modules():
        if not name:
            continue
        lowered = type(module).__name__.lower()
        if "attention" in lowered and not any(word in lowered for word in _NOT_ATTENTION):
            return name
    return None
