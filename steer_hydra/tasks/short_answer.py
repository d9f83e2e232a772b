"""`steer_hydra/short_answer`: one-word factual questions scored by `includes()` (or `match()`).

72 questions: 20 hand-written ones (ids `sa-01`...`sa-20`, the smoke suite's first samples), then questions
generated from fixed fact tables (capitals, continents, opposites, colours), in a fixed order with fixed ids.
"""

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

CAPITALS = (
    ("Portugal", "Lisbon"),
    ("Greece", "Athens"),
    ("Egypt", "Cairo"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Austria", "Vienna"),
    ("Ireland", "Dublin"),
    ("Norway", "Oslo"),
    ("Sweden", "Stockholm"),
    ("Poland", "Warsaw"),
    ("Canada", "Ottawa"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Cuba", "Havana"),
    ("Thailand", "Bangkok"),
    ("Denmark", "Copenhagen"),
    ("Finland", "Helsinki"),
    ("Hungary", "Budapest"),
    ("Belgium", "Brussels"),
    ("Turkey", "Ankara"),
)
CONTINENTS = (
    ("Kenya", "Africa"),
    ("India", "Asia"),
    ("Germany", "Europe"),
    ("Egypt", "Africa"),
    ("Norway", "Europe"),
    ("China", "Asia"),
    ("Nigeria", "Africa"),
    ("Vietnam", "Asia"),
    ("Portugal", "Europe"),
    ("Ghana", "Africa"),
)
OPPOSITES = (
    ("hot", "cold"),
    ("up", "down"),
    ("big", "small"),
    ("fast", "slow"),
    ("day", "night"),
    ("old", "new"),
    ("open", "closed"),
    ("light", "dark"),
    ("early", "late"),
    ("full", "empty"),
    ("wet", "dry"),
    ("hard", "soft"),
)
COLOURS = (
    ("a ripe banana", "yellow"), ("snow", "white"), ("coal", "black"), ("a ripe tomato", "red"),
    ("an orange", "orange"), ("the sea on a sunny day", "blue"), ("a lemon", "yellow"), ("a leaf in summer", "green"),
    ("milk", "white"), ("a strawberry", "red"),
)  # fmt: skip


def _generated_questions() -> tuple[tuple[str, str], ...]:
    rows = [(f"What is the capital of {country}?", city) for country, city in CAPITALS]
    rows += [(f"Which continent is {country} in?", continent) for country, continent in CONTINENTS]
    rows += [(f"What is the opposite of {word}?", opposite) for word, opposite in OPPOSITES]
    rows += [(f"What color is {thing}?", colour) for thing, colour in COLOURS]
    return tuple(rows)


ALL_QUESTIONS = QUESTIONS + _generated_questions()


def short_answer_samples() -> list[Sample]:
    """The dataset, in a fixed order (ids `sa-01`...): the same first N samples for every arm."""
    return [
        Sample(id=f"sa-{i:02d}", input=f"{INSTRUCTION} {question}", target=answer)
        for i, (question, answer) in enumerate(ALL_QUESTIONS, start=1)
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
