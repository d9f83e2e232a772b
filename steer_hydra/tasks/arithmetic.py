"""`steer_hydra/arithmetic`: small arithmetic (sums, differences, products) scored on the number answered.

72 problems generated from a fixed seed (ids `ar-01`...`ar-72`): operands below 20 (products below 10), so a
small instruct model can meet them and a steering method's cost shows. `number_match` reads the answered number
(`answer_number`: the first integer - digits, or a number word from zero to twenty - after a restated expression
such as "14 - 3 = 11" or "3 times 3 is 9", which SmolLM2 writes for most problems; otherwise the first integer of
the answer) and compares it with the target.
"""

from __future__ import annotations

import random
import re

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState, generate

from steer_hydra.tasks.registry import builtin_task

COUNT = 72
INSTRUCTION = "Answer with the number only."
NUMBER_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty"
).split()
_NUMBER = re.compile(r"-?\d+|\b(?:" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)
# "12 + 6 =", "3 times 3 is", "2 * 3 equals": an operand, an operator, an operand, then what introduces the result
_RESTATED = re.compile(
    r"^\D*?-?\d+\s*(?:\+|-|\u2212|\*|x|\u00d7|times|plus|minus|multiplied by)\s*-?\d+\s*(?:=|is|equals|makes)",
    re.IGNORECASE,
)


def arithmetic_problems() -> list[tuple[str, int]]:
    """`(question, answer)` in a fixed order: sums, differences (never negative) and products, interleaved."""
    rng = random.Random(7)
    problems: dict[str, int] = {}
    while len(problems) < COUNT:
        kind = len(problems) % 3
        if kind == 0:
            a, b = rng.randint(2, 19), rng.randint(2, 19)
            question, answer = f"What is {a} + {b}?", a + b
        elif kind == 1:
            a, b = sorted((rng.randint(2, 19), rng.randint(2, 19)), reverse=True)
            question, answer = f"What is {a} - {b}?", a - b
        else:
            a, b = rng.randint(2, 9), rng.randint(2, 9)
            question, answer = f"What is {a} times {b}?", a * b
        problems.setdefault(question, answer)  # a repeat is drawn again
    return list(problems.items())


def arithmetic_samples() -> list[Sample]:
    return [
        Sample(id=f"ar-{i:02d}", input=f"{question} {INSTRUCTION}", target=str(answer))
        for i, (question, answer) in enumerate(arithmetic_problems(), start=1)
    ]


def first_number(text: str) -> int | None:
    """The first integer in `text` (digits or a number word up to twenty), or None."""
    match = _NUMBER.search(text)
    if match is None:
        return None
    token = match.group(0).lower()
    return NUMBER_WORDS.index(token) if token in NUMBER_WORDS else int(token)


def answer_number(text: str) -> int | None:
    """The answered number: the first integer after a restated expression ("14 - 3 = 11" -> 11), else the first."""
    restated = _RESTATED.match(text)
    return first_number(text[restated.end() :]) if restated else first_number(text)


@scorer(metrics=[accuracy(), stderr()])
def number_match():
    """C when the answered number (`answer_number`) equals the target."""

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        value = answer_number(text)
        ok = value is not None and str(value) == target.text.strip()
        return Score(value=CORRECT if ok else INCORRECT, answer=text, explanation=f"read {value}")

    return score


@builtin_task
def arithmetic() -> Task:
    """Small arithmetic; the answered number is scored (see `answer_number`)."""
    return Task(
        dataset=MemoryDataset(arithmetic_samples(), name="arithmetic"),
        solver=[generate()],
        scorer=number_match(),
    )
