"""`LayerVectorControl`: the part CAA and ActAdd share (a vector given or fitted at `steer()` for one layer)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from steer_hydra.controls.state.residual import check_hidden_size, normalized
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import StateControl
from steer_hydra.core.layout import ModelLayout, resolve_layout

logger = logging.getLogger(__name__)

Fit = Callable[[torch.nn.Module, Any, ModelLayout, int], SteeringVector]


class LayerVectorControl(StateControl):
    """A state control that adds `multiplier *` a steering tensor at one decoder layer.

    Subclasses have Args fields `steering_vector`, `layer_id`, `multiplier` and `normalize_vector`, set
    `DEFAULT_DEPTH` (and `MIN_DEFAULT_LAYER`), and call `_bind(...)` in `steer()`; the hooks read `_delta(hidden)`.
    """

    DEFAULT_DEPTH: ClassVar[float]
    MIN_DEFAULT_LAYER: ClassVar[int] = 0

    def _configure(self) -> None:
        self._layout: ModelLayout | None = None
        self._layer: int | None = None
        self._vector: SteeringVector | None = None
        self._steering: torch.Tensor | None = None  # the tensor added (normalized if asked), before multiplier
        self._deltas: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def requirements(self) -> frozenset[Capability]:
        needs = {Capability.IN_PROCESS_TORCH}
        if self.steering_vector is None:  # fitted at steer() from hidden states
            needs.add(Capability.HIDDEN_CAPTURE)
        return frozenset(needs)

    @property
    def vector(self) -> SteeringVector | None:
        """The steering vector in use (given or fitted), before normalisation and multiplier; None before steer."""
        return self._vector

    @property
    def vector_hash(self) -> str | None:
        """`content_hash` of the steering vector in use (None before `steer()` has one)."""
        return self._vector.content_hash if self._vector is not None else None

    @property
    def layer(self) -> int | None:
        """The decoder layer steered (resolved at `steer()`)."""
        return self._layer

    def cleanup(self) -> None:
        self._deltas.clear()

    def _bind(
        self, model: torch.nn.Module | None, tokenizer: Any, fit: Fit, prepare: Callable[[torch.Tensor], torch.Tensor]
    ) -> SteeringVector:
        """Resolve the layout and layer, load or `fit` the vector, and keep `prepare(tensor)` as the steering."""
        name = type(self).__name__
        if model is None:
            raise RuntimeError(f"{name} needs the live model in this process; use backend=huggingface.")
        layout = resolve_layout(model)
        given = None
        if self.steering_vector is not None:
            given = SteeringVector.coerce(self.steering_vector, field_name=f"{name}.steering_vector")
        layer = self.layer_id
        if layer is None:
            fitted_at = given.layer if given is not None else None
            default = layout.default_layer(self.DEFAULT_DEPTH, minimum=self.MIN_DEFAULT_LAYER)
            layer = fitted_at if fitted_at is not None else default
        if not 0 <= layer < layout.num_layers:
            raise ValueError(
                f"{name}.layer_id={layer} is out of range; the model has {layout.num_layers} layers "
                f"(0..{layout.num_layers - 1})."
            )
        if given is None:
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            if tokenizer is None:
                raise ValueError(f"{name} needs a tokenizer to fit its vector; pass one to steer().")
            given = fit(model, tokenizer, layout, layer)
        steering = prepare(given.tensor).float()
        check_hidden_size(steering, layout.hidden_size, f"{name}.steering_vector")
        self._steering = normalized(steering) if self.normalize_vector else steering
        self._vector, self._layout, self._layer = given, layout, layer
        self._deltas.clear()
        logger.info("%s at layer %d, vector %s", name, layer, given.content_hash[:12])
        return given

    def _require_bound(self) -> None:
        if self._layout is None or self._steering is None or self._layer is None:
            raise RuntimeError(f"{type(self).__name__}.get_hooks called before steer(); steer the pipeline first.")

    def _delta(self, hidden: torch.Tensor) -> torch.Tensor:
        """`multiplier * steering` on the hidden states' device and dtype (cached per device and dtype)."""
        key = (hidden.device, hidden.dtype)
        delta = self._deltas.get(key)
        if delta is None:
            delta = (self.multiplier * self._steering).to(device=hidden.device, dtype=hidden.dtype)
            self._deltas[key] = delta
        return delta
