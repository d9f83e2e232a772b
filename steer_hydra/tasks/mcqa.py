"""`steer_hydra/mcqa`: four-option multiple choice, scored on the letter or the option text by default.

72 questions: 12 hand-written ones (ids `mc-01`...`mc-12`), then questions generated from fixed fact tables
(capitals, arithmetic, opposites) with distractors drawn from a fixed seed. Two scorings (`scorer=` task arg):
- `lenient` (default): the prompt lists the options as `A) ...` and asks for the letter; `letter_or_option`
  accepts the letter (`B`, `B)`, `(B)`, `Answer: B`) or, when no letter is given, the text of exactly one option.
  A 135M instruct model answers "B) Paris" or "Paris", never Inspect's `ANSWER: B` format;
- `choice`: Inspect's `multiple_choice()` solver and `choice()` scorer (the strict `ANSWER: X` format).
"""

from __future__ import annotations

import random
import re

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, choice, scorer, stderr
from inspect_ai.solver import TaskState, generate, multiple_choice

from steer_hydra.tasks.registry import builtin_task

LETTERS = "ABCD"

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

_CAPITALS = (
    ("Turkey", "Ankara"),
    ("Italy", "Rome"),
    ("Germany", "Berlin"),
    ("Spain", "Madrid"),
    ("Japan", "Tokyo"),
    ("Egypt", "Cairo"),
    ("Russia", "Moscow"),
    ("China", "Beijing"),
    ("Greece", "Athens"),
    ("Portugal", "Lisbon"),
    ("Austria", "Vienna"),
    ("Ireland", "Dublin"),
    ("Norway", "Oslo"),
    ("Poland", "Warsaw"),
    ("Canada", "Ottawa"),
    ("Kenya", "Nairobi"),
    ("Peru", "Lima"),
    ("Sweden", "Stockholm"),
    ("Cuba", "Havana"),
    ("Thailand", "Bangkok"),
)
_OPPOSITES = (
    ("hot", "cold"), ("up", "down"), ("big", "small"), ("fast", "slow"), ("day", "night"), ("old", "new"),
    ("open", "closed"), ("light", "dark"), ("early", "late"), ("full", "empty"), ("wet", "dry"), ("hard", "soft"),
    ("happy", "sad"), ("rich", "poor"),
)  # fmt: skip


def _generated() -> list[tuple[str, tuple[str, ...], str]]:
    rng = random.Random(3)
    rows: list[tuple[str, list[str]]] = []  # (question, [correct, distractor...])
    cities = [c for _, c in _CAPITALS]
    for country, city in _CAPITALS:
        rows.append(
            (f"Which city is the capital of {country}?", [city, *rng.sample([c for c in cities if c != city], 3)])
        )
    for _ in range(14):
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        wrong = rng.sample([a + b + d for d in (-3, -2, -1, 1, 2, 3)], 3)
        rows.append((f"What is {a} + {b}?", [str(a + b), *map(str, wrong)]))
    words = [o for _, o in _OPPOSITES]
    for word, opposite in _OPPOSITES:
        pool = [w for w in words if w != opposite]
        rows.append((f"Which word means the opposite of {word}?", [opposite, *rng.sample(pool, 3)]))
    out = []
    for question, options in rows:
        position = rng.randrange(4)
        ordered = options[1:]
        ordered.insert(position, options[0])
        out.append((question, tuple(ordered), LETTERS[position]))
    return out


ALL_QUESTIONS = QUESTIONS + tuple(_generated())

_LETTER_PATTERNS = (
    re.compile(r"answer(?: is)?\s*[:\-]?\s*\(?([A-D])\b", re.IGNORECASE),
    re.compile(r"^\W*\(?([A-D])(?:[\).:]|\s*$)"),
    re.compile(r"(?<![A-Za-z])\(?([A-D])\)"),
)


def format_question(question: str, options: tuple[str, ...]) -> str:
    lines = [f"{letter}) {option}" for letter, option in zip(LETTERS, options, strict=False)]
    return f"{question}\n" + "\n".join(lines) + "\nAnswer with the letter of the correct option."


def mcqa_samples(formatted: bool = False) -> list[Sample]:
    """The dataset in a fixed order (ids `mc-01`...); `formatted=True` writes the options into the prompt."""
    return [
        Sample(
            id=f"mc-{i:02d}",
            input=format_question(question, options) if formatted else question,
            choices=list(options),
            target=answer,
        )
        for i, (question, options, answer) in enumerate(ALL_QUESTIONS, start=1)
    ]


def read_choice(text: str, options: list[str]) -> str | None:
    """The letter an answer chose: an explicit letter first, else the one option whose text it contains."""
    for pattern in _LETTER_PATTERNS:
        match = pattern.search(text.strip())
        if match:
            return match.group(1).upper()
    lowered = text.lower()
    named = [LETTERS[i] for i, option in enumerate(options) if re.search(rf"\b{re.escape(option.lower())}\b", lowered)]
    return named[0] if len(named) == 1 else None


@scorer(metrics=[accuracy(), stderr()])
def letter_or_option():
    """C when the answer's letter (or the text of exactly one option) is the target option."""

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        options = [c.value for c in state.choices] if state.choices else []
        chosen = read_choice(text, options)
        ok = chosen is not None and chosen == target.text.strip()
        return Score(value=CORRECT if ok else INCORRECT, answer=chosen or "", explanation=text)

    return score


@builtin_task
def mcqa(scorer: str = "lenient") -> Task:
    """Four-option multiple choice: `lenient` (letter or option text) or Inspect's strict `choice`."""
    if scorer == "lenient":
        return Task(
            dataset=MemoryDataset(mcqa_samples(formatted=True), name="mcqa"),
            solver=[generate()],
            scorer=letter_or_option(),
        )
    if scorer == "choice":
        return Task(dataset=MemoryDataset(mcqa_samples(), name="mcqa"), solver=[multiple_choice()], scorer=choice())
    raise ValueError(f"mcqa: scorer must be 'lenient' or 'choice'; got {scorer!r}.")
