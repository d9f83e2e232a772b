"""sample_scorer_from_inspect: the TaskState it builds, score conversion, and the sync bridge in every context."""

from __future__ import annotations

import subprocess
import sys

import anyio
import anyio.to_thread
import pytest
import torch
from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, GenerateConfig, ModelName
from inspect_ai.scorer import Score, Target, accuracy, includes, match, scorer

from steer_hydra.core.output import Output
from steer_hydra.evaluation.provider import SteeringPipelineModelAPI
from steer_hydra.evaluation.scorers import sample_scorer_from_inspect
from steer_hydra.models import build_tiny_tokenizer

# Inspect's retry helper still passes a deprecated tenacity argument.
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

ROW = {"input": "Which city is the Eiffel Tower in?", "reference": "Paris", "topic": "geo"}


def recording_scorer(seen, value=1.0):
    @scorer(metrics=[accuracy()])
    def record():
        async def score(state, target):
            seen.append((state, target))
            return None if value is None else Score(value=value)

        return score

    return record()


def test_adapter_builds_a_minimal_task_state():
    seen = []
    row_scorer = sample_scorer_from_inspect(recording_scorer(seen), model_name="steer_hydra/grader")
    assert row_scorer("Paris.", ROW) == 1.0
    ((state, target),) = seen
    assert str(state.model) == "steer_hydra/grader" and isinstance(state.model, ModelName)
    assert (state.sample_id, state.epoch, state.input) == (0, 0, ROW["input"])
    assert isinstance(state.messages[0], ChatMessageUser) and state.messages[0].text == ROW["input"]
    assert isinstance(state.messages[1], ChatMessageAssistant) and state.messages[1].text == "Paris."
    assert isinstance(target, Target) and target.text == "Paris" and state.target.text == "Paris"
    assert state.output.completion == "Paris." and state.metadata == ROW


def test_adapter_reads_a_custom_target_key_and_stringifies_input():
    seen = []
    row_scorer = sample_scorer_from_inspect(recording_scorer(seen), target_key="gold")
    row_scorer("x", {"input": 42, "gold": "y"})
    ((state, target),) = seen
    assert state.input == "42" and target.text == "y"


def test_scores_convert_with_value_to_float():
    assert sample_scorer_from_inspect(includes())("It is Paris.", ROW) == 1.0
    assert sample_scorer_from_inspect(includes())("It is Rome.", ROW) == 0.0
    assert sample_scorer_from_inspect(match())("The answer is Paris", ROW) == 1.0
    assert sample_scorer_from_inspect(includes())("anything", {"input": "q"}) == 1.0  # missing target: ""
    assert sample_scorer_from_inspect(includes(), to_float=lambda value: 42.0)("x", ROW) == 42.0


def test_no_score_raises_and_scorer_errors_propagate():
    with pytest.raises(ValueError, match="no Score"):
        sample_scorer_from_inspect(recording_scorer([], value=None))("x", ROW)

    @scorer(metrics=[accuracy()])
    def broken():
        async def score(state, target):
            raise KeyError("grader unavailable")

        return score

    with pytest.raises(KeyError, match="grader unavailable"):
        sample_scorer_from_inspect(broken())("x", ROW)


def test_bridge_from_plain_sync_code():
    assert sample_scorer_from_inspect(includes())("Paris", ROW) == 1.0


def test_bridge_from_an_anyio_worker_thread():
    row_scorer = sample_scorer_from_inspect(includes())

    async def main():
        return await anyio.to_thread.run_sync(row_scorer, "Paris", ROW)

    assert anyio.run(main) == 1.0


INSIDE_A_RUNNING_LOOP = f"""
import asyncio
from inspect_ai.scorer import includes
from steer_hydra.evaluation.scorers import sample_scorer_from_inspect

row_scorer = sample_scorer_from_inspect(includes())


async def main():
    return row_scorer("Paris", {ROW!r}), row_scorer("Rome", {ROW!r})

print(asyncio.run(main()))
"""


def test_bridge_inside_a_running_asyncio_loop():
    # in a process of its own: re-entering a running loop applies nest_asyncio, which patches asyncio for good
    done = subprocess.run([sys.executable, "-c", INSIDE_A_RUNNING_LOOP], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "(1.0, 0.0)"


def test_bridge_refuses_a_running_trio_task():
    pytest.importorskip("trio")
    row_scorer = sample_scorer_from_inspect(includes())

    async def main():
        row_scorer("Paris", ROW)

    with pytest.raises(RuntimeError, match="trio"):
        anyio.run(main, backend="trio")


def test_bridge_from_the_provider_dispatch_thread():
    """A control calling a SampleScorer inside pipeline.generate (the collator's worker thread)."""
    tokenizer = build_tiny_tokenizer()
    row_scorer = sample_scorer_from_inspect(includes())
    rewards = []

    class ScoringPipeline:
        controls, supports_batching, is_steered = [], True, True

        def __init__(self):
            self.tokenizer = tokenizer

        def generate(self, *, runtime_kwargs, return_output, messages, **gen_kwargs):
            rewards.extend(row_scorer(candidate, ROW) for candidate in ("Paris", "Rome"))
            ids = torch.tensor([tokenizer.encode("Paris", add_special_tokens=False)])
            return [Output(ids, torch.tensor([[1, 2]]), ["eos"]) for _ in messages]

    api = SteeringPipelineModelAPI("stub", pipeline=ScoringPipeline())
    output = anyio.run(api.generate, [ChatMessageUser(content="q")], [], "auto", GenerateConfig())
    assert rewards == [1.0, 0.0] and output.completion == "Paris"
