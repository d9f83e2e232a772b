"""ActAdd (Turner et al. 2023): add a positional steering block at one decoder layer's input during the prefill.

The block is the per-position difference of the layer's input (the residual stream) between a positive and a
negative prompt (`[T, hidden]`; the shorter prompt is right-padded with a space token so both have T tokens),
or given as a vector. During a call, row `t` times `multiplier` is added at position `alignment + t` of each
prompt row, counted from the row's first real token (so a left-padded row is aligned like the same prompt
alone). Positions come from the layer's KV cache length read in the forward pre-hook, so the block lands on the
prefill and acts on decoded tokens only when `alignment + T` reaches past the prompt.

`supports_batching` is False, as the issue and the spec specify: the provider serializes ActAdd requests.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.state.layer_vector import LayerVectorArgs, LayerVectorControl
from steer_hydra.controls.state.residual import (
    capture_layer,
    input_hidden,
    past_length,
    preserve_norm,
    with_input_hidden,
)
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import HookSet, ResidualAddition
from steer_hydra.core.layout import ModelLayout

logger = logging.getLogger(__name__)

DEFAULT_DEPTH = 0.2


class ActAdd(LayerVectorControl):
    """Activation addition (arXiv 2308.10248) of a positional block at one decoder layer's input.

    Args:
        steering_vector: a `SteeringVector` or tensor (`[T, hidden]`, or `[hidden]` for one position), or the
            path of a saved vector (exactly one of this and the prompt pair).
        positive_prompt, negative_prompt: the contrast pair (e.g. "Love" and "Hate"), run at `steer()`.
        layer_id: decoder layer (default: the vector's own layer, else 20% of the depth, at least 1).
        multiplier: the injection coefficient (the paper's c).
        alignment: position of the block's first row in each prompt (0 aligns a BOS with a BOS).
        normalize_vector: unit norm per position. use_norm_preservation: keep each steered state's norm.
        direction, direction_seed, strength_unit: sanity arms and strength units (see `layer_vector`); the
            median norm is that of the layer's input over both prompts' tokens after the first.
    """

    @dataclass(frozen=True)
    class Args(LayerVectorArgs):
        steering_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        positive_prompt: str | None = None
        negative_prompt: str | None = None
        layer_id: int | None = None
        multiplier: float = 1.0
        alignment: int = 0
        normalize_vector: bool = False
        use_norm_preservation: bool = False

        def validate(self) -> None:
            super().validate()
            prompts = (self.positive_prompt, self.negative_prompt)
            if self.steering_vector is not None and any(p is not None for p in prompts):
                raise ValueError("ActAdd takes either steering_vector= or positive_prompt=/negative_prompt=, not both.")
            if self.steering_vector is None and not all(isinstance(p, str) and p for p in prompts):
                raise ValueError(
                    "ActAdd needs steering_vector= or both positive_prompt= and negative_prompt= (non-empty); "
                    f"got positive_prompt={self.positive_prompt!r}, negative_prompt={self.negative_prompt!r}."
                )
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"ActAdd.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            if self.alignment < 0:
                raise ValueError(f"ActAdd.alignment must be >= 0 (a prompt position); got {self.alignment}.")
            if not math.isfinite(self.multiplier):
                raise ValueError(f"ActAdd.multiplier must be finite; got {self.multiplier!r}.")

    supports_batching = False

    DEFAULT_DEPTH = DEFAULT_DEPTH
    MIN_DEFAULT_LAYER = 1
    FIT_FIELDS = ("positive_prompt", "negative_prompt", "layer_id")

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        self._bind(model, tokenizer, self._fit, _as_block, fitted=kwargs.get("fitted_vector"))
        return None

    def _fit(self, model: torch.nn.Module, tokenizer: Any, layout: ModelLayout, layer: int) -> SteeringVector:
        return fit_positional_difference(model, tokenizer, layout, layer, self.positive_prompt, self.negative_prompt)

    # ------------------------------------------------------------------ per call
    def residual_addition(self) -> ResidualAddition | None:
        """The block before the layer, row t at `alignment + t` from the first prompt token (None at multiplier 0)."""
        self._require_bound("residual_addition")
        if self.multiplier == 0:
            return None
        return ResidualAddition(
            self._layer,
            "input",
            "block",
            self.added_rows(),
            "position",
            offset=self.alignment,
            preserve_norm=self.use_norm_preservation,
        )

    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        self._require_bound()
        if self.multiplier == 0:
            return {}
        mask = kwargs.get("attention_mask")
        width = input_ids.shape[1]
        lengths = mask.sum(dim=1) if mask is not None else torch.full((input_ids.shape[0],), width)
        starts = (width - lengths).to(torch.long) + self.alignment  # first steered column per row
        length = self._steering.shape[0]
        last_column = int(starts.max()) + length  # no row is steered at or after this column
        layer_index, preserve = self._layer, self.use_norm_preservation

        def add_block(module: torch.nn.Module, args: tuple, hook_kwargs: dict) -> tuple | None:
            start = past_length(hook_kwargs, layer_index)
            if start >= last_column:
                return None
            hidden = input_hidden(args, hook_kwargs)
            batch, window = hidden.shape[0], hidden.shape[1]
            row_starts = starts.to(hidden.device)
            if batch != row_starts.shape[0]:
                row_starts = row_starts.repeat_interleave(batch // row_starts.shape[0])
            offset = start + torch.arange(window, device=hidden.device)[None, :] - row_starts[:, None]
            inside = (offset >= 0) & (offset < length)
            if not bool(inside.any()):
                return None
            block = self._delta(hidden)
            added = block[offset.clamp(0, length - 1)] * inside[..., None].to(hidden.dtype)
            steered = hidden + added
            if preserve:
                steered = torch.where(inside[..., None], preserve_norm(hidden, steered), hidden)
            return with_input_hidden(args, hook_kwargs, steered)

        return {"pre": [{"module": self._layout.layer_path(self._layer), "hook_func": add_block}]}


def _as_block(tensor: torch.Tensor) -> torch.Tensor:
    """A `[positions, hidden]` block (one position for a `[hidden]` vector)."""
    return tensor[None] if tensor.dim() == 1 else tensor


def fit_positional_difference(
    model: torch.nn.Module, tokenizer: Any, layout: ModelLayout, layer: int, positive: str, negative: str
) -> SteeringVector:
    """`[T, hidden]` difference of layer `layer`'s input between the two prompts (padded to one length)."""
    rows = [list(tokenizer(text)["input_ids"]) for text in (positive, negative)]
    length = max(len(r) for r in rows)
    space = tokenizer(" ", add_special_tokens=False)["input_ids"]
    filler = space[0] if len(space) == 1 else tokenizer.pad_token_id
    rows = [r + [filler] * (length - len(r)) for r in rows]
    ids = torch.tensor(rows, dtype=torch.long)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    (hidden,) = capture_layer(model, layout.layer_path(layer), [batch], boundary="input", reduce=lambda h, m: h)
    tail = hidden[:, 1:] if hidden.shape[1] > 1 else hidden  # position 0 is an attention sink, far larger
    metadata = {
        "median_norm": float(tail.norm(dim=-1).median()),
        "method": "actadd",
        "location": "layer_input",
        "positive_prompt": positive,
        "negative_prompt": negative,
        "model": str(getattr(getattr(model, "config", None), "_name_or_path", "") or ""),
    }
    return SteeringVector((hidden[0] - hidden[1]).cpu(), layer, metadata)
