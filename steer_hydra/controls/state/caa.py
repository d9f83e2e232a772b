"""CAA (Panickssery et al. 2023): add `multiplier * v` to one decoder layer's output after the prompt.

The steering vector is given (a `SteeringVector`, a tensor, or the path of a saved vector) or fitted at
`steer()` on the live model from contrastive pairs: the mean difference of the layer's output between positive
and negative completions, taken at the last (answer) token (`accumulate="last_token"`, the paper's A/B setting)
or averaged over the completion tokens only (`accumulate="completion"`: the answer's tokens after the prompt,
never the first position, whose activation is an attention sink ~30x the median norm on SmolLM2). Fitting also
records the median residual norm at the layer over those tokens (`strength_unit="median_norm"`).

At generate time a forward pre-hook on the layer reads how many positions its KV cache already holds (the
absolute column of the first hidden state in this forward) and a forward hook adds the vector to the positions
in the token scope:
- `after_prompt`: columns >= the padded prompt length (no prompt position; every generated token);
- `all`: every column; `last_k`: columns >= prompt length - `last_k` (the prompt's last k tokens and after).
Rows are left-packed, so one column threshold is right for every row of a batch.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.state.layer_vector import LayerVectorArgs, LayerVectorControl
from steer_hydra.controls.state.residual import (
    capture_layer,
    output_hidden,
    past_length,
    preserve_norm,
    with_output_hidden,
)
from steer_hydra.controls.state.vectors import SteeringVector
from steer_hydra.core.controls import HookSet, ResidualAddition
from steer_hydra.core.identity import canonical_json, canonical_value, model_fingerprint
from steer_hydra.core.layout import ModelLayout
from steer_hydra.core.rendering import has_chat_template
from steer_hydra.core.tensors import pad_left

logger = logging.getLogger(__name__)

DEFAULT_DEPTH = 0.4
_PROMPT_KEYS = ("prompt", "question")


class CAA(LayerVectorControl):
    """Contrastive activation addition (arXiv 2312.06681) at one decoder layer's output.

    Args:
        steering_vector: a `SteeringVector`, a `[hidden]` tensor, or the path of a vector saved with
            `SteeringVector.save` (exactly one of this and `data`).
        data: contrastive pairs `{"prompt": ..., "positive": ..., "negative": ...}` (the prompt is optional);
            the vector is their mean difference at `layer_id`, fitted at `steer()`.
        layer_id: decoder layer (default: the vector's own layer, else 40% of the depth).
        multiplier: scale of the added vector (negative values suppress the behaviour).
        token_scope: `after_prompt`, `all` or `last_k` (with `last_k`).
        normalize_vector: use the unit vector (the multiplier is then the added norm).
        use_norm_preservation: rescale each steered hidden state back to its original norm.
        prompt_format: `chat` renders a pair's prompt with the chat template (when the tokenizer has one),
            `text` concatenates prompt and answer.
        accumulate: `last_token` (the answer's last token) or `completion` (mean over the answer's tokens).
        batch_size: pairs per forward when fitting.
        direction, direction_seed, strength_unit: sanity arms and strength units (see `layer_vector`).
    """

    @dataclass(frozen=True)
    class Args(LayerVectorArgs):
        steering_vector: SteeringVector | torch.Tensor | str | os.PathLike | None = None
        data: Sequence[Mapping[str, Any]] | None = None
        layer_id: int | None = None
        multiplier: float = 1.0
        token_scope: Literal["after_prompt", "all", "last_k"] = "after_prompt"
        last_k: int | None = None
        normalize_vector: bool = False
        use_norm_preservation: bool = False
        prompt_format: Literal["chat", "text"] = "chat"
        accumulate: Literal["last_token", "completion"] = "last_token"
        batch_size: int = 8

        def validate(self) -> None:
            super().validate()
            validate_vector_source("CAA", "steering_vector", self.steering_vector, self.data, what="a vector")
            if self.layer_id is not None and self.layer_id < 0:
                raise ValueError(f"CAA.layer_id must be >= 0 (a decoder layer index); got {self.layer_id}.")
            if not math.isfinite(self.multiplier):
                raise ValueError(f"CAA.multiplier must be finite; got {self.multiplier!r}.")
            validate_token_scope("CAA", self.token_scope, self.last_k)
            if self.batch_size < 1:
                raise ValueError(f"CAA.batch_size must be >= 1; got {self.batch_size}.")

    supports_batching = True
    supports_refill = True  # decode positions are past the layout prompt it is given (see backends.refill)

    DEFAULT_DEPTH = DEFAULT_DEPTH
    FIT_FIELDS = ("data", "layer_id", "prompt_format", "accumulate")

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        self._bind(model, tokenizer, self._fit, _as_direction, fitted=kwargs.get("fitted_vector"))
        return None

    def _fit(self, model: torch.nn.Module, tokenizer: Any, layout: ModelLayout, layer: int) -> SteeringVector:
        return fitted_mean_difference(
            model, tokenizer, layout, layer, self.data, self.prompt_format, self.batch_size, self.accumulate
        )

    # ------------------------------------------------------------------ per call
    def residual_addition(self) -> ResidualAddition | None:
        """`multiplier * v` after the layer, at every position from the token scope's start (None at multiplier 0)."""
        self._require_bound("residual_addition")
        if self.multiplier == 0:
            return None
        return ResidualAddition(
            self._layer,
            "output",
            "from",
            self.added_rows(),
            self.token_scope,
            last_k=int(self.last_k or 0),
            preserve_norm=self.use_norm_preservation,
        )

    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        self._require_bound()
        if self.multiplier == 0:
            return {}
        prompt_len = input_ids.shape[1]
        threshold = {"after_prompt": prompt_len, "all": 0, "last_k": max(prompt_len - (self.last_k or 0), 0)}[
            self.token_scope
        ]
        layer_index, preserve = self._layer, self.use_norm_preservation
        state = {"start": 0}

        def read_start(module: torch.nn.Module, args: tuple, hook_kwargs: dict) -> None:
            state["start"] = past_length(hook_kwargs, layer_index)

        def add_vector(module: torch.nn.Module, args: tuple, hook_kwargs: dict, output: Any) -> Any:
            hidden = output_hidden(output)
            first = max(threshold - state["start"], 0)
            if first >= hidden.shape[1]:
                return None
            delta = self._delta(hidden)
            tail = hidden[:, first:]
            steered = tail + delta
            if preserve:
                steered = preserve_norm(tail, steered)
            if first:
                steered = torch.cat([hidden[:, :first], steered], dim=1)
            return with_output_hidden(output, steered)

        path = self._layout.layer_path(self._layer)
        return {
            "pre": [{"module": path, "hook_func": read_start}],
            "forward": [{"module": path, "hook_func": add_vector}],
        }


def _as_direction(tensor: torch.Tensor) -> torch.Tensor:
    """One `[hidden]` direction (a `[1, hidden]` block is accepted); positional blocks are refused."""
    direction = tensor[0] if tensor.dim() == 2 and tensor.shape[0] == 1 else tensor
    if direction.dim() != 1:
        raise ValueError(
            f"CAA.steering_vector must be one direction [hidden]; got shape {tuple(tensor.shape)}. "
            "Positional [positions, hidden] blocks belong to ActAdd."
        )
    return direction


# ---------------------------------------------------------------------- fitting
def validate_token_scope(owner: str, token_scope: str, last_k: int | None) -> None:
    """`last_k` is an int >= 1 exactly when `token_scope` is `last_k` (the scope rule CAA and ablation share)."""
    if token_scope == "last_k" and (last_k is None or last_k < 1):
        raise ValueError(f"{owner}.last_k must be an int >= 1 with token_scope='last_k'; got {last_k!r}.")
    if token_scope != "last_k" and last_k is not None:
        raise ValueError(
            f"{owner}.last_k={last_k} is only used with token_scope='last_k'; got token_scope={token_scope!r}. "
            "Fix: drop last_k or set token_scope='last_k'."
        )


def validate_vector_source(
    owner: str,
    field: str,
    vector: Any,
    data: Sequence[Mapping[str, Any]] | None,
    *,
    what: str,
    layer_id: int | None = None,
    acted: str | None = None,
) -> None:
    """Exactly one of a given vector (`field`: `what` it is) and contrastive pairs to fit one (`data`, well formed).
    With `acted` (what the control does to its `layers`), a given vector's `layer_id` is refused: that is the layer
    a fit reads, and a given vector is not fitted."""
    if (vector is None) == (data is None):
        raise ValueError(
            f"{owner} needs exactly one of {field}= ({what} or a saved file) and data= (contrastive pairs to fit one); "
            f"got {'both' if data is not None else 'neither'}."
        )
    if data is not None:
        validate_pairs(data, f"{owner}.data")
    elif acted is not None and layer_id is not None:
        raise ValueError(
            f"{owner}.layer_id={layer_id} is the layer a direction is fitted at; a given {field} is not fitted. "
            f"Fix: drop layer_id (the {acted} layers are `layers`)."
        )


def validate_layers(owner: str, layers: Sequence[int] | None, default: str) -> None:
    """`layers` lists distinct decoder layer indices >= 0, or is None (`default`: what None stands for)."""
    if layers is not None and (not layers or min(layers) < 0 or len(set(layers)) != len(layers)):
        raise ValueError(
            f"{owner}.layers must list distinct decoder layer indices >= 0, or be null for {default}; "
            f"got {list(layers)}."
        )


def validate_pairs(pairs: Sequence[Mapping[str, Any]], field_name: str) -> None:
    """Raise ValueError naming the first malformed contrastive pair."""
    if not pairs:
        raise ValueError(f"{field_name} is empty; give at least one contrastive pair.")
    for i, pair in enumerate(pairs):
        if not isinstance(pair, Mapping):
            raise ValueError(f"{field_name}[{i}] must be a mapping with 'positive' and 'negative'; got {pair!r}.")
        for key in ("positive", "negative"):
            if not isinstance(pair.get(key), str) or not pair[key]:
                raise ValueError(f"{field_name}[{i}] needs a non-empty string {key!r}; got {pair.get(key)!r}.")
        prompt = next((pair[k] for k in _PROMPT_KEYS if k in pair), None)
        if prompt is not None and not isinstance(prompt, str):
            raise ValueError(f"{field_name}[{i}] prompt must be a string; got {prompt!r}.")


def render_pair_side(tokenizer: Any, pair: Mapping[str, Any], side: str, prompt_format: str) -> list[int]:
    """Token ids of one side of a pair: the prompt (chat-templated when asked and possible) plus the answer."""
    return render_pair_split(tokenizer, pair, side, prompt_format)[0]


def render_pair_split(tokenizer: Any, pair: Mapping[str, Any], side: str, prompt_format: str) -> tuple[list[int], int]:
    """`(ids, n_prompt)`: one side's token ids and how many of them come before the answer."""
    prompt = next((pair[k] for k in _PROMPT_KEYS if pair.get(k) is not None), None)
    answer = pair[side]
    if prompt is not None and prompt_format == "chat" and has_chat_template(tokenizer):
        head = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        n_prompt = len(tokenizer(head, add_special_tokens=False)["input_ids"])
        return list(tokenizer(head + answer, add_special_tokens=False)["input_ids"]), n_prompt
    if prompt is None:
        ids = list(tokenizer(answer)["input_ids"])
        return ids, len(ids) - len(tokenizer(answer, add_special_tokens=False)["input_ids"])
    n_prompt = len(tokenizer(prompt)["input_ids"])
    return list(tokenizer(prompt + answer)["input_ids"]), n_prompt


# In-process memo of fitted vectors: the jobs of a sweep (one process under the basic launcher) reload the same
# model and would refit the same vector for every strength and sanity arm. Keyed by the model's fingerprint (config
# and name; every weight for small models), the tokenizer, the layer and the pairs' content.
_FITTED: dict[str, SteeringVector] = {}
_FITTED_MAX = 16


def _fit_key(
    model: torch.nn.Module, tokenizer: Any, layer: int, data: Any, prompt_format: str, accumulate: str
) -> str | None:
    """The memo key of a fit, or None when the pairs have no content form (then the fit is not memoized)."""
    if not isinstance(data, Sequence):  # an iterator would be consumed by the key
        return None
    try:
        pairs = canonical_value(list(data))
    except TypeError:
        return None
    tokenizer_id = [getattr(tokenizer, "name_or_path", None), getattr(tokenizer, "chat_template", None)]
    return canonical_json([model_fingerprint(model), tokenizer_id, layer, pairs, prompt_format, accumulate])


def fitted_mean_difference(
    model: torch.nn.Module,
    tokenizer: Any,
    layout: ModelLayout,
    layer: int,
    pairs: Sequence[Mapping[str, Any]],
    prompt_format: str,
    batch_size: int,
    accumulate: str = "last_token",
) -> SteeringVector:
    """`fit_mean_difference` through the in-process memo (`_FITTED`): every control that fits from pairs shares it."""
    key = _fit_key(model, tokenizer, layer, pairs, prompt_format, accumulate)
    if key is not None and key in _FITTED:
        logger.info("Mean-difference vector reused: fitted earlier in this process on the same model, layer and pairs")
        return _FITTED[key]
    vector = fit_mean_difference(model, tokenizer, layout, layer, pairs, prompt_format, batch_size, accumulate)
    if key is not None:
        _FITTED[key] = vector
        while len(_FITTED) > _FITTED_MAX:
            _FITTED.pop(next(iter(_FITTED)))
    return vector


def fit_mean_difference(
    model: torch.nn.Module,
    tokenizer: Any,
    layout: ModelLayout,
    layer: int,
    pairs: Sequence[Mapping[str, Any]],
    prompt_format: str,
    batch_size: int,
    accumulate: str = "last_token",
) -> SteeringVector:
    """Mean over pairs of (positive - negative) layer-`layer` outputs, in float32.

    Each side contributes its last token (`last_token`) or the mean over its answer tokens (`completion`; never
    position 0). The median L2 norm of the layer's output over every answer token of both sides is recorded as
    `metadata["median_norm"]`.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    sides, norms = {}, []
    for side in ("positive", "negative"):
        rendered = [render_pair_split(tokenizer, pair, side, prompt_format) for pair in pairs]
        batches, spans = [], []
        for start in range(0, len(rendered), batch_size):
            chunk = rendered[start : start + batch_size]
            ids, mask = pad_left([r[0] for r in chunk], pad)
            batches.append({"input_ids": ids, "attention_mask": mask})
            # answer tokens are the last len(ids) - max(n_prompt, 1) columns of each left-padded row
            spans.append([len(r[0]) - max(r[1], 1) for r in chunk])
        hidden = capture_layer(model, layout.layer_path(layer), batches, boundary="output", reduce=lambda h, m: h)
        rows = []
        for block, lengths in zip(hidden, spans, strict=True):
            for row, length in enumerate(lengths):
                if length < 1:
                    raise ValueError(f"CAA.data: a pair's {side!r} answer has no token after its prompt.")
                answer = block[row, -length:]
                norms.append(answer.norm(dim=-1))
                rows.append(answer[-1] if accumulate == "last_token" else answer.mean(dim=0))
        sides[side] = torch.stack(rows).mean(dim=0)
    vector = (sides["positive"] - sides["negative"]).cpu()
    metadata = {
        "method": "mean_diff",
        "accumulate": accumulate,
        "location": "layer_output",
        "pairs": len(pairs),
        "prompt_format": prompt_format,
        "median_norm": float(torch.cat(norms).median()),
        "model": str(getattr(getattr(model, "config", None), "_name_or_path", "") or ""),
    }
    return SteeringVector(vector, layer, metadata)
