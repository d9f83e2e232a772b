"""No steering hook outlives its call: after generate returns or raises, the model carries no hooks."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, PASTA, ActAdd
from steer_hydra.controls.state.pasta import active_calls

CONTROLS = {
    "pasta": lambda: PASTA(head_config=[0, 1], alpha=0.1, substrings=["capital"]),
    "caa": lambda: CAA(steering_vector=torch.ones(64), layer_id=0, token_scope="all"),
    "actadd": lambda: ActAdd(positive_prompt="Love", negative_prompt="Hate"),
}


@pytest.mark.parametrize("name", sorted(CONTROLS))
def test_hooks_are_gone_after_generate_returns_or_raises(make_pipeline, count_hooks, name):
    pipeline = make_pipeline([CONTROLS[name]()])
    model = pipeline.model
    (control,) = pipeline.state_controls
    seen_during = []

    def probe(module, args, kwargs):  # counts hooks (less itself) and active PASTA calls while the model runs
        seen_during.append((count_hooks(model) - 1, len(active_calls())))

    prompt = "what is the capital of france"
    handle = model.get_submodule("model.norm").register_forward_pre_hook(probe, with_kwargs=True)
    try:
        pipeline.generate(text=prompt, max_new_tokens=2)
    finally:
        handle.remove()
    hooks, calls = seen_during[0]
    expected = {"pasta": (2, 1), "caa": (2, 0), "actadd": (1, 0)}[name]
    assert (hooks, calls) == expected  # the hooks were really there during the call
    assert count_hooks(model) == 0 and active_calls() == ()

    # model.generate rejects an unknown kwarg, inside the backend's `applied` block
    with pytest.raises(ValueError, match="not_a_generate_kwarg"):
        pipeline.generate(text=prompt, max_new_tokens=2, not_a_generate_kwarg=1)
    assert count_hooks(model) == 0 and active_calls() == ()

    def failing_forward(*args, **kwargs):
        raise RuntimeError("boom inside the forward")

    original = model.lm_head.forward
    model.lm_head.forward = failing_forward
    try:
        with pytest.raises(RuntimeError, match="boom"):
            pipeline.generate(
                text=[prompt, "the capital city"] if control.supports_batching else prompt, max_new_tokens=2
            )
    finally:
        model.lm_head.forward = original
    assert count_hooks(model) == 0 and active_calls() == ()
