"""`ResidualAddition` edits run as Hugging Face hooks: the in-process executor of ITI, CAST, angular steering and
ActivationAdapter (the vLLM worker plugin runs the same edits inside the engine).

A control whose effect is a list of edits (`residual_edits()`) gets its hooks for one call from `edit_hooks`, so
what runs on Hugging Face is, edit for edit, what an engine backend lowers. Sites, per decoder layer, in the
order a layer's forward reaches them: `input` (a forward pre-hook on the layer, which also reads where this
forward starts: the KV cache's length), `attention` (a forward hook on the attention module: its output before
it joins the stream), `heads` (a forward pre-hook on the attention's output projection: its input, one
`head_dim` slice per head) and `output` (a forward hook on the layer). Edits at one site apply in list order.

How it runs (one call): prompts are left-packed to width W. An edit's first steered column is W for
`after_prompt`, 0 for `all`, `max(W - last_k, 0)` for `last_k` (CAA's columns: one threshold for every row);
a forward covering absolute columns `[past, past + window)` edits its columns from there on, out of place:
- `from`: `x + rows[0]` (then rescaled to the original norm with `preserve_norm`): exactly CAA's arithmetic;
- `project`: `x - (x . r) r`: exactly DirectionalAblation's;
- `rotate` / `rotate_to`: `steer_hydra.core.edits.rotate_in_plane` in the plane of rows 0 and 1;
- `condition`: nothing is edited; on the forward that starts at column 0 (the prefill), the mean of each row's
  real prompt positions (the attention mask's) decides the row's gate (`steer_hydra.core.edits`);
- a gated edit keeps a row as it was unless its gate is open (`torch.where`: an open row gets exactly what the
  ungated edit gives it). Gated edits act after the prompt, so the prefill has decided every gate by then.
Rows repeated for `n` candidates (a batch that is a multiple of the prompt rows) share their prompt row's gate.
Positional blocks (`block`, ActAdd's) are not run here: ActAdd has its own hooks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from steer_hydra.controls.state.residual import (
    input_hidden,
    output_hidden,
    past_length,
    preserve_norm,
    with_input_hidden,
    with_output_hidden,
)
from steer_hydra.core.controls import HookSet, ResidualAddition
from steer_hydra.core.edits import condition_similarity, gate_open, rotate_in_plane
from steer_hydra.core.layout import ModelLayout, resolve_layout

SITES = ("input", "attention", "heads", "output")
# names of an attention module's output projection (Llama/Qwen/Mistral, BART/OPT, GPT-NeoX/Phi, GPT-2, T5-style)
_OUTPUT_PROJECTIONS = ("o_proj", "out_proj", "dense", "c_proj", "wo")


def heads_path(model: torch.nn.Module, layout: ModelLayout, layer: int) -> str:
    """Dotted path of layer `layer`'s attention output projection, whose input holds the heads' outputs side by
    side (`[..., num_heads * head_dim]`); raises naming the fix when the attention module has none."""
    attention_path = layout.attention_path(layer)
    attention = model.get_submodule(attention_path)
    for name in _OUTPUT_PROJECTIONS:
        if isinstance(getattr(attention, name, None), torch.nn.Module):
            return f"{attention_path}.{name}"
    raise ValueError(
        f"{type(attention).__name__} at {attention_path!r} has no output projection named one of "
        f"{_OUTPUT_PROJECTIONS}, so its heads' outputs cannot be edited. Fix: use a model whose attention projects "
        "its heads through one of those modules (Llama, Qwen, Mistral, Gemma, GPT-NeoX, GPT-2 families)."
    )


def site_paths(model: torch.nn.Module, layout: ModelLayout, edits: Sequence[ResidualAddition]) -> dict[tuple, str]:
    """`{(layer, site): module path}` of every site the edits touch, and `(layer, "layer")`: the decoder layer of
    each (its pre-hook reads where a forward starts)."""
    paths: dict[tuple, str] = {}
    for edit in edits:
        paths[(edit.layer, "layer")] = layout.layer_path(edit.layer)
        key = (edit.layer, edit.site)
        if key in paths:
            continue
        if edit.site in ("input", "output"):
            paths[key] = layout.layer_path(edit.layer)
        elif edit.site == "attention":
            paths[key] = layout.attention_path(edit.layer)
        elif edit.site == "heads":
            paths[key] = heads_path(model, layout, edit.layer)
        else:
            raise ValueError(f"Unknown edit site {edit.site!r}; sites are {SITES}.")
    return paths


def check_edits(edits: Sequence[ResidualAddition], owner: str) -> None:
    """Refuse what this executor does not run: positional blocks, and gates decided nowhere or acting on the
    prompt."""
    decided = {e.gate for e in edits if e.mode == "condition"}
    for edit in edits:
        if edit.mode == "block" or edit.scope == "position":
            raise ValueError(f"{owner}: positional blocks are ActAdd's edits. Fix: use ActAdd for them.")
        if edit.mode == "condition" and not edit.gate:
            raise ValueError(f"{owner}: a condition edit must name the gate it decides.")
        if edit.mode != "condition" and edit.gate is not None:
            if edit.gate not in decided:
                raise ValueError(f"{owner}: an edit is gated by {edit.gate!r}, which no condition edit decides.")
            if edit.scope != "after_prompt":
                raise ValueError(
                    f"{owner}: a gated edit must act after the prompt (token_scope='after_prompt'): the gate is "
                    "decided from the whole prompt, so it cannot steer the prompt itself."
                )


class CompiledEdits:
    """What a state control whose whole effect is a fixed list of edits compiled at `steer()` shares (ITI, CAST,
    angular steering, ActivationAdapter): `steer()` reads the model's layout with `_steered_layout(model)` and ends
    with `_bind_edits(model, layout, edits)`; then `residual_edits()` is what an engine backend lowers and
    `get_hooks()` runs the same edits as Hugging Face hooks. The control's `_configure` sets `_edits = None` (not
    steered yet) and `_paths = {}`."""

    _edits: tuple[ResidualAddition, ...] | None
    _paths: dict[tuple, str]

    def _steered_layout(self, model: torch.nn.Module | None) -> ModelLayout:
        """The layout of the model `steer()` is given; refused when the backend keeps no model in this process (a
        fit to do runs on the Hugging Face model of an engine's checkpoint, so vLLM qualifies)."""
        if model is None:
            raise RuntimeError(
                f"{type(self).__name__} needs the model in this process. Fix: use backend=huggingface or vllm."
            )
        return resolve_layout(model)

    def _bind_edits(self, model: torch.nn.Module, layout: ModelLayout, edits: tuple[ResidualAddition, ...]) -> None:
        """Check `edits`, find their modules and keep both (the control is steered from here on)."""
        check_edits(edits, type(self).__name__)
        self._paths = site_paths(model, layout, edits) if edits else {}
        self._edits = edits

    def residual_edits(self) -> tuple[ResidualAddition, ...]:
        """The edits compiled at `steer()`, in application order: exactly what the hooks make."""
        if self._edits is None:
            raise RuntimeError(f"{type(self).__name__}.residual_edits called before steer(); steer the pipeline first.")
        return self._edits

    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        edits = self.residual_edits()
        return edit_hooks(edits, self._paths, input_ids, kwargs.get("attention_mask"), owner=type(self).__name__)


class _Call:
    """One call's state: where each layer's forward starts, the gates decided on the prefill, rows per device."""

    def __init__(self, owner: str, width: int, mask: torch.Tensor) -> None:
        self.owner = owner
        self.width = width
        self.mask = mask
        self.starts: dict[int, int] = {}
        self.gates: dict[str, torch.Tensor] = {}  # gate name -> open, one bool per prompt row
        self._rows: dict[tuple, torch.Tensor] = {}

    def first_column(self, edit: ResidualAddition) -> int:
        if edit.scope == "after_prompt":
            return self.width
        if edit.scope == "last_k":
            return max(self.width - edit.last_k, 0)
        return 0

    def rows(self, edit: ResidualAddition, like: torch.Tensor) -> torch.Tensor:
        key = (id(edit), like.device, like.dtype)
        rows = self._rows.get(key)
        if rows is None:
            rows = self._rows[key] = edit.rows.to(device=like.device, dtype=like.dtype)
        return rows

    def per_row(self, values: torch.Tensor, rows: int) -> torch.Tensor:
        """`values` (one per prompt row) repeated for a batch of `rows` (n candidates of each prompt)."""
        if rows == values.shape[0]:
            return values
        if rows % values.shape[0]:
            raise RuntimeError(
                f"{self.owner}: hooks built for {values.shape[0]} prompt rows see a batch of {rows}; build the hooks "
                "on the batch that is generated."
            )
        return values.repeat_interleave(rows // values.shape[0], dim=0)

    def read_condition(self, edit: ResidualAddition, hidden: torch.Tensor, layer: int) -> None:
        """Decide `edit.gate` per prompt row from the mean of its real prompt positions (on the prefill only)."""
        if self.starts.get(layer, 0) != 0:
            return  # a decode step: the prompt was read on the prefill
        if hidden.shape[1] < self.width:
            raise RuntimeError(
                f"{self.owner}: the forward starting at column 0 covers {hidden.shape[1]} of the prompt's "
                f"{self.width} columns; a gate is decided on the whole prompt in one forward."
            )
        mask = self.per_row(self.mask, hidden.shape[0]).to(device=hidden.device, dtype=torch.float32)
        prompt = hidden[:, : self.width].float()
        mean = (prompt * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
        opened = gate_open(
            condition_similarity(mean, edit.rows[0].to(mean.device)), edit.threshold, edit.comparison
        ).cpu()
        repeat = hidden.shape[0] // self.mask.shape[0]
        self.gates[edit.gate] = opened[::repeat] if repeat > 1 else opened

    def apply(self, edit: ResidualAddition, hidden: torch.Tensor, layer: int) -> torch.Tensor | None:
        """`hidden` after `edit` (None when this forward has no column it edits)."""
        if edit.mode == "condition":
            self.read_condition(edit, hidden, layer)
            return None
        first = max(self.first_column(edit) - self.starts.get(layer, 0), 0)
        if first >= hidden.shape[1]:
            return None
        tail = hidden[:, first:]
        rows = self.rows(edit, hidden)
        if edit.mode == "from":
            steered = tail + rows[0]
            if edit.preserve_norm:
                steered = preserve_norm(tail, steered)
        elif edit.mode == "project":
            unit = rows[0]
            steered = tail - (tail @ unit)[..., None] * unit
        elif edit.mode in ("rotate", "rotate_to"):
            angle = torch.tensor(edit.angle, dtype=torch.float64)
            steered = rotate_in_plane(
                tail,
                rows[0],
                rows[1],
                float(torch.cos(angle)),
                float(torch.sin(angle)),
                to_angle=edit.mode == "rotate_to",
            )
        else:
            raise ValueError(f"{self.owner}: edit mode {edit.mode!r} is not run by these hooks.")
        if edit.gate is not None:
            opened = self.gates.get(edit.gate)
            if opened is None:
                raise RuntimeError(
                    f"{self.owner}: gate {edit.gate!r} was not decided: this call's prefill did not run under its "
                    "hooks. Fix: build the hooks for the call that is generated (one prefill per call)."
                )
            opened = self.per_row(opened, hidden.shape[0]).to(hidden.device)
            steered = torch.where(opened[:, None, None], steered, tail)
        return torch.cat([hidden[:, :first], steered], dim=1) if first else steered


def edit_hooks(
    edits: Sequence[ResidualAddition],
    paths: Mapping[tuple, str],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    owner: str = "edits",
) -> HookSet:
    """Hooks that make `edits` on one call of the left-packed `input_ids` (see the module docstring); `paths` from
    `site_paths`."""
    if not edits:
        return {}
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    call = _Call(owner, int(input_ids.shape[1]), mask.detach().cpu())
    at: dict[tuple[int, str], list[ResidualAddition]] = {}
    for edit in edits:
        at.setdefault((edit.layer, edit.site), []).append(edit)

    def run(layer: int, site: str, hidden: torch.Tensor) -> torch.Tensor | None:
        changed = None
        for edit in at[(layer, site)]:
            result = call.apply(edit, hidden if changed is None else changed, layer)
            if result is not None:
                changed = result
        return changed

    def layer_input(layer: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
            call.starts[layer] = past_length(kwargs, layer)
            if (layer, "input") not in at:
                return None
            changed = run(layer, "input", input_hidden(args, kwargs))
            return None if changed is None else with_input_hidden(args, kwargs, changed)

        return hook

    def after(layer: int, site: str):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            changed = run(layer, site, output_hidden(output))
            return None if changed is None else with_output_hidden(output, changed)

        return hook

    def heads_input(layer: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> Any:
            changed = run(layer, "heads", input_hidden(args, kwargs))
            return None if changed is None else with_input_hidden(args, kwargs, changed)

        return hook

    hooks: HookSet = {"pre": [], "forward": []}
    for layer in sorted({edit.layer for edit in edits}):
        hooks["pre"].append({"module": _layer_path(paths, layer), "hook_func": layer_input(layer)})
        if (layer, "attention") in at:
            hooks["forward"].append({"module": paths[(layer, "attention")], "hook_func": after(layer, "attention")})
        if (layer, "heads") in at:
            hooks["pre"].append({"module": paths[(layer, "heads")], "hook_func": heads_input(layer)})
        if (layer, "output") in at:
            hooks["forward"].append({"module": paths[(layer, "output")], "hook_func": after(layer, "output")})
    return hooks


def _layer_path(paths: Mapping[tuple, str], layer: int) -> str:
    found = paths.get((layer, "layer"))
    if found is None:
        raise KeyError(f"site_paths gave no decoder-layer path for layer {layer}; pass paths from site_paths().")
    return found
