"""runtime_kwargs_solver: a sample's metadata runtime kwargs travel in extra_body to the provider."""

from __future__ import annotations

import anyio
from inspect_ai.model import ChatMessageUser, ModelName
from inspect_ai.solver import TaskState

from steer_hydra.evaluation.solvers import runtime_kwargs_solver


def _state(metadata):
    return TaskState(
        model=ModelName("steer_hydra/x"),
        sample_id=1,
        epoch=1,
        input="hi",
        messages=[ChatMessageUser(content="hi")],
        metadata=metadata,
    )


def _run(solver, state):
    seen = []

    async def generate(state, **kwargs):
        seen.append(kwargs)
        return state

    anyio.run(solver, state, generate)
    return seen


def test_solver_passes_metadata_runtime_kwargs_as_extra_body():
    substrings = ["Answer with the city name only."]
    (kwargs,) = _run(runtime_kwargs_solver(), _state({"runtime_kwargs": {"substrings": substrings}, "other": 1}))
    assert kwargs == {"extra_body": {"runtime_kwargs": {"substrings": substrings}}}
    assert kwargs["extra_body"]["runtime_kwargs"]["substrings"] is substrings


def test_solver_without_metadata_sends_an_empty_mapping():
    assert _run(runtime_kwargs_solver(), _state({})) == [{"extra_body": {"runtime_kwargs": {}}}]
    assert _run(runtime_kwargs_solver(), _state({"runtime_kwargs": None})) == [{"extra_body": {"runtime_kwargs": {}}}]


def test_solver_reads_a_custom_key_and_copies_the_mapping():
    steering = {"reward_params": {"reference": "Paris"}}
    (kwargs,) = _run(runtime_kwargs_solver(key="steering"), _state({"steering": steering}))
    assert kwargs["extra_body"]["runtime_kwargs"] == steering
    assert kwargs["extra_body"]["runtime_kwargs"] is not steering
