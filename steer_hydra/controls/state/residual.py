"""Residual-stream helpers shared by CAA and ActAdd: hook plumbing, absolute positions, capture for fitting.

Positions: a decoder layer sees a window of `q` hidden states of a left-packed batch; their absolute positions
(columns of the padded sequence) are `past + arange(q)`, where `past` is the number of positions the layer's KV
cache held before this forward (read in a forward *pre*-hook, before the attention updates the cache). Without
a cache the forward covers the whole sequence, so `past` is 0. This holds for batched, left-padded generation
with a KV cache (every row shares the column index) and for drivers that call `generate` several times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from steer_hydra.core.layout import ModelLayout

_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")


def past_length(kwargs: Mapping[str, Any], layer_index: int) -> int:
    """Positions already cached for this layer before the current forward (read it in a pre-hook)."""
    cache_position = kwargs.get("cache_position")
    if isinstance(cache_position, torch.Tensor) and cache_position.numel():
        return int(cache_position.reshape(-1)[0])
    for name in _CACHE_KWARGS:
        cache = kwargs.get(name)
        if cache is not None and hasattr(cache, "get_seq_length"):
            return int(cache.get_seq_length(layer_index))
    return 0


def input_hidden(args: tuple, kwargs: Mapping[str, Any]) -> torch.Tensor:
    """The hidden states a decoder layer receives (first positional argument or `hidden_states=`)."""
    return args[0] if args else kwargs["hidden_states"]


def with_input_hidden(args: tuple, kwargs: dict[str, Any], hidden: torch.Tensor) -> tuple[tuple, dict[str, Any]]:
    """`(args, kwargs)` for a pre-hook with the hidden states replaced."""
    if args:
        return (hidden, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": hidden}


def output_hidden(output: Any) -> torch.Tensor:
    """The hidden states a decoder layer returns (a tensor, or the first element of a tuple)."""
    return output if isinstance(output, torch.Tensor) else output[0]


def with_output_hidden(output: Any, hidden: torch.Tensor) -> Any:
    """The layer's output with the hidden states replaced, in the same form."""
    if isinstance(output, torch.Tensor):
        return hidden
    return (hidden, *output[1:])


def preserve_norm(original: torch.Tensor, steered: torch.Tensor) -> torch.Tensor:
    """Rescale each position of `steered` to the L2 norm of the same position in `original`."""
    scale = original.norm(dim=-1, keepdim=True) / steered.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return steered * scale


def normalized(vector: torch.Tensor) -> torch.Tensor:
    """Unit L2 norm along the last dimension (each position of a positional block separately)."""
    norm = vector.norm(dim=-1, keepdim=True)
    if bool((norm == 0).any()):
        raise ValueError("normalize_vector=True but the steering vector has a zero-norm row; it has no direction.")
    return vector / norm


def check_hidden_size(vector: torch.Tensor, hidden_size: int, field_name: str) -> None:
    """Raise when the vector's last dimension is not the model's residual width."""
    if vector.shape[-1] != hidden_size:
        raise ValueError(
            f"{field_name} has width {vector.shape[-1]} but the model's hidden size is {hidden_size}; "
            "use a vector fitted on this model."
        )


def check_layer(owner: str, layer: int, layout: ModelLayout, fields: str) -> None:
    """Raise when `layer` is not one of the model's decoder layers, naming the arguments (`fields`) to fix."""
    if not 0 <= layer < layout.num_layers:
        raise ValueError(
            f"{owner}: layer {layer} is out of range; the model has {layout.num_layers} layers "
            f"(0..{layout.num_layers - 1}). Fix: {fields} within that range."
        )


def capture_layer(
    model: torch.nn.Module,
    layer_path: str,
    encoded: Sequence[Mapping[str, torch.Tensor]],
    *,
    boundary: str,
    reduce: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """Run `model` on each encoded batch and return `reduce(hidden, attention_mask)` of one layer, in float32.

    `boundary` is `"output"` (the layer's output, a forward hook) or `"input"` (its input, a pre-hook). The
    hook is removed before returning, also when the forward raises.
    """
    layer = model.get_submodule(layer_path)
    captured: list[torch.Tensor] = []
    device = next(model.parameters()).device

    def on_output(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        captured.append(output_hidden(output).detach().float())

    def on_input(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        captured.append(input_hidden(args, kwargs).detach().float())

    if boundary == "output":
        handle = layer.register_forward_hook(on_output, with_kwargs=True)
    elif boundary == "input":
        handle = layer.register_forward_pre_hook(on_input, with_kwargs=True)
    else:
        raise ValueError(f"boundary must be 'input' or 'output'; got {boundary!r}.")
    results = []
    try:
        with torch.no_grad():
            for batch in encoded:
                captured.clear()
                ids = batch["input_ids"].to(device)
                mask = batch["attention_mask"].to(device)
                model(input_ids=ids, attention_mask=mask, use_cache=False)
                if len(captured) != 1:
                    raise RuntimeError(f"Expected one forward through {layer_path!r}; saw {len(captured)}.")
                results.append(reduce(captured[0], mask))
    finally:
        handle.remove()
    return results
