"""The Hugging Face executor of `ResidualAddition` edits (controls/state/edits.py): what it refuses, that its hooks
live only during a call for every control built on it, and that a gate it never decided refuses to guess."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAST, ITI, ActivationAdapter, AngularSteering
from steer_hydra.controls.state.edits import check_edits, edit_hooks, heads_path, site_paths
from steer_hydra.core.controls import ResidualAddition
from steer_hydra.core.layout import resolve_layout

ROW = torch.ones(1, 64)
CONTROLS = {
    "iti": lambda: ITI(directions=torch.ones(2, 4, 16), alpha=1.0, strength_unit="absolute"),
    "cast": lambda: CAST(steering_vector=torch.ones(64), condition_vector=torch.ones(64), threshold=0.0),
    "angular": lambda: AngularSteering(steering_vector=torch.ones(64), angle=45.0),
    "adapter": lambda: ActivationAdapter(vector=torch.ones(64), layers=[0, 1], sites=["input", "attention", "output"]),
}


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_hooks_live_only_during_a_call(make_pipeline, count_hooks, name):
    pipeline = make_pipeline([CONTROLS[name]()])
    model = pipeline.model
    seen = []
    handle = model.get_submodule("model.norm").register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(count_hooks(model) - 1), with_kwargs=True
    )
    try:
        pipeline.generate(text=["hello there", "count one two"], max_new_tokens=3)
    finally:
        handle.remove()
    assert seen and all(n > 0 for n in seen) and count_hooks(model) == 0


def test_refusals_name_what_runs_elsewhere():
    with pytest.raises(ValueError, match="positional blocks are ActAdd's edits. Fix: use ActAdd"):
        check_edits([ResidualAddition(0, "input", "block", ROW, "position")], "X")
    with pytest.raises(ValueError, match="gated by 'g', which no condition edit decides"):
        check_edits([ResidualAddition(0, "output", "from", ROW, "after_prompt", gate="g")], "X")
    condition = ResidualAddition(0, "output", "condition", ROW, "after_prompt", gate="g")
    with pytest.raises(ValueError, match="a gated edit must act after the prompt"):
        check_edits([condition, ResidualAddition(1, "output", "from", ROW, "all", gate="g")], "X")
    check_edits([condition, ResidualAddition(1, "output", "from", ROW, "after_prompt", gate="g")], "X")


def test_a_gate_never_decided_refuses_to_guess(tiny):
    model, _ = tiny
    layout = resolve_layout(model)
    edits = [
        ResidualAddition(0, "output", "condition", ROW / 8, "after_prompt", gate="g"),
        ResidualAddition(1, "output", "from", ROW, "after_prompt", gate="g"),
    ]
    hooks = edit_hooks(edits, site_paths(model, layout, edits), torch.tensor([[1, 50, 60]]))
    with torch.no_grad(), pytest.raises(RuntimeError, match="gate 'g' was not decided.*Fix"):
        handles = [model.get_submodule(s["module"]).register_forward_pre_hook(s["hook_func"], with_kwargs=True)
                   for s in hooks["pre"]]  # fmt: skip
        handles += [model.get_submodule(s["module"]).register_forward_hook(s["hook_func"], with_kwargs=True)
                    for s in hooks["forward"]]  # fmt: skip
        try:  # a decode step (the cache says 3 positions are past) without the prefill that decides the gate
            model(input_ids=torch.tensor([[70]]), cache_position=torch.tensor([3]))
        finally:
            for handle in handles:
                handle.remove()


def test_an_attention_without_an_output_projection_is_named(tiny):
    model, _ = tiny
    layout = resolve_layout(model)
    attention = model.get_submodule(layout.attention_path(0))
    attention.renamed = attention.o_proj
    del attention.o_proj
    with pytest.raises(ValueError, match="has no output projection named one of .* Fix"):
        heads_path(model, layout, 0)
