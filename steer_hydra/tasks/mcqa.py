"""`steer_hydra/mcqa`: four-option multiple choice (Inspect's `multiple_choice` solver, `choice` scorer)."""

from __future__ import annotations

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import choice
from inspect_ai.solver import multiple_choice

from steer_hydra.tasks.registry import builtin_task

QUESTIONS: tuple[tuple[str, tuple[str, str, str, str], str], ...] = (
    ("Which city is the capital of France?", ("Rome", "Paris", "Berlin", "Madrid"), "B"),
    ("Which of these is a color?", ("blue", "dog", "river", "seven"), "A"),
    ("How many days are in a week?", ("five", "six", "seven", "eight"), "C"),
    ("Which animal can fly?", ("fish", "cat", "dog", "bird"), "D"),
    ("What is three plus four?", ("seven", "six", "eight", "nine"), "A"),
    ("Which of these is a river?", ("Tokyo", "the Nile", "Asia", "the Moon"), "B"),
    ("What do plants need from the sun?", ("sound", "salt", "light", "ice"), "C"),
    ("Which word means the opposite of cold?", ("wet", "slow", "dark", "hot"), "D"),
    ("Which is the largest?", ("the Sun", "the Earth", "the Moon", "a mountain"), "A"),
    ("Which of these is a fruit?", ("carrot", "apple", "potato", "onion"), "B"),
    ("What is the boiling point of water at sea level in Celsius?", ("50", "90", "100", "120"), "C"),
    ("Which language is mainly spoken in Spain?", ("German", "Italian", "French", "Spanish"), "D"),
)


def mcqa_samples() -> list[Sample]:
    """The dataset, in a fixed order (ids `mc-01`...)."""
    return [
        Sample(id=f"mc-{i:02d}", input=question, choices=list(options), target=answer)
        for i, (question, options, answer) in enumerate(QUESTIONS, start=1)
    ]


@builtin_task
def mcqa() -> Task:
    """Four-option multiple choice; the model answers `ANSWER: X` and `choice()` scores the letter."""
    return Task(
        dataset=MemoryDataset(mcqa_samples(), name="mcqa"),
        solver=[multiple_choice()],
        scorer=choice(),
    )
