"""Drivers composed with other controls: state hooks and input controls are active in every rollout."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.input import SystemPrompt
from steer_hydra.controls.output import BestOfN, DeAL
from steer_hydra.core import SteeringPipeline

CHAT = [{"role": "user", "content": "hello there"}]
SYSTEM = "answer briefly"


def drivers(scorer):
    return {
        "best_of_n": BestOfN(n=4, scorer=scorer),
        "deal": DeAL(lookahead=2, init_beams=3, topk=2, max_iterations=3, reward_func=scorer),
    }


@pytest.mark.parametrize("kind", ["best_of_n", "deal"])
def test_state_hooks_and_system_prompt_are_active_during_every_rollout(
    tiny, recording_scorer, record_generate, step_controls, kind
):
    model, tok = tiny
    scorer = recording_scorer(lambda text: float(len(set(text))))
    hook = step_controls["counting_hook"]()
    driver = drivers(scorer)[kind]
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[SystemPrompt(text=SYSTEM), hook, driver]).steer()
    seen_per_call = []
    counts = {}

    def on_call(phase):
        if phase == "before":
            counts["before"] = hook.calls
        else:
            seen_per_call.append(hook.calls - counts["before"])

    calls = record_generate(pipeline.model, on_call)
    output = pipeline.generate(messages=CHAT, max_new_tokens=6, temperature=1.0, seed=5, return_output=True)

    assert len(calls) >= 1 and len(seen_per_call) == len(calls)
    for call, hook_calls in zip(calls, seen_per_call, strict=True):
        new_tokens = call["sequences"].shape[1] - call["input_ids"].shape[1]
        assert hook_calls >= new_tokens >= 1  # one layer-0 forward per decoding step, at least
    assert hook.built == 1  # the hooks are built once and stay registered for the whole decode
    # the hooks are gone after the decode
    after = hook.calls
    with torch.no_grad():
        pipeline.model(input_ids=output.adapted_input_ids)
    assert hook.calls == after
    # the system prompt reached every rollout's prompt, and the scorer's "input"
    for call in calls:
        assert SYSTEM in tok.decode(call["input_ids"][0], skip_special_tokens=True)
    assert all(SYSTEM in prompt and "hello there" in prompt for prompt, _, _ in scorer.calls)
    pipeline.release()


def test_a_steering_hook_changes_what_the_driver_returns(tiny, recording_scorer):
    """A hook that overwrites layer 0's output must change every candidate (so it ran inside the rollouts)."""
    from steer_hydra.core import StateControl

    class Overwrite(StateControl):
        def get_hooks(self, input_ids, runtime_kwargs, **kwargs):
            def hook(module, args, kwargs, output):
                hidden = output[0] if isinstance(output, tuple) else output
                marked = torch.full_like(hidden, 3.0)
                return (marked, *output[1:]) if isinstance(output, tuple) else marked

            return {"forward": [{"module": "model.layers.0", "hook_func": hook}]}

    model, tok = tiny
    plain_scorer, steered_scorer = recording_scorer(len), recording_scorer(len)
    plain = SteeringPipeline(model=model, tokenizer=tok, controls=[BestOfN(n=3, scorer=plain_scorer)])
    plain.steer().generate(messages=CHAT, max_new_tokens=5, seed=1, temperature=1.0)
    steered = SteeringPipeline(model=model, tokenizer=tok, controls=[Overwrite(), BestOfN(n=3, scorer=steered_scorer)])
    steered.steer().generate(messages=CHAT, max_new_tokens=5, seed=1, temperature=1.0)
    # with layer 0's output replaced by a constant every step sees the same hidden states, so the candidates
    # drawn with the same seed differ from the unsteered ones
    assert plain_scorer.calls[0][1] != steered_scorer.calls[0][1]
