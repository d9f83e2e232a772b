"""ActivationAdapter: the general form of the residual-stream state controls: a transform, a token selector, a gate and
a scope. CAA, directional ablation and CAST are instances of it (and a head-slice addition like ITI's, a rotation like
angular steering's); a new method that fits the form is a configuration, not a new control.

The form (each part an argument):
- transform: `add` (`x + multiplier * v`, optionally unit `v`, the residual's median norm as unit, or norm kept),
  `project` (`x - (x.r) r`, r the unit direction), or `rotate` (in the plane of the unit direction and a reference
  vector made orthogonal to it, by `angle` degrees or to it);
- token selector: `token_scope` (`after_prompt`, `all`, `last_k` with `last_k`), CAA's columns;
- gate: none, or a condition read from the prompt (CAST's: `condition_vector`/`condition_data`, `condition_layer`,
  `threshold`, `comparison`, `condition_open_for`): the transform then applies only to the rows whose prompt
  meets it, after the prompt;
- scope: `layers` x `sites`, sites among `input` (before the layer), `attention` (the attention block's output),
  `heads` (the attention output projection's input, `heads * head_dim` wide: the vector must be that wide) and
  `output` (after the layer). Default layers: the direction's layer (its fit layer) for `add` and `rotate`, every
  layer for `project`. A projection is idempotent, so a layer's `input` is not projected again when the layer before
  projects its `output` (directional ablation's streams).

The direction is `vector=` or fitted from `data=` exactly as CAA fits (`fitted_mean_difference`, its memo, at
`layer_id`), with CAA's sanity arms (`direction: random | negated`). Instances:
- CAA(v, L, m) = `transform=add, vector=v, layers=[L], multiplier=m, token_scope=after_prompt`;
- DirectionalAblation(r) = `transform=project, vector=r, sites=[input, attention, output], token_scope=all`;
- CAST = CAA's instance plus `condition_vector=c, condition_layer=Lc, threshold=t`.

How it runs: `steer()` resolves the direction, the plane or the condition and compiles the form into
`ResidualAddition` edits (`residual_edits()`), which Hugging Face runs as hooks (`steer_hydra.controls.state.edits`,
the same arithmetic as the dedicated controls' hooks, so an instance decodes exactly as its control) and the vLLM
backends run inside the engine per request (`adds_residual`; a fit to do is made on the Hugging Face model first).
Rows are independent (`supports_batching`); an ungated adapter may refill (decode positions lie past the layout
prompt), a gated one may not (`refill_blockers()` names it: see CAST).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch

from steer_hydra.controls.state.angular import one_direction, plane_basis
from steer_hydra.controls.state.caa import (
    CAA,
    DEFAULT_DEPTH,
    fitted_mean_difference,
    validate_layers,
    validate_token_scope,
    validate_vector_source,
)
from steer_hydra.controls.state.cast import (
    CONDITION_FIT_FIELDS,
    Condition,
    fitted_condition,
    pack_gated_fit,
    unpack_gated_fit,
    validate_condition_args,
)
from steer_hydra.controls.state.edits import SITES, CompiledEdits
from steer_hydra.controls.state.layer_vector import FitsVector, apply_direction, median_norm_of
from steer_hydra.controls.state.residual import check_layer, normalized
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import BaseArgs, ResidualAddition, StateControl
from steer_hydra.core.layout import ModelLayout

logger = logging.getLogger(__name__)

Site = Literal["input", "attention", "heads", "output"]
_FORMAT = "steer_hydra.adapter_fit/1"
_NOT_AN_ADAPTERS = "ActivationAdapter: this fitted vector is not an adapter's"
_LAYER_FIELDS = "layer_id/layers/condition_layer"  # what an out-of-range layer is fixed with


class ActivationAdapter(CompiledEdits, FitsVector, StateControl):
    """A transform at a scope of layers and sites, on selected tokens, optionally gated by a prompt condition.

    Args:
        transform: `add`, `project` or `rotate`.
        vector: the direction (a `SteeringVector`, a tensor, or a saved vector's path; exactly one of this and
            `data`); `[heads * head_dim]` wide for the `heads` site.
        data: contrastive pairs to fit the direction from, as CAA's (`prompt_format`, `accumulate`, `batch_size`).
        layer_id: the layer the direction is fitted at (default: CAA's, 40% of the depth; with `data` only).
        direction, direction_seed: `vector` (as given or fitted), `negated` or `random` (CAA's sanity arms).
        multiplier, normalize_vector, strength_unit, preserve_norm: the `add` transform's strength (as CAA's).
        angle, angle_mode, reference_vector, reference_seed: the `rotate` transform (degrees; `by` or `to`; the
            plane's second vector, else a seeded random one).
        layers, sites: the scope (see the module docstring for the defaults).
        token_scope, last_k: the token selector.
        condition_vector, condition_data, condition_layer, threshold, comparison, condition_open_for: the gate
            (CAST's arguments; none: ungated).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        transform: Literal["add", "project", "rotate"] = "add"
        vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        data: Sequence[Mapping[str, Any]] | None = None
        layer_id: int | None = None
        direction: Literal["vector", "random", "negated"] = "vector"
        direction_seed: int = 0
        multiplier: float = 1.0
        normalize_vector: bool = False
        strength_unit: Literal["absolute", "median_norm"] = "absolute"
        preserve_norm: bool = False
        angle: float = 0.0
        angle_mode: Literal["by", "to"] = "by"
        reference_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        reference_seed: int = 0
        layers: Sequence[int] | None = None
        sites: Sequence[Site] = ("output",)
        token_scope: Literal["after_prompt", "all", "last_k"] = "after_prompt"
        last_k: int | None = None
        condition_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        condition_data: Sequence[Mapping[str, Any]] | None = None
        condition_layer: int | None = None
        threshold: float | None = None
        comparison: Literal[">", "<"] | None = None
        condition_open_for: Literal["positive", "negative"] = "positive"
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        batch_size: int = 8

        def validate(self) -> None:
            name = "ActivationAdapter"
            validate_vector_source(
                name, "vector", self.vector, self.data, what="a direction", layer_id=self.layer_id, acted="edited"
            )
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"{name}.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            for field_name, value in (("multiplier", self.multiplier), ("angle", self.angle)):
                if not math.isfinite(value):
                    raise ValueError(f"{name}.{field_name} must be finite; got {value!r}.")
            if self.transform != "add" and (
                self.multiplier != 1.0
                or self.normalize_vector
                or self.preserve_norm
                or self.strength_unit != "absolute"
            ):
                raise ValueError(
                    f"{name}: multiplier, normalize_vector, preserve_norm and strength_unit set the 'add' transform's "
                    f"strength; transform={self.transform!r} does not read them. Fix: drop them."
                )
            if self.transform != "rotate" and (self.angle != 0.0 or self.reference_vector is not None):
                raise ValueError(
                    f"{name}: angle and reference_vector belong to transform='rotate'; got transform="
                    f"{self.transform!r}. Fix: drop them or set transform='rotate'."
                )
            validate_layers(name, self.layers, "the default")
            if not self.sites or len(set(self.sites)) != len(self.sites) or not set(self.sites) <= set(SITES):
                raise ValueError(f"{name}.sites must list distinct sites among {SITES}; got {list(self.sites)}.")
            validate_token_scope(name, self.token_scope, self.last_k)
            if self.condition_vector is not None or self.condition_data is not None:
                validate_condition_args(
                    name, self.condition_vector, self.condition_data, self.threshold, self.condition_layer
                )
                if self.token_scope != "after_prompt":
                    raise ValueError(
                        f"{name}: a gated transform acts after the prompt (the gate is decided from the whole "
                        f"prompt); got token_scope={self.token_scope!r}. Fix: token_scope='after_prompt'."
                    )
            elif self.condition_layer is not None or self.threshold is not None or self.comparison is not None:
                raise ValueError(
                    f"{name}: condition_layer, threshold and comparison describe a gate; no condition_vector= or "
                    "condition_data= is given. Fix: give one, or drop them."
                )
            if self.direction_seed < 0 or self.reference_seed < 0 or self.batch_size < 1:
                raise ValueError(f"{name}: seeds must be >= 0 and batch_size >= 1.")

    supports_batching = True
    adds_residual = True  # fixed edits: see `residual_edits`
    FIT_FROM = ("data", "condition_data")
    FIT_FIELDS: ClassVar[tuple[str, ...]] = (*CAA.FIT_FIELDS, *CONDITION_FIT_FIELDS)  # CAA's fit, CAST's gate

    def _configure(self) -> None:
        self._edits: tuple[ResidualAddition, ...] | None = None
        self._paths: dict[tuple, str] = {}
        self._vector: SteeringVector | None = None
        self._condition: Condition | None = None
        self._fitted: SteeringVector | None = None

    @property
    def gated(self) -> bool:
        return self.condition_vector is not None or self.condition_data is not None

    @property
    def supports_refill(self) -> bool:  # type: ignore[override]
        """An ungated adapter's decode positions lie past the layout prompt; a gated one's gates would be lost."""
        return not self.gated

    @property
    def vector(self) -> SteeringVector | None:
        """The direction in use (after `direction`, before strength); None before `steer()`."""
        return self._vector

    @property
    def condition(self) -> Condition | None:
        return self._condition

    @property
    def vector_hash(self) -> str | None:
        if self._vector is None:
            return None
        return (
            self._vector.content_hash
            if self._condition is None
            else f"{self._vector.content_hash}|{self._condition.gate}"
        )

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        name = type(self).__name__
        layout = self._steered_layout(model)
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        fitted = (
            unpack_gated_fit(kwargs["fitted_vector"], format_name=_FORMAT, role="direction", refusal=_NOT_AN_ADAPTERS)
            if kwargs.get("fitted_vector") is not None
            else {}
        )
        vector = self._direction(model, tokenizer, layout, fitted)
        used = apply_direction(vector, self.direction, self.direction_seed)
        layers = self._layers(layout, used)
        condition, condition_raw = self._gate(model, tokenizer, layout, layers, fitted)
        if self.data is not None or self.condition_data is not None:
            self._fitted = pack_gated_fit(
                vector if self.data is not None else None, condition_raw, condition, layout.hidden_size,
                format_name=_FORMAT, role="direction", layer=None,
            )  # fmt: skip
        self._vector, self._condition = used, condition
        self._bind_edits(model, layout, self._compile(layout, used, layers, condition))
        logger.info("%s: %s at layers %s, sites %s%s", name, self.transform, list(layers), list(self.sites),
                    f", gated by {condition.gate}" if condition else "")  # fmt: skip
        return None

    def _direction(self, model: torch.nn.Module, tokenizer: Any, layout: ModelLayout, fitted: dict) -> SteeringVector:
        name = type(self).__name__
        if self.args.vector is not None:
            return one_direction(self.args.vector, f"{name}.vector")
        layer = self.layer_id if self.layer_id is not None else layout.default_layer(DEFAULT_DEPTH)
        check_layer(name, layer, layout, _LAYER_FIELDS)
        if "direction" in fitted:
            return fitted["direction"]
        if tokenizer is None:
            raise ValueError(f"{name} needs a tokenizer to fit its direction; pass one to steer().")
        return fitted_mean_difference(
            model, tokenizer, layout, layer, self.data, self.prompt_format, self.batch_size, self.accumulate
        )

    def _layers(self, layout: ModelLayout, vector: SteeringVector) -> tuple[int, ...]:
        if self.layers is not None:
            layers = tuple(self.layers)
        elif self.transform == "project":
            layers = tuple(range(layout.num_layers))
        else:
            fit_layer = self.layer_id if self.data is not None else vector.layer
            layers = (fit_layer if fit_layer is not None else layout.default_layer(DEFAULT_DEPTH),)
        for layer in layers:
            check_layer(type(self).__name__, layer, layout, _LAYER_FIELDS)
        return layers

    def _gate(
        self, model: torch.nn.Module, tokenizer: Any, layout: ModelLayout, layers: tuple[int, ...], fitted: dict
    ) -> tuple[Condition | None, torch.Tensor | None]:
        if not self.gated:
            return None, None
        name = type(self).__name__
        layer = self.condition_layer if self.condition_layer is not None else layers[0]
        check_layer(name, layer, layout, _LAYER_FIELDS)
        if self.condition_vector is not None:
            vector = one_direction(self.condition_vector, f"{name}.condition_vector").tensor.float()
            threshold, comparison, accuracy = self.threshold, self.comparison or ">", None
        else:
            vector, threshold, comparison, accuracy = fitted_condition(
                name, self.args, model, tokenizer, layout, layer, fitted
            )
        if vector.shape[-1] != layout.hidden_size or float(vector.norm()) == 0:
            raise ValueError(
                f"{name}.condition_vector must be a non-zero [{layout.hidden_size}] direction; got shape "
                f"{tuple(vector.shape)}, norm {float(vector.norm()):g}."
            )
        unit = vector.float() / float(vector.norm())
        raw = vector if self.condition_data is not None else None
        return Condition(unit, layer, float(threshold), comparison, accuracy), raw

    def _compile(
        self, layout: ModelLayout, vector: SteeringVector, layers: tuple[int, ...], condition: Condition | None
    ) -> tuple[ResidualAddition, ...]:
        """The form compiled to edits: the gate's condition first, then per layer its sites in forward order."""
        name = type(self).__name__
        tensor = vector.tensor.float()
        widths = {site: layout.num_heads * layout.head_dim if site == "heads" else layout.hidden_size for site in SITES}
        for site in self.sites:
            if tensor.shape[-1] != widths[site]:
                raise ValueError(
                    f"{name}.vector has width {tensor.shape[-1]}, but site {site!r} is {widths[site]} wide on this "
                    "model. Fix: a vector of that width, or other sites."
                )
        if self.transform == "add":
            # CAA's arithmetic, operation for operation (`LayerVectorControl._bind`), so the instance adds CAA's rows
            if self.strength_unit == "median_norm":
                steering = tensor / tensor.norm(dim=-1, keepdim=True).clamp_min(1e-12) * median_norm_of(vector, name)
            elif self.normalize_vector:
                steering = normalized(tensor)
            else:
                steering = tensor
            if self.multiplier == 0:
                return ()
            rows, mode, angle = (self.multiplier * steering)[None], "from", 0.0
        elif self.transform == "project":
            norm = float(tensor.norm())
            if norm == 0:
                raise ValueError(f"{name}: the direction has zero norm, so there is nothing to project out.")
            rows, mode, angle = (tensor / norm)[None], "project", 0.0
        else:
            if self.reference_vector is not None:
                reference = one_direction(self.reference_vector, f"{name}.reference_vector").tensor.float()
            else:
                reference = torch.randn(tensor.shape[-1], generator=torch.Generator().manual_seed(self.reference_seed))
            if self.angle_mode == "by" and self.angle % 360 == 0:
                return ()
            rows = plane_basis(tensor, reference, name)
            mode, angle = ("rotate" if self.angle_mode == "by" else "rotate_to"), math.radians(self.angle)
        edits: list[ResidualAddition] = [condition.edit()] if condition is not None else []
        chosen = set(layers)
        for layer in layers:
            for site in [s for s in SITES if s in self.sites]:
                if mode == "project" and site == "input" and layer - 1 in chosen and "output" in self.sites:
                    continue  # the layer before projected its output, which is this input
                edit = ResidualAddition(
                    layer, site, mode, rows, self.token_scope, last_k=self.last_k or 0,
                    preserve_norm=self.preserve_norm, angle=angle,
                )  # fmt: skip
                edits.append(dataclasses.replace(edit, gate=condition.gate) if condition is not None else edit)
        return tuple(edits)
