"""Reward protocols: `SampleScorer` (one response against its row) and `SequenceScorer` (candidates of one prompt).

Higher scores are better. Scorers are called from inside decoding drivers (reranking, search) and optimizers, so
their return values are checked here once, with errors that name the scorer and the bad value.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class SampleScorer(Protocol):
    """Score one response against its row (`{"input": prompt, "reference": ..., **dataset columns}`)."""

    def __call__(self, response: str, row: Mapping[str, Any]) -> float: ...


@runtime_checkable
class SequenceScorer(Protocol):
    """Score each continuation of one prompt; `params` carries the row's `reward_params` and search settings."""

    def __call__(self, prompt: str, continuations: list[str], params: Mapping[str, Any]) -> list[float]: ...


def scorer_name(scorer: Any) -> str:
    """A readable name for a scorer in messages: the qualified name of a function, the repr of a scorer object."""
    if not inspect.isroutine(scorer) and type(scorer).__repr__ is not object.__repr__:
        return repr(scorer)
    name = getattr(scorer, "__qualname__", None) or type(scorer).__qualname__
    module = getattr(scorer, "__module__", None)
    return f"{module}.{name}" if module else name


def as_score(value: Any, *, scorer: Any, what: str = "a response") -> float:
    """`value` as a finite float, else a TypeError (not a number) or ValueError (NaN) naming `scorer` and `value`.

    Accepts Python and NumPy numbers, bools (as 0/1) and one-element tensors or arrays (through `.item()`).
    Infinities are allowed (a hard reject or accept); NaN is not, since it cannot be ranked.
    """
    raw = value
    if not isinstance(value, numbers.Real) and callable(getattr(value, "item", None)):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            value = raw
    if not isinstance(value, numbers.Real):
        raise TypeError(
            f"Scorer {scorer_name(scorer)} returned {raw!r} ({type(raw).__name__}) for {what}; a scorer must return "
            "a number (float, higher is better). Fix the scorer so it returns a float."
        )
    score = float(value)
    if math.isnan(score):
        raise ValueError(
            f"Scorer {scorer_name(scorer)} returned NaN for {what}; NaN cannot be ranked. Fix the scorer to return "
            "a finite number (or -inf to reject a candidate)."
        )
    return score


def as_scores(values: Any, *, scorer: Any, count: int) -> list[float]:
    """Check a sequence scorer's return: one number per continuation (see `as_score`); tensors and arrays pass."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Sequence):
        raise TypeError(
            f"Scorer {scorer_name(scorer)} returned {values!r} ({type(values).__name__}); a sequence scorer must "
            f"return a list of {count} floats, one per continuation."
        )
    if len(values) != count:
        raise ValueError(
            f"Scorer {scorer_name(scorer)} returned {len(values)} scores for {count} continuations; return one "
            "float per continuation, in order."
        )
    return [as_score(v, scorer=scorer, what=f"continuation {i}") for i, v in enumerate(values)]
