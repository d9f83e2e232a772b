"""`steer_hydra/concept_steering`: AxBench-style concept steering on neutral instructions, scored without a judge.

The dataset is 132 neutral instructions (44 everyday subjects x 3 templates, ids `cs-001`...`cs-132`), none of
which asks for the concept; a fixed seeded shuffle splits them into `dev` (60, for choosing a steering strength)
and `test` (72, for reporting), disjoint by construction. A steering method succeeds when the answers bring in
the concept while still answering the instruction, fluently. Four scorers, each in [0, 1] (AxBench rates each of
the first three 0/1/2 with an LLM judge; here they are rules, so they are cheap, deterministic and offline):

- `concept_score`: the concept's lexicon (word stems from its concept file, `tasks/concepts.py`; a stem of 3
  characters or fewer must equal a word, a longer one matches word starts) - 0 for no term, 0.5 for one distinct
  term, 1 for two or more; a concept without a lexicon is refused when the task is built (score it with a judge);
- `instruction_score`: relevance to the instruction - 1 when the answer names the instruction's subject (one of
  its keywords), else 0;
- `fluency_score`: 1 minus penalties for degenerate text - replacement characters (U+FFFD) or an empty answer
  give 0; a low share of distinct word 3-grams (repetition loops) or a low share of letters lowers it;
- `concept_harmonic`: the harmonic mean of the three (0 when any is 0), AxBench's aggregate.

`degenerate` in the study's statistics is `fluency_score < 0.5`.

`concept` is a built-in concept's name, the path of a concept file or a dataset concept's reference
(`load_concept`). A dataset concept that brings its own evaluation instructions (`Concept.instructions`: AxBench's
and SteerEval's, `tasks/concept_sets.py`) is evaluated on those, in the dataset's dev/test splits and with its
sample ids, instead of the 132 neutral instructions; `keywords` are then the instruction's own content words.
Each sample's metadata holds `concept` (its name), `concept_description`, `instruction` (the instruction text),
`keywords` (the subject's), `split` and `runtime_kwargs` (the instruction as PASTA `substrings`): what a model
judge needs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

from inspect_ai import Task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import Score, Target, mean, scorer, stderr
from inspect_ai.solver import TaskState

from steer_hydra.tasks.concepts import Concept, ConceptFileError, load_concept
from steer_hydra.tasks.instructions import (  # noqa: F401 - the task's dataset, re-exported
    DEV_SIZE,
    SPLITS,
    SUBJECTS,
    TEMPLATES,
    _ordered_items,
    instructions,
    split_ids,
)
from steer_hydra.tasks.registry import builtin_task

# The rule scorers' names (each scorer's column in the frames), the study's default objective, and the fluency
# column whose values below 0.5 count a generation as degenerate.
SCORES = ("concept_score", "instruction_score", "fluency_score", "concept_harmonic")
OBJECTIVE = "concept_harmonic"
FLUENCY = "fluency_score"

_WORD = re.compile(r"[a-z']+")
_REPLACEMENT = "\ufffd"


def concept_samples(concept: str | Path | Concept = "weddings", split: str = "all") -> list[Sample]:
    """The split's samples in id order; metadata holds the concept (name and description), the instruction, the
    subject keywords and the split. A concept with instructions of its own is asked those (see the module)."""
    found = load_concept(concept)
    if found.instructions:
        return _own_samples(found, split)
    chosen = set(split_ids(split))
    dev = set(split_ids("dev"))
    return [
        Sample(
            id=sample_id,
            input=instruction,
            target=found.name,
            metadata={
                "concept": found.name,
                "concept_description": found.description,
                "instruction": instruction,
                "keywords": list(keywords),
                "split": "dev" if sample_id in dev else "test",
                "runtime_kwargs": {"substrings": [instruction]},
            },
        )
        for sample_id, instruction, keywords in _ordered_items()
        if sample_id in chosen
    ]


def _own_samples(concept: Concept, split: str) -> list[Sample]:
    """A dataset concept's samples: its own instructions of `split` (`all`: every one), in the dataset's order."""
    if split not in SPLITS:
        raise ValueError(f"concept_steering: split must be one of {SPLITS}; got {split!r}.")
    return [
        Sample(
            id=item.id,
            input=item.text,
            target=concept.name,
            metadata={
                "concept": concept.name,
                "concept_description": concept.description,
                "instruction": item.text,
                "keywords": list(item.keywords),
                "split": item.split,
                "runtime_kwargs": {"substrings": [item.text]},
            },
        )
        for item in concept.instructions
        if split in ("all", item.split)
    ]


# ---------------------------------------------------------------------------------------------- rule scorers
def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _has_stem(words: list[str], stem: str) -> bool:
    return any(w.startswith(stem) for w in words)


def concept_lexicon(concept: str | Path | Concept) -> tuple[str, ...]:
    """The concept's lexicon; a concept without one is refused (the rule scorer has nothing to count)."""
    found = load_concept(concept)
    if not found.lexicon:
        raise ConceptFileError(
            found.source or found.name,
            f"concept {found.name!r} has no lexicon, so the rule scorer concept_score cannot score it",
            "add `lexicon: [stem, ...]` (word stems that show the concept) to the concept file, or score the task "
            "with a model judge",
        )
    return found.lexicon


def concept_value(text: str, lexicon: Sequence[str]) -> float:
    """0, 0.5 or 1: no lexicon term, one distinct term, two or more distinct terms (stems of 3 characters or fewer
    must equal a word; longer ones match word starts)."""
    words = _words(text)
    hits = sum(1 for stem in lexicon if (stem in words if len(stem) <= 3 else _has_stem(words, stem)))
    return 0.0 if hits == 0 else 0.5 if hits == 1 else 1.0


def instruction_value(text: str, keywords: list[str]) -> float:
    """1 when the answer names the instruction's subject (a keyword stem), else 0."""
    words = _words(text)
    return 1.0 if any(_has_stem(words, k) for k in keywords) else 0.0


def fluency_value(text: str) -> float:
    """1 for clean text, lowered by repetition and non-letter noise; 0 for empty text or replacement characters."""
    if _REPLACEMENT in text or not text.strip():
        return 0.0
    words = _words(text)
    if not words:
        return 0.0
    score = 1.0
    if len(words) >= 6:
        grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
        distinct = len(set(grams)) / len(grams)
        score *= min(1.0, distinct / 0.8)  # loops repeat 3-grams: below 80% distinct costs proportionally
    visible = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in visible) / len(visible)
    score *= min(1.0, letters / 0.6)  # mostly digits or symbols is noise
    return round(score, 4)


def harmonic_value(values: list[float]) -> float:
    """Harmonic mean, 0 when any value is 0 (AxBench's aggregate)."""
    if any(v <= 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


def _rule_scorer(name: str, rule: Callable[[str, dict], float]):
    @scorer(metrics=[mean(), stderr()], name=name)
    def build():
        async def score(state: TaskState, target: Target) -> Score:
            text = state.output.completion
            return Score(value=rule(text, state.metadata), answer=text)

        return score

    return build


instruction_score = _rule_scorer("instruction_score", lambda text, meta: instruction_value(text, meta["keywords"]))
fluency_score = _rule_scorer("fluency_score", lambda text, meta: fluency_value(text))


@scorer(metrics=[mean(), stderr()])
def concept_score(concept: str = "weddings"):
    """The concept's lexicon terms in the answer (`concept_value`); `concept` is a built-in name or a file path."""
    lexicon = concept_lexicon(concept)

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        return Score(value=concept_value(text, lexicon), answer=text)

    return score


@scorer(metrics=[mean(), stderr()])
def concept_harmonic(concept: str = "weddings"):
    """The harmonic mean of the concept, instruction and fluency values (AxBench's aggregate)."""
    lexicon = concept_lexicon(concept)

    async def score(state: TaskState, target: Target) -> Score:
        text = state.output.completion
        parts = [concept_value(text, lexicon), instruction_value(text, state.metadata["keywords"]), fluency_value(text)]
        return Score(value=harmonic_value(parts), answer=text)

    return score


@builtin_task
def concept_steering(concept: str = "weddings", split: str = "all", runtime_kwargs_key: str = "runtime_kwargs") -> Task:
    """Neutral instructions; concept, instruction-relevance, fluency and harmonic scores (see the module).
    `concept`: a built-in concept's name or the path of a concept file."""
    from steer_hydra.evaluation.solvers import runtime_kwargs_solver

    found = load_concept(concept)
    return Task(
        dataset=MemoryDataset(concept_samples(found, split), name=f"concept_steering_{found.name}_{split}"),
        solver=[runtime_kwargs_solver(key=runtime_kwargs_key)],
        scorer=[concept_score(concept), instruction_score(), fluency_score(), concept_harmonic(concept)],
    )
