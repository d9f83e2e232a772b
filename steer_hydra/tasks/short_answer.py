"""`steer_hydra/short_answer`: one-word factual questions scored by `includes()` (or `match()`)."""

from __future__ import annotations

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import includes, match
from inspect_ai.solver import generate

from steer_hydra.tasks.registry import builtin_task

INSTRUCTION = "Answer with one word only."

QUESTIONS: tuple[tuple[str, str], ...] = (
    ("What is the capital of France?", "Paris"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Germany?", "Berlin"),
    ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of England?", "London"),
    ("What color is the sky on a clear day?", "blue"),
    ("What color is fresh grass?", "green"),
    ("What animal says meow?", "cat"),
    ("What animal barks?", "dog"),
    ("What do fish swim in?", "water"),
    ("Which star does the Earth orbit?", "Sun"),
    ("How many legs does a dog have? Answer in words.", "four"),
    ("What is two plus three? Answer in words.", "five"),
    ("What is ten minus one? Answer in words.", "nine"),
    ("Which continent is Japan in?", "Asia"),
    ("Which continent is France in?", "Europe"),
    ("What is the opposite of true?", "false"),
    ("What is the opposite of happy?", "sad"),
    ("What is frozen water called?", "ice"),
)


def short_answer_samples() -> list[Sample]:
    """The dataset, in a fixed order (ids `sa-01`...): the same first N samples for every arm."""
    return [
        Sample(id=f"sa-{i:02d}", input=f"{INSTRUCTION} {question}", target=answer)
        for i, (question, answer) in enumerate(QUESTIONS, start=1)
    ]


@builtin_task
def short_answer(scorer: str = "includes") -> Task:
    """Short factual answers; `scorer="includes"` (the answer appears anywhere) or `"match"` (at the end)."""
    if scorer not in ("includes", "match"):
        raise ValueError(f"short_answer: scorer must be 'includes' or 'match'; got {scorer!r}.")
    return Task(
        dataset=MemoryDataset(short_answer_samples(), name="short_answer"),
        solver=[generate()],
        scorer=includes() if scorer == "includes" else match(location="any"),
    )
