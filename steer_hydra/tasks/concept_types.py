"""A steering concept's data types: `Concept` (with its `ContrastPair`s and, for a dataset concept, its own
evaluation `Instruction`s), the defaults of its optional prompts, and `ConceptFileError`, the one error a concept
that cannot be used raises. `tasks/concepts.py` (concept files, the public API) and `tasks/concept_sets.py` (the
published datasets) both build these; they are re-exported from `tasks/concepts.py`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("topic", "sentiment", "style", "language")
MIN_PAIRS = 2
DATASET_LAYOUTS = ("axbench", "steereval")  # published layouts `tasks/concept_sets.py` reads


class ConceptFileError(ValueError):
    """A concept that cannot be loaded: the message names the file, the line of the offending entry and the fix."""

    def __init__(self, path: str | Path | None, problem: str, fix: str, line: int | None = None):
        self.path = None if path is None else str(path)
        self.line = line
        at = f" (line {line})" if line else ""
        prefix = "" if path is None else f"{path}: "
        super().__init__(f"{prefix}{problem}{at}. Fix: {fix}.")


@dataclass(frozen=True, slots=True)
class ContrastPair:
    """One everyday prompt, answered once with the concept (`positive`) and once without it (`negative`)."""

    prompt: str
    positive: str
    negative: str

    def as_dict(self) -> dict[str, str]:
        return {"prompt": self.prompt, "positive": self.positive, "negative": self.negative}


@dataclass(frozen=True, slots=True)
class Instruction:
    """One evaluation instruction a dataset brings for its concept: the sample `id` (unique within the concept),
    the `text` asked, its `split` (`dev` for choosing a point, `test` for reporting) and `keywords` (stems; the rule
    scorer `instruction_score` gives 1 when the answer has one)."""

    id: str
    text: str
    split: str
    keywords: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "text": self.text, "split": self.split, "keywords": list(self.keywords)}


@dataclass(frozen=True, slots=True)
class Concept:
    """A steering concept (see the module). `actadd` and `system_prompt` default from the name and the
    description; `instructions` (a dataset concept's own evaluation instructions) is empty for a concept file;
    `source` is the file or dataset reference it was read from (not part of equality)."""

    name: str
    description: str
    kind: str
    pairs: tuple[ContrastPair, ...]
    lexicon: tuple[str, ...] = ()
    actadd: tuple[str, str] | None = None
    system_prompt: str | None = None
    instructions: tuple[Instruction, ...] = ()
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if self.actadd is None:
            object.__setattr__(self, "actadd", default_actadd(self.name))
        if self.system_prompt is None:
            object.__setattr__(self, "system_prompt", default_system_prompt(self.description))


def default_actadd(name: str) -> tuple[str, str]:
    """ActAdd's prompt pair for a concept without one: Turner et al.'s wording around the name."""
    subject = name.replace("_", " ")
    return f"I talk about {subject} constantly", f"I do not talk about {subject} constantly"


def default_system_prompt(description: str) -> str:
    """The prompting baseline's system prompt for a concept without one: it states the description."""
    return f"Bring this concept into every answer, while still answering what is asked ({description.rstrip('.')})."


class ConceptSetError(ConceptFileError):
    """A concept list of which nothing can be used: the message gives each reason with its fix, on one line."""

    def __init__(self, message: str) -> None:
        ValueError.__init__(self, message)
        self.path, self.line = None, None
