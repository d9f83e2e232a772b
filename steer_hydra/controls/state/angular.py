"""Angular steering (Vu & Nguyen 2025, "Angular Steering: Behavior Control via Rotation in Activation Space"): the
residual stream is rotated within a 2-D plane that contains a behaviour direction; the angle is the
strength, and every activation keeps its norm.

Method: the plane is spanned by the unit behaviour direction b1 (a mean difference of contrastive activations, or
given) and a second unit vector b2 orthogonal to it (Gram-Schmidt of a reference vector against b1). Each steered
activation h is split into its component in the plane, `p1 b1 + p2 b2`, and the rest; the plane component is
rotated by the angle theta from b1 toward b2 (`angle_mode='by'`: the rotation a strength naturally is, identity at
0), or set to the angle theta from b1 with its length kept (`angle_mode='to'`: the paper's form, steering every
activation to one target angle in the plane; `to` at 0 aligns the plane component with the behaviour, at 180
degrees against it). The rest of h is kept, so `|h|` is unchanged: the intervention moves activations along the
sphere they lie on instead of pushing them off it, which the paper argues keeps generations fluent at strengths
where addition breaks them; addition and directional ablation are its limiting cases (rotating toward b1, rotating
to 90 degrees from it).

How it runs: `steer()` fits b1 from `data=` exactly as CAA fits its vector (the mean difference of the layer's
output between positive and negative answers, at `layer_id`), or takes `steering_vector=`. b2 comes from
`reference_vector=`, or `reference`: `mean` (the mean activation over both sides' answers at that layer: the plane
then holds what typical activations look like off the behaviour direction), `random` (a seeded Gaussian vector), or
`auto` (`mean` when fitting, `random` for a given vector). Each rotated layer gets one `ResidualAddition` of mode
`rotate` / `rotate_to` at its output, rows `[b1, b2]` and the angle in radians. Hugging Face runs it through
`steer_hydra.controls.state.edits` (a forward hook on the layer; `steer_hydra.core.edits.rotate_in_plane`), the
vLLM backends inside the engine per request (the same function on the whole stream `hidden + residual`). A fit to
do is made on the Hugging Face model of the engine's checkpoint first (`backend=vllm`; `vllm_serve` needs
`steering_vector=`, and `reference_vector=` or `reference: random`).

Positions are CAA's token scopes (default `all`, as the paper's intervention on every token); rows are independent
(`supports_batching`) and decode positions lie past a refill layout prompt (`supports_refill`). The fitted plane is
one `SteeringVector` (`fitted_vector`: rows b1 before normalisation and the reference before Gram-Schmidt), cached
on disk by an engine backend.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.state.caa import DEFAULT_DEPTH, validate_layers, validate_token_scope, validate_vector_source
from steer_hydra.controls.state.edits import CompiledEdits
from steer_hydra.controls.state.layer_vector import FitsVector
from steer_hydra.controls.state.probing import pair_means
from steer_hydra.controls.state.residual import check_hidden_size, check_layer
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import BaseArgs, ResidualAddition, StateControl

logger = logging.getLogger(__name__)


def one_direction(value: Any, field_name: str) -> SteeringVector:
    """A given direction as a `SteeringVector` of one `[hidden]` row (a `[1, hidden]` block is accepted)."""
    vector = SteeringVector.coerce(value, field_name=field_name)
    tensor = vector.tensor[0] if vector.tensor.dim() == 2 and vector.tensor.shape[0] == 1 else vector.tensor
    if tensor.dim() != 1:
        raise ValueError(f"{field_name} must be one direction [hidden]; got shape {vector.shape}.")
    return SteeringVector(tensor, vector.layer, vector.metadata)


def plane_basis(direction: torch.Tensor, reference: torch.Tensor, owner: str) -> torch.Tensor:
    """`[2, hidden]` orthonormal rows: the unit direction, and the reference made orthogonal to it (Gram-Schmidt,
    in float64), unit length."""
    first = direction.double()
    norm = float(first.norm())
    if norm == 0:
        raise ValueError(f"{owner}: the direction has zero norm. Fix: give distinct contrastive pairs or a vector.")
    first = first / norm
    second = reference.double() - (reference.double() @ first) * first
    left = float(second.norm())
    if left <= 1e-6 * float(reference.double().norm()) or left == 0:
        raise ValueError(
            f"{owner}: the reference vector is (nearly) parallel to the direction, so they span no plane. Fix: "
            "another reference_vector, or reference='random'."
        )
    return torch.stack([first, second / left]).float()


class AngularSteering(CompiledEdits, FitsVector, StateControl):
    """Norm-preserving rotation of the residual stream in the plane of a behaviour direction (Vu & Nguyen 2025).

    Args:
        steering_vector: the behaviour direction: a `SteeringVector`, a `[hidden]` tensor or a saved vector's path
            (exactly one of this and `data`).
        data: contrastive pairs `{"prompt": ..., "positive": ..., "negative": ...}`: the direction is their mean
            difference at `layer_id`, fitted as CAA's (with `prompt_format`, `accumulate`, `batch_size`).
        reference_vector: the plane's second vector before Gram-Schmidt (a tensor, vector or path); else `reference`.
        reference: `auto`, `mean` or `random` (see the module docstring), with `reference_seed` for `random`.
        angle: the strength, in degrees: the rotation (`angle_mode='by'`) or the target angle from the direction
            (`angle_mode='to'`).
        layer_id: the layer the direction is fitted at (default: CAA's, 40% of the depth; with `data` only).
        layers: the layers whose output is rotated (default: `layer_id`'s, or a given vector's own layer).
        token_scope, last_k: which positions are rotated, as CAA's (default `all`).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        steering_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        data: Sequence[Mapping[str, Any]] | None = None
        reference_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        reference: Literal["auto", "mean", "random"] = "auto"
        reference_seed: int = 0
        angle: float = 0.0
        angle_mode: Literal["by", "to"] = "by"
        layer_id: int | None = None
        layers: Sequence[int] | None = None
        token_scope: Literal["all", "after_prompt", "last_k"] = "all"
        last_k: int | None = None
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        batch_size: int = 8

        def validate(self) -> None:
            name = "AngularSteering"
            validate_vector_source(
                name, "steering_vector", self.steering_vector, self.data, what="a direction",
                layer_id=self.layer_id, acted="rotated",
            )  # fmt: skip
            if self.data is None and self.reference == "mean":
                raise ValueError(
                    f"{name}.reference='mean' is the mean activation read while fitting from data=; a given "
                    "steering_vector is not fitted. Fix: reference='random' or a reference_vector."
                )
            if self.reference_vector is not None and self.reference != "auto":
                raise ValueError(
                    f"{name} takes reference_vector= or reference={self.reference!r}, not both. Fix: drop one."
                )
            if not math.isfinite(self.angle):
                raise ValueError(f"{name}.angle must be finite (degrees); got {self.angle!r}.")
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"{name}.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            validate_layers(name, self.layers, "the fit layer")
            validate_token_scope(name, self.token_scope, self.last_k)
            if self.reference_seed < 0 or self.batch_size < 1:
                raise ValueError(
                    f"{name}.reference_seed must be >= 0 and batch_size >= 1; got {self.reference_seed}, "
                    f"{self.batch_size}."
                )

    supports_batching = True
    supports_refill = True  # decode positions lie past the layout prompt, as past a static one
    adds_residual = True  # fixed rotations: see `residual_edits`
    FIT_FIELDS = ("data", "layer_id", "prompt_format", "accumulate")

    def _configure(self) -> None:
        self._basis: torch.Tensor | None = None
        self._layers: tuple[int, ...] = ()
        self._edits: tuple[ResidualAddition, ...] | None = None
        self._paths: dict[tuple, str] = {}
        self._hash: str | None = None
        self._fitted: SteeringVector | None = None

    @property
    def basis(self) -> torch.Tensor | None:
        """`[2, hidden]`: the unit direction and the plane's second unit vector; None before `steer()`."""
        return self._basis

    @property
    def rotated_layers(self) -> tuple[int, ...]:
        return self._layers

    @property
    def vector_hash(self) -> str | None:
        return self._hash

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        name = type(self).__name__
        layout = self._steered_layout(model)
        fitted = kwargs.get("fitted_vector")  # fitted elsewhere on the same checkpoint (an engine backend)
        reference_kind = self.reference if self.reference != "auto" else ("mean" if self.data is not None else "random")
        if self.steering_vector is not None:
            given = one_direction(self.steering_vector, f"{name}.steering_vector")
            direction, fit_layer, mean = given.tensor.float(), given.layer, None
        else:
            fit_layer = self.layer_id if self.layer_id is not None else layout.default_layer(DEFAULT_DEPTH)
            check_layer(name, fit_layer, layout, "layer_id/layers")
            if fitted is None:
                tokenizer = tokenizer if tokenizer is not None else self.tokenizer
                if tokenizer is None:
                    raise ValueError(f"{name} needs a tokenizer to fit its direction; pass one to steer().")
                positive, negative, median = pair_means(
                    model,
                    tokenizer,
                    layout.layer_path(fit_layer),
                    self.data,
                    prompt_format=self.prompt_format,
                    accumulate=self.accumulate,
                    batch_size=self.batch_size,
                    owner=f"{name}.data",
                )
                fitted = SteeringVector(
                    torch.stack([positive - negative, (positive + negative) / 2]),
                    fit_layer,
                    {"method": "angular_plane", "pairs": len(self.data), "median_norm": median},
                )
            self._fitted = fitted
            direction, mean = fitted.tensor[0].float(), fitted.tensor[1].float()
        check_hidden_size(direction, layout.hidden_size, f"{name}.steering_vector")
        if self.reference_vector is not None:
            reference = one_direction(self.reference_vector, f"{name}.reference_vector").tensor.float()
            check_hidden_size(reference, layout.hidden_size, f"{name}.reference_vector")
        elif reference_kind == "mean":
            reference = mean
        else:
            generator = torch.Generator().manual_seed(self.reference_seed)
            reference = torch.randn(layout.hidden_size, generator=generator)
        basis = plane_basis(direction, reference, name)
        if self.layers is not None:
            layers = tuple(self.layers)
        elif fit_layer is not None:
            layers = (fit_layer,)
        else:
            layers = (layout.default_layer(DEFAULT_DEPTH),)
        for layer in layers:
            check_layer(name, layer, layout, "layer_id/layers")
        self._basis, self._layers = basis, layers
        self._hash = SteeringVector(basis, None, {}).content_hash
        self._bind_edits(model, layout, self._build_edits())
        logger.info("%s at layer(s) %s, %s %g degrees", name, list(layers), self.angle_mode, self.angle)
        return None

    def _build_edits(self) -> tuple[ResidualAddition, ...]:
        """One rotation per rotated layer, at its output (none for a zero rotation)."""
        if self.angle_mode == "by" and self.angle % 360 == 0:
            return ()  # the identity rotation
        mode = "rotate" if self.angle_mode == "by" else "rotate_to"
        radians = math.radians(self.angle)
        return tuple(
            ResidualAddition(
                layer, "output", mode, self._basis, self.token_scope, last_k=self.last_k or 0, angle=radians
            )
            for layer in self._layers
        )
