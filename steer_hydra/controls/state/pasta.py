"""PASTA (Zhang et al. 2023): shift pre-softmax attention scores of chosen heads toward highlighted prompt spans.

How it runs: `steer()` registers an attention function (and the matching mask function, so padded batches keep
their mask) with transformers' attention interface under `steer_hydra_pasta_<original>` and switches the model
to it; `cleanup()` switches back. The function delegates to the original implementation (`sdpa` or the model's
own `eager`) unchanged unless a call is active: `get_hooks()` returns a HookSet whose `context` entry publishes the
call's per-row column biases in a ContextVar for the duration of that call only, and whose `pre` hooks on the
selected attention modules note which absolute columns their keys cover (sliding-window caches hold only the
last positions). For the selected (layer, heads), the bias is added to the attention logits: with `sdpa` as
sdpa's additive `position_bias`, with `eager` folded into the additive mask. Other layers, other heads, and
calls without PASTA data take the original path.

Scale positions (shift = log(alpha), added to the logits of prompt columns, so weights scale by alpha):
- `include`: non-span prompt columns get `-log(alpha)` (use alpha > 1: the spans gain attention);
- `exclude`: non-span prompt columns get `+log(alpha)` (use alpha < 1: everything else loses attention);
- `generation`: every real prompt column gets `+log(alpha)` (prompt vs. generated tokens; no substrings needed).
A row whose substrings are all missing is left unsteered under `include` and `exclude`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from steer_hydra.controls.state.residual import past_length
from steer_hydra.controls.state.spans import substrings_per_row, token_spans
from steer_hydra.core.controls import BaseArgs, HookSet, StateControl
from steer_hydra.core.layout import ModelLayout, resolve_layout

IMPLEMENTATION_PREFIX = "steer_hydra_pasta_"
SUPPORTED_IMPLEMENTATIONS = ("eager", "sdpa")

_ACTIVE: ContextVar[tuple[PastaCall, ...]] = ContextVar("steer_hydra_pasta_calls", default=())


def active_calls() -> tuple[PastaCall, ...]:
    """The PASTA calls active in this context (empty outside a steered generate call)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def _activated(call: PastaCall) -> Iterator[None]:
    token = _ACTIVE.set((*_ACTIVE.get(), call))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


class PastaCall:
    """One call's steering data: per-row column biases `[batch, prompt_len]` and the targeted attention modules.

    `bias_for(module, query, key)` returns the additive logit bias `[batch, heads, 1, kv_len]` for a targeted
    module (zero on unselected heads and on columns past the prompt), or None for any other module.

    Which absolute columns the keys cover: a pre-hook on each targeted module (`record_query_end`) notes where
    this forward's queries end (cached positions plus new ones). Keys then cover `[end - kv_len, end)`, which is
    right for full-attention caches (`kv_len == end`) and for sliding-window caches holding only the last
    positions; when there are at least `end` keys (a static cache, or no record) they start at column 0.
    """

    __slots__ = ("columns", "targets", "_buffers", "_ends")

    def __init__(self, columns: torch.Tensor, targets: Mapping[int, tuple[int, ...]], num_heads: int) -> None:
        self.columns = columns
        self.targets = {key: _head_weights(heads, num_heads) for key, heads in targets.items()}
        self._buffers: dict[tuple, torch.Tensor] = {}
        self._ends: dict[int, int] = {}

    def record_query_end(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        """Forward pre-hook on a targeted attention module: remember where this forward's queries end."""
        hidden = args[0] if args else kwargs.get("hidden_states")
        layer_index = getattr(module, "layer_idx", None)
        if hidden is None or layer_index is None:
            return
        self._ends[id(module)] = past_length(kwargs, layer_index) + hidden.shape[1]

    def bias_for(self, module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor | None:
        heads = self.targets.get(id(module))
        if heads is None:
            return None
        batch, kv_len = query.shape[0], key.shape[-2]
        end = self._ends.get(id(module), kv_len)
        start = end - kv_len if end > kv_len else 0
        cache_key = (id(heads), batch, query.dtype, query.device)
        buffer = self._buffers.get(cache_key)
        if buffer is None or buffer.shape[-1] < start + kv_len:
            grown = 2 * buffer.shape[-1] if buffer is not None else self.columns.shape[1] + 64
            buffer = self._build(heads, batch, max(start + kv_len, grown), query.dtype, query.device)
            self._buffers[cache_key] = buffer
        return buffer[..., start : start + kv_len]

    def _build(
        self, heads: torch.Tensor, batch: int, capacity: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        columns = self.columns
        if batch != columns.shape[0]:
            if batch % columns.shape[0]:
                raise RuntimeError(
                    f"PASTA prepared {columns.shape[0]} prompt rows but attention sees batch {batch}; "
                    "build the hooks on the batch that is generated."
                )
            columns = columns.repeat_interleave(batch // columns.shape[0], dim=0)
        width = min(columns.shape[1], capacity)
        padded = torch.zeros(batch, capacity, dtype=torch.float32, device=columns.device)
        padded[:, :width] = columns[:, :width]
        bias = padded[:, None, None, :] * heads.to(columns.device)[None, :, None, None]
        return bias.to(device=device, dtype=dtype)


def _head_weights(heads: tuple[int, ...], num_heads: int) -> torch.Tensor:
    weights = torch.zeros(num_heads, dtype=torch.float32)
    weights[list(heads)] = 1.0
    return weights


# ---------------------------------------------------------------------- the attention function
def _attention_for(original: str) -> Callable[..., Any]:
    """The registered attention function for models whose original implementation is `original`."""

    def attention(
        module: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None
        for call in _ACTIVE.get():
            extra = call.bias_for(module, query, key)
            if extra is not None:
                bias = extra if bias is None else bias + extra
        if original == "sdpa":
            sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
            if bias is None:
                return sdpa(module, query, key, value, attention_mask, **kwargs)
            prior = kwargs.pop("position_bias", None)
            if prior is not None:
                bias = bias + prior
            return sdpa(module, query, key, value, attention_mask, position_bias=bias, **kwargs)
        eager = _eager_for(type(module))
        if bias is None:
            return eager(module, query, key, value, attention_mask, **kwargs)
        return eager(module, query, key, value, _additive_mask(attention_mask, query, key) + bias, **kwargs)

    attention.__name__ = f"pasta_{original}_attention"
    return attention


@functools.cache
def _eager_for(module_type: type) -> Callable[..., Any]:
    """The model's own `eager_attention_forward` (what `eager` runs for this module), else a generic one."""
    found = getattr(sys.modules.get(module_type.__module__), "eager_attention_forward", None)
    return found if callable(found) else _generic_eager


def _generic_eager(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = scaling if scaling is not None else query.shape[-1] ** -0.5
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask[..., : key.shape[-2]]
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _additive_mask(attention_mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """An additive float mask equivalent to `attention_mask` (None means causal, aligned to the last key)."""
    minimum = torch.finfo(query.dtype).min
    if attention_mask is None:
        q_len, kv_len = query.shape[2], key.shape[2]
        rows = torch.arange(q_len, device=query.device)[:, None] + (kv_len - q_len)
        allowed = torch.arange(kv_len, device=query.device)[None, :] <= rows
        return torch.where(allowed, 0.0, minimum).to(query.dtype)[None, None]
    if attention_mask.dtype == torch.bool:
        return torch.where(attention_mask, 0.0, minimum).to(query.dtype)
    return attention_mask.to(query.dtype)


def implementation_name(original: str) -> str:
    """Register (once) and return the attention implementation name that wraps `original`."""
    name = IMPLEMENTATION_PREFIX + original
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _attention_for(original))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[original])
    return name


def implementation_verdict(implementation: str) -> str:
    """Why PASTA cannot run on `implementation`, and the fix."""
    reason = (
        "flash attention ignores additive attention masks, so PASTA's score bias would be dropped"
        if "flash" in implementation
        else f"PASTA edits attention scores only through {' or '.join(SUPPORTED_IMPLEMENTATIONS)}"
    )
    return (
        f"attn_implementation={implementation!r} is not supported: {reason}. "
        "Fix: load the model with hf_model_kwargs={'attn_implementation': 'sdpa'} (or 'eager')."
    )


# ---------------------------------------------------------------------- the control
class PASTA(StateControl):
    """Post-hoc attention steering (Zhang et al. 2023, arXiv 2311.02262) on highlighted prompt substrings.

    Args:
        head_config: layers whose every head is steered (`[10, 11]`), or `{layer: [heads]}`.
        alpha: attention scale factor (> 0); the logit shift is log(alpha), so 1.0 does nothing.
        scale_position: `include`, `exclude` or `generation` (see the module docstring).
        substrings: default substrings for every row when the call brings no `substrings` runtime kwarg.

    Runtime kwarg `substrings` (row scope): a str for every row, a list[list[str]] with one list per row,
    or a flat list[str] at batch size 1. Each substring's first occurrence in the templated prompt is
    highlighted; a substring that is not found warns once and is skipped.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        head_config: Sequence[int] | Mapping[Any, Sequence[int]] = (0, 1)
        alpha: float = 1.0
        scale_position: Literal["include", "exclude", "generation"] = "exclude"
        substrings: Sequence[str] | None = None

        def validate(self) -> None:
            if not (math.isfinite(self.alpha) and self.alpha > 0):
                raise ValueError(
                    f"PASTA.alpha must be a finite number > 0 (the logit shift is log(alpha)); got {self.alpha!r}. "
                    "Use alpha > 1 with scale_position='include', alpha < 1 with 'exclude'."
                )
            normalize_head_config(self.head_config)

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": "substrings",
            "type": "list[str]",
            "required": True,
            "scope": "row",
            "help": "prompt substrings whose attention PASTA steers (one list per row)",
        }
    ]
    supports_batching = True
    supports_refill = True  # spans come from the mask of the prompt layout it is given (see backends.refill)

    def _configure(self) -> None:
        self._heads = normalize_head_config(self.head_config)
        self._layout: ModelLayout | None = None
        self._targets: dict[str, tuple[int, ...]] = {}
        self._module_ids: dict[int, dict[int, tuple[int, ...]]] = {}
        self._restore: tuple[torch.nn.Module, str, str] | None = None
        self._warned: set[str | None] = set()  # None: the "no substrings at all" warning

    # ------------------------------------------------------------------ check / steer / cleanup
    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        implementation = hf_model_kwargs.get("attn_implementation")
        if implementation is None or implementation in SUPPORTED_IMPLEMENTATIONS:
            return []
        return [implementation_verdict(str(implementation))]

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError("PASTA needs the live model in this process; use backend=huggingface.")
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None or not getattr(tokenizer, "is_fast", False):
            raise ValueError(
                "PASTA maps substrings to tokens through a fast tokenizer's offset mapping; "
                f"got {type(tokenizer).__name__}. Load the tokenizer with use_fast=True."
            )
        self.tokenizer = tokenizer
        current = str(getattr(model.config, "_attn_implementation", None) or "sdpa")
        original = current.removeprefix(IMPLEMENTATION_PREFIX)
        if original not in SUPPORTED_IMPLEMENTATIONS:
            raise ValueError(implementation_verdict(original))
        layout = resolve_layout(model)
        self._targets = self._resolve_targets(layout)
        name = implementation_name(original)
        if current != name:
            model.set_attn_implementation(name)
            if model.config._attn_implementation != name:
                raise RuntimeError(
                    f"{type(model).__name__} did not accept attention implementation {name!r}; PASTA needs a model "
                    "that dispatches attention through transformers' AttentionInterface."
                )
            self._restore = (model, current, name)
        self._layout = layout
        self._module_ids.clear()
        return None

    def cleanup(self) -> None:
        if self._restore is not None:
            model, previous, name = self._restore
            self._restore = None
            if model.config._attn_implementation == name:
                model.set_attn_implementation(previous)
        self._layout = None
        self._module_ids.clear()

    def _resolve_targets(self, layout: ModelLayout) -> dict[str, tuple[int, ...]]:
        targets: dict[str, tuple[int, ...]] = {}
        for layer, heads in self._heads.items():
            if not 0 <= layer < layout.num_layers:
                raise ValueError(
                    f"PASTA.head_config names layer {layer}, but the model has {layout.num_layers} layers "
                    f"(0..{layout.num_layers - 1})."
                )
            chosen = tuple(range(layout.num_heads)) if heads is None else heads
            bad = [h for h in chosen if not 0 <= h < layout.num_heads]
            if bad:
                raise ValueError(
                    f"PASTA.head_config names heads {bad} of layer {layer}, but layers have {layout.num_heads} "
                    f"heads (0..{layout.num_heads - 1})."
                )
            targets[layout.attention_path(layer)] = chosen
        return targets

    # ------------------------------------------------------------------ per call
    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        if self._layout is None:
            raise RuntimeError("PASTA.get_hooks called before steer(); steer the pipeline first.")
        shift = math.log(self.alpha)
        if shift == 0.0:
            return {}
        batch, width = input_ids.shape
        mask = kwargs.get("attention_mask")
        mask = torch.ones_like(input_ids) if mask is None else mask.to(input_ids.device)
        if self.scale_position == "generation":
            columns = mask.to(torch.float32) * shift
        else:
            columns = self._span_columns(input_ids, mask, runtime_kwargs, shift)
        if not bool(columns.any()):
            return {}
        model = kwargs.get("model")
        targets = self._module_targets(model)
        call = PastaCall(columns, targets, self._layout.num_heads)
        return {
            "pre": [{"module": path, "hook_func": call.record_query_end} for path in self._targets],
            "context": [functools.partial(_activated, call)],
        }

    def _span_columns(
        self, input_ids: torch.Tensor, mask: torch.Tensor, runtime_kwargs: Mapping[str, Any], shift: float
    ) -> torch.Tensor:
        batch, width = input_ids.shape
        value = runtime_kwargs.get("substrings")
        if value is None:
            if self.substrings is None:
                self._warn_no_substrings()
                return torch.zeros(batch, width, dtype=torch.float32, device=input_ids.device)
            value = [list(self.substrings)] * batch
        rows = substrings_per_row(value, batch)
        fill = -shift if self.scale_position == "include" else shift
        columns = torch.zeros(batch, width, dtype=torch.float32, device=input_ids.device)
        found: dict[tuple, list[range]] = {}
        for i in range(batch):
            real = mask[i].nonzero().flatten()
            ids = input_ids[i, real].tolist()
            memo_key = (tuple(ids), tuple(rows[i]))
            if memo_key not in found:
                spans, missing = token_spans(self.tokenizer, ids, rows[i])
                self._warn_missing(missing)
                found[memo_key] = spans
            spans = found[memo_key]
            if not spans:
                continue
            outside = torch.ones(len(ids), dtype=torch.bool, device=input_ids.device)
            for span in spans:
                outside[span.start : span.stop] = False
            columns[i, real[outside]] = fill
        return columns

    def _warn_no_substrings(self) -> None:
        if None not in self._warned:
            self._warned.add(None)
            warnings.warn(
                "PASTA got no substrings for this call, so these rows are left unsteered (a task without per-sample "
                "substrings, e.g. a catalog benchmark). Give them per sample (Sample.metadata['runtime_kwargs'] with "
                "runtime_kwargs_solver), statically (provider.runtime_kwargs.substrings) or as PASTA(substrings=...).",
                stacklevel=4,
            )

    def _warn_missing(self, missing: Sequence[str]) -> None:
        for substring in missing:
            if substring not in self._warned:
                self._warned.add(substring)
                warnings.warn(
                    f"PASTA: substring {substring!r} was not found in the prompt; it is skipped.", stacklevel=4
                )

    def _module_targets(self, model: Any) -> dict[int, tuple[int, ...]]:
        if model is None:
            raise RuntimeError("PASTA.get_hooks needs model= (the pipeline passes the live model).")
        cached = self._module_ids.get(id(model))
        if cached is None:
            cached = {id(model.get_submodule(path)): heads for path, heads in self._targets.items()}
            self._module_ids = {id(model): cached}
        return cached


def normalize_head_config(head_config: Any) -> dict[int, tuple[int, ...] | None]:
    """`{layer: heads}` (None = every head) from a list of layers or a mapping; raise naming the bad entry."""
    fix = "Use a list of layer indices (all heads) or a mapping {layer: [head, ...]}."
    if isinstance(head_config, Mapping):
        items = list(head_config.items())
    elif isinstance(head_config, (list, tuple)):
        items = [(layer, None) for layer in head_config]
    else:
        raise TypeError(f"PASTA.head_config must be a list of layers or a mapping; got {head_config!r}. {fix}")
    if not items:
        raise ValueError(f"PASTA.head_config is empty; it must name at least one layer. {fix}")
    out: dict[int, tuple[int, ...] | None] = {}
    for layer, heads in items:
        index = _as_index(layer)
        if index is None:
            raise ValueError(f"PASTA.head_config has layer {layer!r}; layers are non-negative integers. {fix}")
        if heads is None or heads == "all":
            out[index] = None
            continue
        if isinstance(heads, int) and not isinstance(heads, bool):
            heads = [heads]
        if not isinstance(heads, (list, tuple)) or not heads:
            raise ValueError(f"PASTA.head_config[{layer!r}] must be a non-empty list of head indices; got {heads!r}.")
        parsed = [_as_index(h) for h in heads]
        if any(h is None for h in parsed):
            raise ValueError(f"PASTA.head_config[{layer!r}] has a head that is not a non-negative integer: {heads!r}.")
        out[index] = tuple(sorted(set(parsed)))
    return out


def _as_index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
