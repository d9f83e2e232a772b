"""Reference-free sequence scorers for search drivers: majority vote (self-consistency)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from typing import Any

_NON_WORD = re.compile(r"[^\w\s]")


def normalize_answer(text: str) -> str:
    """The first non-empty line, lower-cased, without punctuation or repeated spaces."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    return " ".join(_NON_WORD.sub(" ", line.lower()).split())


class MajorityVoteScorer:
    """Score each candidate by the share of candidates whose normalized answer equals its own.

    With `BestOfN` this is self-consistency (Wang et al., 2022): the answer most candidates agree on wins, no
    reference or reward model needed. Empty answers score 0.
    """

    def __call__(self, prompt: str, continuations: list[str], params: Mapping[str, Any]) -> list[float]:
        answers = [normalize_answer(c) for c in continuations]
        counts = Counter(a for a in answers if a)
        total = len(continuations) or 1
        return [counts[a] / total if a else 0.0 for a in answers]

    def canonical_form(self) -> dict[str, str]:
        return {"__class__": f"{__name__}.MajorityVoteScorer"}

    def __repr__(self) -> str:
        return "MajorityVoteScorer()"
