"""ITI (Li et al. 2023, "Inference-Time Intervention: Eliciting Truthful Answers from a Language Model", arXiv
2306.03341): a few attention heads, chosen by how well a linear probe reads the behaviour from them, are shifted
along their own direction at generation.

Method, as the paper defines it: for every head of every layer, the head's output (its `head_dim` slice of the
attention output, before the output projection mixes the heads) is read on labeled examples; a logistic-regression
probe per head is fitted on a training split and scored on a held-out split. The heads whose probes are most
accurate (top K) are intervened on. Each chosen head gets a direction: the mass mean shift (the mean activation of
positive examples minus that of negative ones; the paper's best variant) or the probe's weight vector, taken to unit
length; and a strength `alpha * sigma`, sigma being the standard deviation of the examples' activations along that
direction. At inference the head's output is shifted by `alpha * sigma * theta`; the other heads are untouched.

How it runs: `steer()` fits the probes from `data=` (CAA's contrastive pairs: positive and negative answers to one
prompt are the labeled examples; each side is read at its answer's last token, or averaged over the answer with
`accumulate='completion'`), pairs split into train and validation with a seeded permutation (both sides of a pair
on one side of the split); or takes `directions=` given. The directions and sigmas are computed on every pair, the
accuracies on the validation pairs only (ties broken by the validation log likelihood, then by layer and head).
The shift of the chosen heads of a layer is one `ResidualAddition` at site `heads` (the output projection's input,
`num_heads * head_dim` wide, zero outside the chosen heads' slices); Hugging Face runs it through
`steer_hydra.controls.state.edits` (a forward pre-hook on the projection: the chosen slices get `x + shift`, the
other slices are left as they are, bit for bit), and the vLLM backends run the same edit inside the engine, per
request (a head-slice addition at the attention output projection's input; tensor parallel size 1). A fit to do is
made on the Hugging Face model of the engine's checkpoint first (`backend=vllm`; a server cannot, so `vllm_serve`
needs `directions=`).

Token scope: the paper's implementation shifts the last position of every forward, i.e. the prompt's last token and
every generated one (`token_scope='last_k'`, `last_k=1`, the default); `after_prompt` and `all` as CAA's. Rows are
independent (`supports_batching`), and decode positions lie past a refill layout prompt (`supports_refill`).

The fitted probes are kept as one `SteeringVector` (`fitted_vector`: `[layers * heads, head_dim + 3]`, each row a
head's unit direction, sigma, validation accuracy and log likelihood; -1 accuracy for a head not probed), which an
engine backend caches on disk; `directions=` takes such a saved file as well as a `[layers, heads, head_dim]` tensor.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.state.caa import validate_layers, validate_pairs
from steer_hydra.controls.state.edits import CompiledEdits, heads_path
from steer_hydra.controls.state.layer_vector import FitsVector
from steer_hydra.controls.state.probing import (
    answer_reduce,
    capture,
    fit_probes,
    pair_batches,
    probe_scores,
    split_pairs,
)
from steer_hydra.controls.state.residual import check_layer
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import BaseArgs, ResidualAddition, StateControl
from steer_hydra.core.layout import ModelLayout

logger = logging.getLogger(__name__)

PROBES_FORMAT = "steer_hydra.iti_probes/1"


@dataclass(frozen=True)
class HeadProbes:
    """Per head of every layer: a unit direction (zeros: none), and, when fitted, sigma (the std of activations
    along it), the validation accuracy of its probe (-1: not probed) and the validation log likelihood."""

    directions: torch.Tensor  # [layers, heads, head_dim]
    sigma: torch.Tensor | None = None  # [layers, heads]
    accuracy: torch.Tensor | None = None  # [layers, heads]
    likelihood: torch.Tensor | None = None  # [layers, heads]

    def to_vector(self, metadata: Mapping[str, Any]) -> SteeringVector:
        """The probes as one saved-able vector (see the module docstring)."""
        layers, heads, dim = self.directions.shape
        columns = [
            self.directions.reshape(layers * heads, dim),
            (self.sigma if self.sigma is not None else torch.zeros(layers, heads)).reshape(-1, 1),
            (self.accuracy if self.accuracy is not None else -torch.ones(layers, heads)).reshape(-1, 1),
            (self.likelihood if self.likelihood is not None else torch.zeros(layers, heads)).reshape(-1, 1),
        ]
        meta = {
            **metadata,
            "format": PROBES_FORMAT,
            "num_layers": layers,
            "num_heads": heads,
            "head_dim": dim,
            "has_sigma": self.sigma is not None,
            "has_accuracy": self.accuracy is not None,
        }
        return SteeringVector(torch.cat(columns, dim=1).float(), None, meta)

    @classmethod
    def from_vector(cls, vector: SteeringVector, owner: str) -> HeadProbes:
        """Probes saved by `to_vector` (raises naming the fix for any other vector)."""
        meta = vector.metadata
        if meta.get("format") != PROBES_FORMAT:
            raise ValueError(
                f"{owner}: this vector is not a saved ITI fit (format {meta.get('format')!r}). Fix: pass a "
                "[layers, heads, head_dim] tensor, or a file written from ITI's fitted_vector."
            )
        layers, heads, dim = int(meta["num_layers"]), int(meta["num_heads"]), int(meta["head_dim"])
        table = vector.tensor.float().reshape(layers, heads, dim + 3)
        sigma = table[..., dim] if meta.get("has_sigma", True) else None
        if not meta.get("has_accuracy", True):
            return cls(table[..., :dim], sigma)
        return cls(table[..., :dim], sigma, table[..., dim + 1], table[..., dim + 2])


class ITI(CompiledEdits, FitsVector, StateControl):
    """Inference-time intervention (arXiv 2306.03341): probe-selected heads shifted along their directions.

    Args:
        data: contrastive pairs `{"prompt": ..., "positive": ..., "negative": ...}` (CAA's form): the positive and
            negative answers are the labeled examples the probes are fitted on (exactly one of this and
            `directions`).
        directions: a `[layers, heads, head_dim]` tensor of head directions (zero rows: no direction), or a
            `fitted_vector` saved with `SteeringVector.save` (its probes' accuracies and sigmas come with it).
        heads: `[[layer, head], ...]` to intervene on, instead of the top `top_k` by probe accuracy.
        top_k: how many heads to intervene on, by validation accuracy (at most the heads probed; the paper's K).
            A bare `directions` tensor has no accuracies: without `heads`, every head with a direction is used.
        alpha: the strength (the paper's alpha); the shift is `alpha * sigma * theta` (`strength_unit='std'`) or
            `alpha * theta` (`'absolute'`, the only unit a bare `directions` tensor allows: it has no sigma).
        direction_method: `mass_mean_shift` (the paper's best) or `probe_weight`.
        token_scope, last_k: which positions are shifted: `last_k` (the prompt's last `last_k` tokens and every
            generated one; the paper's: `last_k=1`), `after_prompt`, `all`. `last_k` is read with `last_k` only.
        layers: the layers whose heads are probed (default: every layer).
        prompt_format, accumulate, batch_size: how pairs are rendered and read (as CAA's).
        validation_fraction, probe_seed: the held-out share of pairs and the seed of the split.
        probe_l2, probe_steps: the probes' L2 penalty (on standardised features) and L-BFGS iterations.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        data: Sequence[Mapping[str, Any]] | None = None
        directions: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        heads: Sequence[Sequence[int]] | None = None
        top_k: int = 16
        alpha: float = 15.0
        strength_unit: Literal["std", "absolute"] = "std"
        direction_method: Literal["mass_mean_shift", "probe_weight"] = "mass_mean_shift"
        token_scope: Literal["last_k", "after_prompt", "all"] = "last_k"
        last_k: int = 1
        layers: Sequence[int] | None = None
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        validation_fraction: float = 0.25
        probe_seed: int = 0
        probe_l2: float = 1e-2
        probe_steps: int = 100
        batch_size: int = 8

        def validate(self) -> None:
            name = "ITI"
            if (self.data is None) == (self.directions is None):
                raise ValueError(
                    f"{name} needs exactly one of data= (contrastive pairs to fit head probes on) and directions= (a "
                    "[layers, heads, head_dim] tensor or a saved fit); got "
                    f"{'both' if self.data is not None else 'neither'}."
                )
            if self.data is not None:
                validate_pairs(self.data, f"{name}.data")
            elif self.layers is not None:
                raise ValueError(
                    f"{name}.layers chooses the layers probed from data=; given directions are not probed. Fix: drop "
                    "layers, or name the heads with heads=[[layer, head], ...]."
                )
            if self.heads is not None:
                pairs = [tuple(h) for h in self.heads]
                if not pairs or any(len(p) != 2 or min(p) < 0 for p in pairs):
                    raise ValueError(
                        f"{name}.heads must list [layer, head] pairs of indices >= 0; got "
                        f"{[list(h) for h in self.heads]}."
                    )
                if len(set(pairs)) != len(pairs):
                    raise ValueError(
                        f"{name}.heads lists a head twice: {[list(p) for p in pairs]}. Fix: list each once."
                    )
            if self.top_k < 1:
                raise ValueError(f"{name}.top_k must be >= 1; got {self.top_k}.")
            if not math.isfinite(self.alpha):
                raise ValueError(f"{name}.alpha must be finite; got {self.alpha!r}.")
            if self.last_k < 1:
                raise ValueError(f"{name}.last_k must be >= 1; got {self.last_k}.")
            validate_layers(name, self.layers, "every layer")
            if not 0 < self.validation_fraction < 1:
                raise ValueError(f"{name}.validation_fraction must be in (0, 1); got {self.validation_fraction}.")
            if self.probe_seed < 0 or self.probe_l2 < 0 or self.probe_steps < 1 or self.batch_size < 1:
                raise ValueError(
                    f"{name}: probe_seed and probe_l2 must be >= 0 and probe_steps and batch_size >= 1; got "
                    f"probe_seed={self.probe_seed}, probe_l2={self.probe_l2}, probe_steps={self.probe_steps}, "
                    f"batch_size={self.batch_size}."
                )

    supports_batching = True
    supports_refill = True  # decode positions lie past the layout prompt, as past a static one
    adds_residual = True  # fixed head-slice additions: see `residual_edits`
    FIT_FIELDS = (
        "data",
        "layers",
        "direction_method",
        "prompt_format",
        "accumulate",
        "validation_fraction",
        "probe_seed",
        "probe_l2",
        "probe_steps",
    )

    def _configure(self) -> None:
        self._probes: HeadProbes | None = None
        self._chosen: tuple[tuple[int, int], ...] = ()
        self._edits: tuple[ResidualAddition, ...] | None = None
        self._paths: dict[tuple, str] = {}
        self._hash: str | None = None
        self._fitted: SteeringVector | None = None

    @property
    def probes(self) -> HeadProbes | None:
        """The head probes in use (fitted or given); None before `steer()`."""
        return self._probes

    @property
    def chosen_heads(self) -> tuple[tuple[int, int], ...]:
        """The `(layer, head)` pairs intervened on, best probe first (resolved at `steer()`)."""
        return self._chosen

    @property
    def vector_hash(self) -> str | None:
        return self._hash

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        name = type(self).__name__
        layout = self._steered_layout(model)
        for layer in self.layers or ():
            check_layer(name, layer, layout, "layers/heads")
        for layer, head in self.heads or ():
            check_layer(name, layer, layout, "layers/heads")
            if head >= layout.num_heads:
                raise ValueError(
                    f"{name}.heads names head {head} of layer {layer}; the model has {layout.num_heads} heads "
                    f"(0..{layout.num_heads - 1}). Fix: heads within that range."
                )
        fitted = kwargs.get("fitted_vector")  # fitted elsewhere on the same checkpoint (an engine backend)
        if self.directions is not None:
            probes, vector = self._given(layout)
        elif fitted is not None:
            probes, vector = HeadProbes.from_vector(fitted, name), fitted
            self._fitted = fitted
        else:
            tokenizer = tokenizer if tokenizer is not None else self.tokenizer
            if tokenizer is None:
                raise ValueError(f"{name} needs a tokenizer to fit its probes; pass one to steer().")
            probes = fit_head_probes(
                model,
                tokenizer,
                layout,
                self.data,
                layers=tuple(self.layers) if self.layers is not None else tuple(range(layout.num_layers)),
                direction_method=self.direction_method,
                prompt_format=self.prompt_format,
                accumulate=self.accumulate,
                batch_size=self.batch_size,
                validation_fraction=self.validation_fraction,
                seed=self.probe_seed,
                l2=self.probe_l2,
                steps=self.probe_steps,
            )
            metadata = {"method": "iti", "direction_method": self.direction_method, "pairs": len(self.data)}
            vector = self._fitted = probes.to_vector(metadata)
        expected = (layout.num_layers, layout.num_heads, layout.head_dim)
        if tuple(probes.directions.shape) != expected:
            raise ValueError(
                f"{name}.directions has shape {tuple(probes.directions.shape)} but the model's (layers, heads, "
                f"head_dim) are {expected}. Fix: use directions fitted on this model."
            )
        if self.strength_unit == "std" and probes.sigma is None:
            raise ValueError(
                f"{name}.strength_unit='std' scales by the std of activations along each direction, measured when "
                "probes are fitted; a bare directions tensor has none. Fix: strength_unit='absolute', or pass a "
                "saved fit (fitted_vector) or data=."
            )
        self._chosen = self._choose(probes, name)
        self._probes, self._hash = probes, vector.content_hash
        width = layout.num_heads * layout.head_dim
        for layer in {layer for layer, _ in self._chosen}:
            projection = model.get_submodule(heads_path(model, layout, layer))
            found = getattr(projection, "in_features", width)
            if found != width:
                raise ValueError(
                    f"{name}: layer {layer}'s attention output projection reads {found} features, not heads x "
                    f"head_dim = {width}; its input is not the heads' outputs side by side."
                )
        self._bind_edits(model, layout, self._build_edits(probes, layout))
        logger.info("%s on %d head(s): %s", name, len(self._chosen), list(self._chosen))
        return None

    def _given(self, layout: ModelLayout) -> tuple[HeadProbes, SteeringVector]:
        name = type(self).__name__
        value = self.directions
        if isinstance(value, torch.Tensor):
            if value.dim() != 3:
                raise ValueError(
                    f"{name}.directions must be a [layers, heads, head_dim] tensor; got shape {tuple(value.shape)}."
                )
            norms = value.float().norm(dim=-1, keepdim=True)
            units = torch.where(norms > 0, value.float() / norms.clamp_min(1e-30), torch.zeros_like(norms))
            probes = HeadProbes(units)
            return probes, probes.to_vector({"method": "iti", "given": True})
        vector = SteeringVector.coerce(value, field_name=f"{name}.directions")
        return HeadProbes.from_vector(vector, name), vector

    def _choose(self, probes: HeadProbes, name: str) -> tuple[tuple[int, int], ...]:
        has_direction = probes.directions.norm(dim=-1) > 0
        if self.heads is not None:
            chosen = tuple((int(layer), int(head)) for layer, head in self.heads)
            empty = [c for c in chosen if not bool(has_direction[c])]
            if empty:
                raise ValueError(
                    f"{name}.heads names head(s) {[list(c) for c in empty]} without a direction (zero vectors: its "
                    "pairs' two sides read the same there). Fix: choose other heads."
                )
            return chosen
        if probes.accuracy is None:  # a bare tensor: every head with a direction
            return tuple((int(a), int(b)) for a, b in has_direction.nonzero().tolist())
        candidates = (has_direction & (probes.accuracy >= 0)).nonzero().tolist()
        if not candidates:
            raise ValueError(f"{name}: no probed head has a direction. Fix: give pairs whose two sides differ.")
        likelihood = probes.likelihood if probes.likelihood is not None else torch.zeros_like(probes.accuracy)
        candidates.sort(key=lambda c: (-float(probes.accuracy[c[0], c[1]]), -float(likelihood[c[0], c[1]]), c[0], c[1]))
        return tuple((int(a), int(b)) for a, b in candidates[: self.top_k])

    def _build_edits(self, probes: HeadProbes, layout: ModelLayout) -> tuple[ResidualAddition, ...]:
        """One head-slice addition per layer with a chosen head, at the output projection's input (none at alpha
        0)."""
        if self.alpha == 0:
            return ()
        dim = layout.head_dim
        rows: dict[int, torch.Tensor] = {}
        for layer, head in self._chosen:
            scale = self.alpha * (float(probes.sigma[layer, head]) if self.strength_unit == "std" else 1.0)
            row = rows.setdefault(layer, torch.zeros(1, layout.num_heads * dim))
            row[0, head * dim : (head + 1) * dim] = scale * probes.directions[layer, head].float()
        scope = self.token_scope
        return tuple(
            ResidualAddition(layer, "heads", "from", rows[layer], scope, last_k=self.last_k if scope == "last_k" else 0)
            for layer in sorted(rows)
        )


def fit_head_probes(
    model: torch.nn.Module,
    tokenizer: Any,
    layout: ModelLayout,
    pairs: Sequence[Mapping[str, Any]],
    *,
    layers: Sequence[int],
    direction_method: str,
    prompt_format: str,
    accumulate: str,
    batch_size: int,
    validation_fraction: float,
    seed: int,
    l2: float,
    steps: int,
) -> HeadProbes:
    """Every head of `layers` read on both sides of every pair at the output projection's input, then probed (see
    the module docstring): directions and sigmas from every pair, accuracies from the validation pairs."""
    heads, dim = layout.num_heads, layout.head_dim
    sites = {str(layer): (heads_path(model, layout, layer), "input") for layer in layers}
    sides = []
    for side in ("positive", "negative"):
        batches = pair_batches(tokenizer, pairs, side, prompt_format, batch_size)
        captured = capture(model, sites, [b for b, _ in batches])
        per_layer = []
        for layer in layers:
            reduced = [
                answer_reduce(block[str(layer)], lengths, accumulate, "ITI.data")
                for block, (_, lengths) in zip(captured, batches, strict=True)
            ]
            per_layer.append(torch.cat(reduced).reshape(-1, heads, dim))
        sides.append(torch.stack(per_layer, dim=1))  # [pairs, layers, heads, dim]
    count = len(pairs)
    features = torch.cat(sides).reshape(2 * count, len(layers) * heads, dim)
    labels = torch.cat([torch.ones(count), torch.zeros(count)])
    train, validation = split_pairs(count, validation_fraction, seed, "ITI.data")
    train_rows, validation_rows = torch.cat([train, train + count]), torch.cat([validation, validation + count])
    weights, bias = fit_probes(features[train_rows], labels[train_rows], l2=l2, steps=steps)
    accuracy, likelihood = probe_scores(features[validation_rows], labels[validation_rows], weights, bias)
    mass_mean_shift = features[:count].mean(0) - features[count:].mean(0)
    raw = mass_mean_shift if direction_method == "mass_mean_shift" else weights
    norms = raw.norm(dim=-1, keepdim=True)
    units = torch.where(norms > 0, raw / norms.clamp_min(1e-30), torch.zeros_like(raw))
    sigma = torch.einsum("npd,pd->np", features, units).std(0, unbiased=False)
    full = torch.zeros(layout.num_layers, heads, dim)
    full_sigma = torch.zeros(layout.num_layers, heads)
    full_accuracy = -torch.ones(layout.num_layers, heads)
    full_likelihood = torch.zeros(layout.num_layers, heads)
    index = torch.tensor(list(layers), dtype=torch.long)
    full[index] = units.reshape(len(layers), heads, dim)
    full_sigma[index] = sigma.reshape(len(layers), heads)
    full_accuracy[index] = accuracy.reshape(len(layers), heads)
    full_likelihood[index] = likelihood.reshape(len(layers), heads)
    return HeadProbes(full, full_sigma, full_accuracy, full_likelihood)
