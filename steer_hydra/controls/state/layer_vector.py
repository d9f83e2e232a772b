"""`LayerVectorControl`: the part CAA and ActAdd share (a vector given or fitted at `steer()` for one layer).

Shared arguments (`LayerVectorArgs`), applied in this order at `steer()`:
- `direction`: `vector` (as given or fitted), `negated` (minus the vector), or `random` (a Gaussian direction
  drawn from `direction_seed`, each row rescaled to the norm of the vector's row): the sanity arms of every
  vector method (`caa_negated`, `caa_random`) are these arguments, not other controls;
- `strength_unit`: `absolute` adds `multiplier * v` (`v` unit-normalised when `normalize_vector`);
  `median_norm` adds `multiplier * m * v / |v|`, where `m` is the median L2 norm of the residual stream at the
  layer measured while fitting (`metadata["median_norm"]`), so a multiplier means the same on any model
  (text degrades from about 0.5 on SmolLM2-135M).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from steer_hydra.controls.state.residual import check_hidden_size, normalized
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, StateControl
from steer_hydra.core.layout import ModelLayout, resolve_layout

logger = logging.getLogger(__name__)

Fit = Callable[[torch.nn.Module, Any, ModelLayout, int], SteeringVector]

Direction = Literal["vector", "random", "negated"]
StrengthUnit = Literal["absolute", "median_norm"]


@dataclass(frozen=True)
class LayerVectorArgs(BaseArgs):
    """Arguments every layer-vector control takes (see the module docstring); subclasses add their own."""

    direction: Direction = "vector"
    direction_seed: int = 0
    strength_unit: StrengthUnit = "absolute"

    def validate(self) -> None:
        if self.direction_seed < 0:
            raise ValueError(f"direction_seed must be >= 0; got {self.direction_seed}.")


def apply_direction(vector: SteeringVector, direction: str, seed: int) -> SteeringVector:
    """The vector a sanity arm uses: itself, its negation, or a seeded random direction with the same row norms."""
    if direction == "vector":
        return vector
    tensor = vector.tensor.float()
    if direction == "negated":
        used = -tensor
    elif direction == "random":
        generator = torch.Generator().manual_seed(seed)
        draw = torch.randn(tensor.shape, generator=generator)
        used = draw / draw.norm(dim=-1, keepdim=True) * tensor.norm(dim=-1, keepdim=True)
    else:
        raise ValueError(f"direction must be one of 'vector', 'random', 'negated'; got {direction!r}.")
    metadata = {**vector.metadata, "direction": direction, "source_vector": vector.content_hash}
    if direction == "random":
        metadata["direction_seed"] = seed
    return SteeringVector(used.to(vector.tensor.dtype), vector.layer, metadata)


def median_norm_of(vector: SteeringVector, owner: str) -> float:
    """The residual-stream scale recorded when the vector was fitted; error naming the fix when absent."""
    value = vector.metadata.get("median_norm")
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"{owner}.strength_unit='median_norm' needs the residual-stream median norm at the layer, recorded when "
            f"the vector is fitted at steer() (metadata['median_norm']); this vector has {value!r}. Fix: fit it "
            "from data (data=/positive_prompt=), or use strength_unit='absolute'."
        )
    return float(value)


class FitsVector:
    """What an engine backend's fit (`steer_hydra.backends.vllm.fit`) reads of a state control that fits a vector
    from hidden states: `fit_identity()` (what the fit depends on besides the model: the control and its
    `FIT_FIELDS` arguments), `fitted_vector` (set at `steer()` in `_fitted`) and `load_vector` (a cached fit); and
    what the control needs of a backend (`requirements`: hidden-state capture when a `FIT_FROM` argument is set)."""

    FIT_FIELDS: ClassVar[tuple[str, ...]] = ()  # the arguments a fitted vector depends on (`fit_identity`)
    FIT_FROM: ClassVar[tuple[str, ...]] = ("data",)  # the arguments holding data fitted from at `steer()`
    _fitted: SteeringVector | None

    def requirements(self) -> frozenset[Capability]:
        if any(getattr(self, name) is not None for name in self.FIT_FROM):  # fitted at steer() from hidden states
            return frozenset({Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE})
        return frozenset({Capability.IN_PROCESS_TORCH})

    @property
    def fitted_vector(self) -> SteeringVector | None:
        """The vector fitted at `steer()` from hidden states, before direction and scaling (None when given)."""
        return self._fitted

    def load_vector(self, path: Any) -> SteeringVector:
        """A vector saved with `SteeringVector.save` (what an engine backend's cache of fitted vectors holds)."""
        return SteeringVector.load(path)

    def fit_identity(self) -> dict[str, Any]:
        """What the fitted vector depends on besides the model: the control and its `FIT_FIELDS` arguments."""
        return {"control": type(self).__name__, **{name: getattr(self, name) for name in self.FIT_FIELDS}}


class LayerVectorControl(FitsVector, StateControl):
    """A state control that adds `multiplier *` a steering tensor at one decoder layer.

    Subclasses' Args extend `LayerVectorArgs` with fields `steering_vector`, `layer_id`, `multiplier` and
    `normalize_vector`, set `DEFAULT_DEPTH` (and `MIN_DEFAULT_LAYER`, and `FIT_FIELDS` when they fit a vector), and
    call `_bind(...)` in `steer()` (passing `fitted_vector=` from the steer kwargs on); the
    hooks read `_delta(hidden)`. Each subclass implements `residual_addition()` (its effect is one fixed addition,
    `adds_residual`) from `added_rows()`, the very tensor its hooks add, so an engine that lowers it steers alike.
    """

    DEFAULT_DEPTH: ClassVar[float]
    MIN_DEFAULT_LAYER: ClassVar[int] = 0
    adds_residual = True

    def _configure(self) -> None:
        self._layout: ModelLayout | None = None
        self._layer: int | None = None
        self._vector: SteeringVector | None = None
        self._steering: torch.Tensor | None = None  # the tensor added (normalized/scaled if asked), before multiplier
        self._unit_scale: float | None = None  # the residual median norm with strength_unit='median_norm'
        self._deltas: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}
        self._fitted: SteeringVector | None = None  # the vector fitted at steer(), before its direction

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
    def unit_scale(self) -> float | None:
        """The residual-stream median norm one unit of `multiplier` stands for (`strength_unit='median_norm'`)."""
        return self._unit_scale

    @property
    def layer(self) -> int | None:
        """The decoder layer steered (resolved at `steer()`)."""
        return self._layer

    def cleanup(self) -> None:
        self._deltas.clear()

    def _bind(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any,
        fit: Fit,
        prepare: Callable[[torch.Tensor], torch.Tensor],
        fitted: SteeringVector | None = None,
    ) -> SteeringVector:
        """Resolve the layout and layer, load or `fit` the vector (or take `fitted`, the vector this control's fit
        gave on the same checkpoint elsewhere: an engine backend fits on the Hugging Face model), and keep
        `prepare(tensor)` as the steering."""
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
        if given is None and fitted is not None:
            if fitted.layer is not None and fitted.layer != layer:
                raise ValueError(f"{name}: the vector fitted elsewhere is for layer {fitted.layer}, not {layer}.")
            given = self._fitted = fitted
        elif given is None:
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            if tokenizer is None:
                raise ValueError(f"{name} needs a tokenizer to fit its vector; pass one to steer().")
            given = self._fitted = fit(model, tokenizer, layout, layer)
        used = apply_direction(given, self.direction, self.direction_seed)
        steering = prepare(used.tensor).float()
        check_hidden_size(steering, layout.hidden_size, f"{name}.steering_vector")
        self._unit_scale = None
        if self.strength_unit == "median_norm":
            self._unit_scale = median_norm_of(given, name)
            norms = steering.norm(dim=-1, keepdim=True)  # a block's zero rows (a shared BOS) stay zero
            steering = steering / norms.clamp_min(1e-12) * self._unit_scale
        elif self.normalize_vector:
            steering = normalized(steering)
        self._steering = steering
        self._vector, self._layout, self._layer = used, layout, layer
        self._deltas.clear()
        kind = "the vector" if self.direction == "vector" else f"the {self.direction} direction of the vector"
        logger.info("%s at layer %d, multiplier %g: %s %s", name, layer, self.multiplier, kind, used.content_hash[:12])
        return used

    def _require_bound(self, method: str = "get_hooks") -> None:
        if self._layout is None or self._steering is None or self._layer is None:
            raise RuntimeError(f"{type(self).__name__}.{method} called before steer(); steer the pipeline first.")

    def added_rows(self) -> torch.Tensor:
        """What the hooks add, `multiplier * steering` (direction, normalisation and strength unit applied), as
        `[rows, hidden]` float32 on the CPU: one row for a direction, one per position for a block."""
        self._require_bound("added_rows")
        rows = (self.multiplier * self._steering).detach().float().cpu()
        return rows.reshape(-1, rows.shape[-1])

    def _delta(self, hidden: torch.Tensor) -> torch.Tensor:
        """`multiplier * steering` on the hidden states' device and dtype (cached per device and dtype)."""
        key = (hidden.device, hidden.dtype)
        delta = self._deltas.get(key)
        if delta is None:
            delta = (self.multiplier * self._steering).to(device=hidden.device, dtype=hidden.dtype)
            self._deltas[key] = delta
        return delta
