"""CAST (Lee et al. 2024, "Programming Refusal with Conditional Activation Steering", arXiv 2409.05907): a behaviour
vector is added only to the rows whose prompt matches a condition, read from the prompt's own hidden states.

Method, as the paper defines it: a condition vector c describes a property of prompts (e.g. "asks about legal
advice"); at inference the hidden state at the condition layer, averaged over the prompt's tokens (m), is projected
on c, and the cosine between m and that projection, `sim = cos(m, (m.c)c / |c|^2) = |m.c| / (|m||c|)`, is compared
with a threshold (`>` or `<`, chosen with it). When the condition holds, the behaviour vector (CAA's: a mean
difference of contrastive answers, times a multiplier) is added to the generation; otherwise the row runs unsteered.
Each row of a batch is decided by its own prompt.

How it runs: `steer()` fits or takes both vectors. The behaviour is exactly a CAA (built inside, from
`steering_vector=`/`data=`, `layer_id`, `multiplier`, `normalize_vector`, `strength_unit`, fitted with CAA's helpers
and memo), acting after the prompt. The condition is `condition_vector=` or fitted from `condition_data=` (pairs of
prompt texts, `positive` with the condition and `negative` without; a pair's `prompt` key is not read): the mean
difference, at `condition_layer`, of the prompts' mean hidden states (each text rendered as the pipeline renders a
prompt); its threshold (and comparison, unless given) is then fitted on those prompts' similarities so the gate
opens for the `condition_open_for` side (`best_threshold`: the best accuracy, the widest margin). The control is two
edits: a `condition` (layer output at `condition_layer`; the prompt's mean decides gate `cast-<digest>` per row) and
CAA's addition gated by it. Hugging Face runs them through `steer_hydra.controls.state.edits` (the gate is decided
on the prefill, from each row's real prompt positions; a gated-on row gets exactly CAA's `x + delta`, a gated-off
row is left as it was, so each row decodes as it would alone, under CAA or unsteered). The vLLM backends decide the
gate per request inside the engine, from the request's own prompt positions (read even across chunked prefills),
and give the request CAA's addition only when it opens (`steer_hydra.backends.vllm.plugin`); a request with a
condition shares no prefix-cache blocks with others (a nonce of its own). A fit to do runs on the Hugging Face
model of the engine's checkpoint first (`backend=vllm`; `vllm_serve` needs both vectors and the threshold given).

`supports_batching`: yes (rows gated independently). `supports_refill`: no: a refill engine rebuilds the hooks of
the decode steps for each batch composition, which would lose the gates its group prefills decided.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.state.caa import CAA, validate_pairs
from steer_hydra.controls.state.edits import CompiledEdits
from steer_hydra.controls.state.layer_vector import FitsVector
from steer_hydra.controls.state.probing import best_threshold, prompt_means
from steer_hydra.controls.state.residual import check_hidden_size
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import BaseArgs, ResidualAddition, StateControl
from steer_hydra.core.edits import condition_similarity
from steer_hydra.core.layout import ModelLayout

logger = logging.getLogger(__name__)

Comparison = Literal[">", "<"]
# what a condition fitted from condition_data depends on (besides the model): the fit identity of a gated control
CONDITION_FIT_FIELDS = ("condition_data", "condition_layer", "threshold", "comparison", "condition_open_for")


@dataclass(frozen=True)
class Condition:
    """A fitted or given condition: the unit direction, the layer it is read at and its decision rule."""

    unit: torch.Tensor
    layer: int
    threshold: float
    comparison: str
    accuracy: float | None = None  # on the condition prompts, when fitted

    @property
    def gate(self) -> str:
        """The gate's name: a digest of the condition (two controls with one condition share the decision)."""
        digest = hashlib.sha256(self.unit.float().numpy().tobytes())
        digest.update(f"{self.layer}|{self.threshold!r}|{self.comparison}".encode())
        return f"cast-{digest.hexdigest()[:12]}"

    def edit(self) -> ResidualAddition:
        """The `condition` edit that decides this gate from the prompt, at the layer's output."""
        return ResidualAddition(
            self.layer,
            "output",
            "condition",
            self.unit.float()[None],
            "after_prompt",
            gate=self.gate,
            threshold=float(self.threshold),
            comparison=self.comparison,  # type: ignore[arg-type]
        )


def validate_condition_args(
    owner: str,
    condition_vector: Any,
    condition_data: Sequence[Mapping[str, Any]] | None,
    threshold: float | None,
    condition_layer: int | None,
) -> None:
    """The condition arguments' rules (shared by CAST and ActivationAdapter's gate)."""
    if (condition_vector is None) == (condition_data is None):
        raise ValueError(
            f"{owner} needs exactly one of condition_vector= (a direction or a saved file) and condition_data= "
            f"(prompt pairs with and without the condition); got {'both' if condition_data is not None else 'neither'}."
        )
    if condition_data is not None:
        validate_pairs(condition_data, f"{owner}.condition_data")
    elif threshold is None:
        raise ValueError(
            f"{owner}.threshold is fitted from condition_data=; a given condition_vector needs it given. Fix: "
            "threshold=<a similarity in [0, 1]>, or condition_data=."
        )
    if threshold is not None and not math.isfinite(threshold):
        raise ValueError(f"{owner}.threshold must be finite; got {threshold!r}.")
    if condition_layer is not None and condition_layer < 0:
        raise ValueError(f"{owner}.condition_layer must be >= 0 (a decoder layer index); got {condition_layer}.")


def fit_condition(
    model: torch.nn.Module,
    tokenizer: Any,
    layout: ModelLayout,
    layer: int,
    pairs: Sequence[Mapping[str, Any]],
    *,
    threshold: float | None,
    comparison: str | None,
    open_for: str,
    prompt_format: str,
    batch_size: int,
) -> tuple[torch.Tensor, float, str, float]:
    """`(condition vector, threshold, comparison, accuracy)` from prompt pairs (see the module docstring)."""
    path = layout.layer_path(layer)
    sides = {
        side: prompt_means(
            model, tokenizer, path, [p[side] for p in pairs], prompt_format=prompt_format, batch_size=batch_size
        )
        for side in ("positive", "negative")
    }
    vector = sides["positive"].mean(0) - sides["negative"].mean(0)
    norm = float(vector.norm())
    if norm == 0:
        raise ValueError("The condition's prompt pairs read the same at the layer, so they give no direction.")
    unit = vector / norm
    scores = {side: condition_similarity(means, unit) for side, means in sides.items()}
    on, off = scores[open_for], scores["negative" if open_for == "positive" else "positive"]
    if threshold is None:
        threshold, comparison, accuracy = best_threshold(on, off, (comparison,) if comparison else (">", "<"))
    else:
        comparison = comparison or ">"
        opened = torch.cat([on, off]) > threshold if comparison == ">" else torch.cat([on, off]) < threshold
        truth = torch.cat([torch.ones_like(on, dtype=torch.bool), torch.zeros_like(off, dtype=torch.bool)])
        accuracy = float((opened == truth).float().mean())
    return vector, float(threshold), str(comparison), accuracy


def fitted_condition(
    owner: str,
    args: Any,
    model: torch.nn.Module,
    tokenizer: Any,
    layout: ModelLayout,
    layer: int,
    packed: Mapping[str, Any],
) -> tuple[torch.Tensor, float, str, float | None]:
    """`(condition vector, threshold, comparison, accuracy)` from `args.condition_data` (the condition arguments of
    CAST and ActivationAdapter): as fitted elsewhere on the same checkpoint (`packed["condition"]`: an engine
    backend's fit), else fitted here at `layer`."""
    if "condition" in packed:
        return packed["condition"]
    if tokenizer is None:
        raise ValueError(f"{owner} needs a tokenizer to fit its condition; pass one to steer().")
    return fit_condition(
        model,
        tokenizer,
        layout,
        layer,
        args.condition_data,
        threshold=args.threshold,
        comparison=args.comparison,
        open_for=args.condition_open_for,
        prompt_format=args.prompt_format,
        batch_size=args.batch_size,
    )


class CAST(CompiledEdits, FitsVector, StateControl):
    """Conditional activation steering (arXiv 2409.05907): CAA's addition for the rows whose prompt meets a condition.

    Args:
        steering_vector, data, layer_id, multiplier, normalize_vector, strength_unit: the behaviour, exactly CAA's
            (exactly one of `steering_vector` and `data`; it acts after the prompt).
        condition_vector: the condition direction (a tensor, vector or path; exactly one of this and
            `condition_data`), read at `condition_layer`.
        condition_data: prompt pairs `{"positive": <a prompt with the condition>, "negative": <one without>}`.
        condition_layer: the layer whose output the condition reads (default: the behaviour's layer).
        threshold: the similarity threshold (fitted from `condition_data` when None; required with a vector).
        comparison: `>` (open above the threshold) or `<`; None: `>` with a given threshold, fitted with a fitted one.
        condition_open_for: which side of `condition_data` the fitted gate opens for (`positive`: steer the
            prompts that have the condition; `negative`: those that do not).
        prompt_format, accumulate, batch_size: how pairs and prompts are rendered and read (as CAA's).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        steering_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        data: Sequence[Mapping[str, Any]] | None = None
        layer_id: int | None = None
        multiplier: float = 1.0
        normalize_vector: bool = False
        strength_unit: Literal["absolute", "median_norm"] = "absolute"
        condition_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        condition_data: Sequence[Mapping[str, Any]] | None = None
        condition_layer: int | None = None
        threshold: float | None = None
        comparison: Comparison | None = None
        condition_open_for: Literal["positive", "negative"] = "positive"
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        batch_size: int = 8

        def validate(self) -> None:
            name = "CAST"
            if (self.steering_vector is None) == (self.data is None):
                raise ValueError(
                    f"{name} needs exactly one of steering_vector= (the behaviour vector or a saved file) and data= "
                    f"(contrastive pairs to fit it, as CAA's); got {'both' if self.data is not None else 'neither'}."
                )
            if self.data is not None:
                validate_pairs(self.data, f"{name}.data")
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"{name}.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            if not math.isfinite(self.multiplier):
                raise ValueError(f"{name}.multiplier must be finite; got {self.multiplier!r}.")
            validate_condition_args(
                name, self.condition_vector, self.condition_data, self.threshold, self.condition_layer
            )
            if self.batch_size < 1:
                raise ValueError(f"{name}.batch_size must be >= 1; got {self.batch_size}.")

    supports_batching = True
    supports_refill = False  # see the module docstring
    adds_residual = True  # a condition and a gated addition: see `residual_edits`
    FIT_FROM = ("data", "condition_data")
    FIT_FIELDS = (*CAA.FIT_FIELDS, *CONDITION_FIT_FIELDS)

    def _configure(self) -> None:
        self._behaviour: CAA | None = None
        self._condition: Condition | None = None
        self._edits: tuple[ResidualAddition, ...] | None = None
        self._paths: dict[tuple, str] = {}
        self._fitted: SteeringVector | None = None

    @property
    def behaviour(self) -> CAA | None:
        """The CAA this control gates (bound at `steer()`)."""
        return self._behaviour

    @property
    def condition(self) -> Condition | None:
        """The condition (direction, layer, threshold, comparison), resolved at `steer()`."""
        return self._condition

    @property
    def vector_hash(self) -> str | None:
        if self._behaviour is None or self._condition is None:
            return None
        digest = hashlib.sha256(f"{self._behaviour.vector_hash}|{self._condition.gate}".encode())
        return digest.hexdigest()

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        name = type(self).__name__
        layout = self._steered_layout(model)
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        fitted = kwargs.get("fitted_vector")  # fitted elsewhere on the same checkpoint (an engine backend)
        packed: dict[str, Any] = {}
        if fitted is not None:
            packed = unpack_gated_fit(
                fitted, format_name=_FORMAT, role="behaviour", refusal="CAST: this fitted vector is not CAST's"
            )
        behaviour = CAA(
            steering_vector=self.steering_vector,
            data=self.data,
            layer_id=self.layer_id,
            multiplier=self.multiplier,
            normalize_vector=self.normalize_vector,
            strength_unit=self.strength_unit,
            token_scope="after_prompt",
            prompt_format=self.prompt_format,
            accumulate=self.accumulate,
            batch_size=self.batch_size,
        )
        behaviour.tokenizer = tokenizer
        behaviour.steer(model, tokenizer=tokenizer, fitted_vector=packed.get("behaviour"))
        layer = self.condition_layer if self.condition_layer is not None else behaviour.layer
        if not 0 <= layer < layout.num_layers:
            raise ValueError(
                f"{name}.condition_layer={layer} is out of range; the model has {layout.num_layers} layers "
                f"(0..{layout.num_layers - 1}). Fix: a condition_layer within that range."
            )
        if self.condition_vector is not None:
            given = SteeringVector.coerce(self.condition_vector, field_name=f"{name}.condition_vector").tensor
            given = given[0] if given.dim() == 2 and given.shape[0] == 1 else given
            if given.dim() != 1:
                raise ValueError(f"{name}.condition_vector must be one direction [hidden]; got {tuple(given.shape)}.")
            vector, threshold, comparison, accuracy = given.float(), self.threshold, self.comparison or ">", None
        else:
            vector, threshold, comparison, accuracy = fitted_condition(
                name, self.args, model, tokenizer, layout, layer, packed
            )
        check_hidden_size(vector, layout.hidden_size, f"{name}.condition_vector")
        norm = float(vector.norm())
        if norm == 0:
            raise ValueError(f"{name}.condition_vector has zero norm, so it names no condition. Fix: a non-zero one.")
        condition = Condition(vector.float() / norm, layer, float(threshold), comparison, accuracy)
        if self.data is not None or self.condition_data is not None:
            self._fitted = pack_gated_fit(
                behaviour.fitted_vector,
                vector if self.condition_data is not None else None,
                condition,
                condition.unit.shape[-1],
                format_name=_FORMAT,
                role="behaviour",
                layer=condition.layer,
            )
        self._behaviour, self._condition = behaviour, condition
        self._bind_edits(model, layout, self._build_edits())
        logger.info(
            "%s: behaviour at layer %d, condition at layer %d (sim %s %.4f%s)",
            name,
            behaviour.layer,
            layer,
            comparison,
            threshold,
            "" if accuracy is None else f", {accuracy:.0%} of the condition prompts right",
        )
        return None

    def _build_edits(self) -> tuple[ResidualAddition, ...]:
        """The condition (read from the prompt at `condition_layer`) and CAA's addition gated by it."""
        addition = self._behaviour.residual_addition()
        if addition is None:  # multiplier 0: nothing to gate
            return ()
        return (self._condition.edit(), dataclasses.replace(addition, gate=self._condition.gate))

    def cleanup(self) -> None:
        if self._behaviour is not None:
            self._behaviour.cleanup()


_FORMAT = "steer_hydra.cast_fit/1"


def pack_gated_fit(
    steering: SteeringVector | None,
    condition: torch.Tensor | None,
    rule: Condition | None,
    hidden: int,
    *,
    format_name: str,
    role: str,
    layer: int | None,
) -> SteeringVector:
    """What a gated control fitted (CAST, ActivationAdapter), as one vector an engine backend caches: rows the
    steering vector (metadata keys named by its `role`) and the condition, zeros for what was given, with the
    condition's rule."""
    rows = torch.stack(
        [
            steering.tensor.float().reshape(-1) if steering is not None else torch.zeros(hidden),
            condition.float() if condition is not None else torch.zeros(hidden),
        ]
    )
    metadata = {
        "format": format_name,
        f"has_{role}": steering is not None,
        "has_condition": condition is not None,
        "threshold": rule.threshold if rule is not None else None,
        "comparison": rule.comparison if rule is not None else None,
        "accuracy": rule.accuracy if rule is not None else None,
        f"{role}_layer": steering.layer if steering is not None else None,
        f"{role}_metadata": dict(steering.metadata) if steering is not None else {},
    }
    return SteeringVector(rows, layer, metadata)


def unpack_gated_fit(vector: SteeringVector, *, format_name: str, role: str, refusal: str) -> dict[str, Any]:
    """`{role: SteeringVector, "condition": (vector, threshold, comparison, accuracy)}` of a `pack_gated_fit` (each
    when fitted); `refusal` opens the error for a vector of another format."""
    meta = vector.metadata
    if meta.get("format") != format_name:
        raise ValueError(f"{refusal} (format {meta.get('format')!r}).")
    out: dict[str, Any] = {}
    if meta.get(f"has_{role}"):
        out[role] = SteeringVector(
            vector.tensor[0].float(), meta.get(f"{role}_layer"), meta.get(f"{role}_metadata") or {}
        )
    if meta.get("has_condition"):
        out["condition"] = (vector.tensor[1].float(), meta["threshold"], meta["comparison"], meta.get("accuracy"))
    return out
