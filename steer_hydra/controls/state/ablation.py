"""DirectionalAblation: projecting one unit direction out of the residual stream at chosen decoder layers."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.state.caa import (
    DEFAULT_DEPTH,
    fitted_mean_difference,
    validate_token_scope,
    validate_vector_source,
)
from steer_hydra.controls.state.layer_vector import FitsVector, apply_direction
from steer_hydra.controls.state.residual import (
    check_hidden_size,
    check_layer,
    input_hidden,
    output_hidden,
    past_length,
    with_input_hidden,
    with_output_hidden,
)
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import BaseArgs, HookSet, ResidualAddition, StateControl
from steer_hydra.core.layout import ModelLayout, resolve_layout

logger = logging.getLogger(__name__)


class DirectionalAblation(FitsVector, StateControl):
    """Directional ablation (Arditi et al. 2024, "Refusal in Language Models Is Mediated by a Single Direction",
    arXiv 2406.11717): `h <- h - (h.r) r` for a unit direction r, at every layer and position by default.

    How it runs: r is given, or fitted at `steer()` from contrastive pairs exactly as CAA fits (the same helpers and
    in-process memo: the mean difference of layer `layer_id`'s output), then taken to unit length (`direction:
    random` first swaps it for CAA's seeded random direction). At each ablated layer, hooks remove the component
    along r from every stream the paper ablates: the layer's input (a pre-hook; a no-op when the layer before is
    ablated too, its output being this input), the attention output (a forward hook on the attention module) and
    the layer's output (a forward hook: what the MLP wrote). `token_scope` picks positions by CAA's rule from the
    padded prompt length and the KV cache's past length, one column for every row of a left-packed batch.

    A position's projection reads only that position, so rows are independent (`supports_batching`), and decode
    positions lie past a refill layout prompt as past a static one (`supports_refill`). On the vLLM backends the
    same projections run inside the engine (`adds_residual`: `residual_edits()` lists one `project` edit per hooked
    stream, applied per request by the worker plugin beside CAA's additions); a direction to fit is fitted on the
    Hugging Face model of the engine's checkpoint first (backend=vllm; a server cannot, so vllm_serve needs a given
    `direction_vector`).

    Args:
        direction_vector: a `SteeringVector`, a `[hidden]` tensor, or the path of a vector saved with
            `SteeringVector.save` (exactly one of this and `data`); only its direction is used.
        data: contrastive pairs `{"prompt": ..., "positive": ..., "negative": ...}`, fitted as CAA's `data`
            (with `prompt_format`, `accumulate` and `batch_size` as CAA's).
        layer_id: the layer the direction is fitted at (default: CAA's, 40% of the depth); with `data` only.
        layers: the decoder layers ablated (default: every layer, as the paper).
        token_scope: `all` (the paper's), `after_prompt`, or `last_k` (with `last_k`), as CAA's.
        direction: `vector` (the given or fitted direction) or `random` (the sanity arm: CAA's random direction,
            drawn from `direction_seed`).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        direction_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        data: Sequence[Mapping[str, Any]] | None = None
        layer_id: int | None = None
        layers: Sequence[int] | None = None
        token_scope: Literal["all", "after_prompt", "last_k"] = "all"
        last_k: int | None = None
        direction: Literal["vector", "random"] = "vector"
        direction_seed: int = 0
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        batch_size: int = 8

        def validate(self) -> None:
            name = "DirectionalAblation"
            validate_vector_source(
                name, "direction_vector", self.direction_vector, self.data, what="a vector",
                layer_id=self.layer_id, acted="ablated",
            )  # fmt: skip
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"{name}.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            if self.layers is not None:
                if not self.layers or any(layer < 0 for layer in self.layers):
                    raise ValueError(
                        f"{name}.layers must list decoder layer indices >= 0, or be null for every layer; "
                        f"got {list(self.layers)}."
                    )
                if len(set(self.layers)) != len(self.layers):
                    raise ValueError(f"{name}.layers lists a layer twice: {list(self.layers)}. Fix: list each once.")
            validate_token_scope(name, self.token_scope, self.last_k)
            if self.direction_seed < 0:
                raise ValueError(f"{name}.direction_seed must be >= 0; got {self.direction_seed}.")
            if self.batch_size < 1:
                raise ValueError(f"{name}.batch_size must be >= 1; got {self.batch_size}.")

    supports_batching = True
    supports_refill = True  # see the class docstring
    adds_residual = True  # fixed projections: see `residual_edits`
    FIT_FIELDS = ("data", "layer_id", "prompt_format", "accumulate")  # what a fitted direction depends on

    def _configure(self) -> None:
        self._layout: ModelLayout | None = None
        self._layers: tuple[int, ...] = ()
        self._vector: SteeringVector | None = None  # the unit direction projected out
        self._units: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._fitted: SteeringVector | None = None  # the mean difference fitted at steer(), before `direction`

    @property
    def vector(self) -> SteeringVector | None:
        """The unit direction projected out (after `direction`); None before `steer()`."""
        return self._vector

    @property
    def vector_hash(self) -> str | None:
        return self._vector.content_hash if self._vector is not None else None

    @property
    def ablated_layers(self) -> tuple[int, ...]:
        """The decoder layers ablated (resolved at `steer()`)."""
        return self._layers

    def cleanup(self) -> None:
        self._units.clear()

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        name = type(self).__name__
        if model is None:
            raise RuntimeError(f"{name} needs the live model in this process. Fix: use backend=huggingface.")
        layout = resolve_layout(model)
        layers = tuple(self.layers) if self.layers is not None else tuple(range(layout.num_layers))
        fit_layer = self.layer_id if self.layer_id is not None else layout.default_layer(DEFAULT_DEPTH)
        for layer in (*layers, fit_layer):
            check_layer(name, layer, layout, "layers/layer_id")
        fitted = kwargs.get("fitted_vector")  # fitted elsewhere on the same checkpoint (an engine backend)
        if self.direction_vector is not None:
            given = SteeringVector.coerce(self.direction_vector, field_name=f"{name}.direction_vector")
        elif fitted is not None:
            given = self._fitted = fitted
        else:
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            if tokenizer is None:
                raise ValueError(f"{name} needs a tokenizer to fit its direction; pass one to steer().")
            given = self._fitted = fitted_mean_difference(
                model, tokenizer, layout, fit_layer, self.data, self.prompt_format, self.batch_size, self.accumulate
            )
        tensor = given.tensor[0] if given.tensor.dim() == 2 and given.tensor.shape[0] == 1 else given.tensor
        if tensor.dim() != 1:
            raise ValueError(f"{name}.direction_vector must be one direction [hidden]; got shape {given.shape}.")
        check_hidden_size(tensor, layout.hidden_size, f"{name}.direction_vector")
        used = apply_direction(SteeringVector(tensor, given.layer, given.metadata), self.direction, self.direction_seed)
        norm = float(used.tensor.float().norm())
        if norm == 0:
            raise ValueError(
                f"{name}: the direction has zero norm, so there is nothing to project out (pairs whose sides are "
                "identical at the layer?). Fix: give distinct contrastive pairs or a non-zero direction_vector."
            )
        self._vector = SteeringVector(used.tensor.float() / norm, used.layer, {**used.metadata, "unit": True})
        self._layout, self._layers = layout, layers
        self._units.clear()
        logger.info("%s at %d layer(s), %s direction %s", name, len(layers), self.direction, self.vector_hash[:12])
        return None

    def residual_edits(self) -> tuple[ResidualAddition, ...]:
        """The projections the hooks make, as engine edits: per ablated layer its input (unless the layer before is
        ablated), its attention output and its output, from `token_scope`'s start."""
        if self._vector is None:
            raise RuntimeError(f"{type(self).__name__}.residual_edits called before steer(); steer the pipeline first.")
        rows = self._vector.tensor.float().cpu().reshape(1, -1)
        ablated = set(self._layers)

        def edit(layer: int, site: str) -> ResidualAddition:
            return ResidualAddition(layer, site, "project", rows, self.token_scope, last_k=self.last_k or 0)

        edits: list[ResidualAddition] = []
        for layer in self._layers:
            if layer - 1 not in ablated:
                edits.append(edit(layer, "input"))
            edits += [edit(layer, "attention"), edit(layer, "output")]
        return tuple(edits)

    # ------------------------------------------------------------------ per call
    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        if self._layout is None or self._vector is None:
            raise RuntimeError(f"{type(self).__name__}.get_hooks called before steer(); steer the pipeline first.")
        prompt_len = input_ids.shape[1]
        threshold = {"after_prompt": prompt_len, "all": 0, "last_k": max(prompt_len - (self.last_k or 0), 0)}[
            self.token_scope
        ]
        starts: dict[int, int] = {}  # layer -> absolute column of this forward's first position
        ablated = set(self._layers)

        def project(hidden: torch.Tensor, layer: int) -> torch.Tensor | None:
            first = max(threshold - starts.get(layer, 0), 0)
            if first >= hidden.shape[1]:
                return None
            unit = self._unit(hidden)
            tail = hidden[:, first:]
            projected = tail - (tail @ unit)[..., None] * unit
            return torch.cat([hidden[:, :first], projected], dim=1) if first else projected

        def on_input(layer: int, clean: bool):
            def hook(module: torch.nn.Module, args: tuple, hook_kwargs: dict) -> tuple | None:
                starts[layer] = past_length(hook_kwargs, layer)
                if clean:  # the previous layer's output, already projected
                    return None
                projected = project(input_hidden(args, hook_kwargs), layer)
                return None if projected is None else with_input_hidden(args, hook_kwargs, projected)

            return hook

        def on_output(layer: int):
            def hook(module: torch.nn.Module, args: tuple, hook_kwargs: dict, output: Any) -> Any:
                projected = project(output_hidden(output), layer)
                return None if projected is None else with_output_hidden(output, projected)

            return hook

        hooks: HookSet = {"pre": [], "forward": []}
        for layer in self._layers:
            path = self._layout.layer_path(layer)
            hooks["pre"].append({"module": path, "hook_func": on_input(layer, layer - 1 in ablated)})
            hooks["forward"].append({"module": self._layout.attention_path(layer), "hook_func": on_output(layer)})
            hooks["forward"].append({"module": path, "hook_func": on_output(layer)})
        return hooks

    def _unit(self, hidden: torch.Tensor) -> torch.Tensor:
        """The unit direction on the hidden states' device and dtype (cached per device and dtype)."""
        key = (hidden.device, hidden.dtype)
        unit = self._units.get(key)
        if unit is None:
            unit = self._units[key] = self._vector.tensor.to(device=hidden.device, dtype=hidden.dtype)
        return unit
