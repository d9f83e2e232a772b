"""`steer_hydra/instruction_following`: a target-behavior task with per-sample runtime kwargs.

Each prompt is an instruction line followed by a question. The instruction line travels with the sample as
`metadata["runtime_kwargs"] = {"substrings": [line]}` (the per-row form of PASTA's `substrings`), delivered by
`runtime_kwargs_solver`; arms whose controls do not declare `substrings` (the baseline, prompt-only arms) ignore
it. `instruction_checker()` scores whether the response obeys the instruction, with a rule per sample
(`metadata["check"]`, `metadata["check_arg"]`), in the spirit of IFEval's verifiable instructions.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import CORRECT, INCORRECT, Score, Target, accuracy, scorer, stderr
from inspect_ai.solver import TaskState

from steer_hydra.tasks.registry import builtin_task

_WORD = re.compile(r"[A-Za-z0-9']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _lowercase(text: str, arg: str) -> bool:
    return any(c.isalpha() for c in text) and text == text.lower()


def _uppercase(text: str, arg: str) -> bool:
    return any(c.isalpha() for c in text) and text == text.upper()


def _max_words(text: str, arg: str) -> bool:
    return 0 < len(_words(text)) <= int(arg)


def _starts_with(text: str, arg: str) -> bool:
    words = _words(text)
    return bool(words) and words[0].lower() == arg.lower()


def _include_word(text: str, arg: str) -> bool:
    return arg.lower() in (w.lower() for w in _words(text))


def _no_commas(text: str, arg: str) -> bool:
    return bool(text.strip()) and "," not in text


INSTRUCTION_CHECKS: dict[str, Callable[[str, str], bool]] = {
    "lowercase": _lowercase,
    "uppercase": _uppercase,
    "max_words": _max_words,
    "starts_with": _starts_with,
    "include_word": _include_word,
    "no_commas": _no_commas,
}

# (instruction line, question, check, check argument)
ITEMS: tuple[tuple[str, str, str, str], ...] = (
    ("Answer in lowercase letters only.", "Which city is the capital of France?", "lowercase", ""),
    ("Answer in uppercase letters only.", "What color is the sky?", "uppercase", ""),
    ("Answer in at most three words.", "Describe the sea.", "max_words", "3"),
    ("Begin your answer with the word yes.", "Is water wet?", "starts_with", "yes"),
    ("Include the word blue in your answer.", "Describe the sky on a sunny day.", "include_word", "blue"),
    ("Do not use any commas in your answer.", "Name three animals.", "no_commas", ""),
    ("Answer in lowercase letters only.", "What is the capital of Japan?", "lowercase", ""),
    ("Answer in uppercase letters only.", "Name a fruit.", "uppercase", ""),
    ("Answer in at most five words.", "Why do birds fly?", "max_words", "5"),
    ("Begin your answer with the word no.", "Is fire cold?", "starts_with", "no"),
    ("Include the word moon in your answer.", "What do you see in the sky at night?", "include_word", "moon"),
    ("Do not use any commas in your answer.", "List four colors.", "no_commas", ""),
)


def instruction_following_samples() -> list[Sample]:
    """The dataset, in a fixed order (ids `if-01`...); each sample carries its instruction line as a substring."""
    return [
        Sample(
            id=f"if-{i:02d}",
            input=f"{instruction}\n{question}",
            target=instruction,
            metadata={
                "instruction": instruction,
                "check": check,
                "check_arg": arg,
                "runtime_kwargs": {"substrings": [instruction]},
            },
        )
        for i, (instruction, question, check, arg) in enumerate(ITEMS, start=1)
    ]


@scorer(metrics=[accuracy(), stderr()])
def instruction_checker():
    """C when the completion obeys the sample's instruction (`metadata["check"]`), else I."""

    async def score(state: TaskState, target: Target) -> Score:
        check = state.metadata.get("check")
        rule = INSTRUCTION_CHECKS.get(check)
        if rule is None:
            raise ValueError(
                f"instruction_checker: sample {state.sample_id} has check={check!r}; "
                f"valid checks: {sorted(INSTRUCTION_CHECKS)}."
            )
        text = state.output.completion.strip()
        ok = rule(text, str(state.metadata.get("check_arg", "")))
        return Score(value=CORRECT if ok else INCORRECT, answer=text, explanation=f"{check}: {ok}")

    return score


@builtin_task
def instruction_following(runtime_kwargs_key: str = "runtime_kwargs") -> Task:
    """Instruction following with the instruction line as a per-sample runtime kwarg (`substrings`)."""
    # The solver lives in the evaluation layer; imported here, when the task is built, as a user's task would.
    from steer_hydra.evaluation.solvers import runtime_kwargs_solver

    return Task(
        dataset=MemoryDataset(instruction_following_samples(), name="instruction_following"),
        solver=[runtime_kwargs_solver(key=runtime_kwargs_key)],
        scorer=instruction_checker(),
    )
