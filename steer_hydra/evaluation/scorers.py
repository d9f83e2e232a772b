"""`sample_scorer_from_inspect`: an Inspect scorer as a synchronous `(response, row) -> float` reward for controls.

Controls that optimize or rerank against a per-row score (prompt optimizers, best-of-n, search decoding) call a
plain synchronous function. The adapter builds a minimal `TaskState` for one (input, response) pair, awaits the
Inspect scorer and converts its `Score` to a float. It bridges into async code from wherever the control runs:

- plain synchronous code (no event loop): `anyio.run`;
- an AnyIO worker thread (the provider's dispatch thread): `anyio.from_thread.run` on the host loop;
- inside a running asyncio loop (a notebook): `nest_asyncio2` re-entry, as Inspect itself does;
- inside a running trio task: re-entry is impossible, so it raises RuntimeError.

A model-graded scorer used this way sends grader traffic from inside a control's `steer()` or decode loop; the
grader must be a different model from the pipeline under evaluation (self-grading is circular, and grader calls
routed to the same provider would wait on the collator lock the dispatch holds).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import anyio.from_thread
import sniffio

T = TypeVar("T")

SampleScorer = Callable[[str, Mapping[str, Any]], float]


def sample_scorer_from_inspect(
    scorer: Any,
    *,
    target_key: str = "reference",
    to_float: Callable[[Any], float] | None = None,
    model_name: str = "steer_hydra/sample-scorer",
) -> SampleScorer:
    """Adapt an Inspect `Scorer` into a synchronous `(response, row) -> float`.

    The row holds `"input"`, optionally the target under `target_key` (a string or a list of accepted answers;
    missing or empty scores against ""), and any other dataset columns (all of them become the state's metadata).

    Args:
        scorer: An Inspect scorer (e.g. `includes()`, `match()`, `model_graded_fact(model=...)`).
        target_key: The row key holding the reference answer.
        to_float: Converts a `Score.value` to a float; defaults to Inspect's `value_to_float()`.
        model_name: The `provider/name` recorded as the state's model.

    Returns:
        A function scoring one response against one row.

    Raises (from the returned function):
        ValueError: If the scorer returns no Score.
        RuntimeError: If called inside a running trio task.
    """
    from inspect_ai.model import ChatMessageAssistant, ChatMessageUser, ModelName, ModelOutput
    from inspect_ai.scorer import Target, value_to_float
    from inspect_ai.solver import TaskState

    convert = to_float if to_float is not None else value_to_float()

    async def score_one(response: str, row: Mapping[str, Any]) -> float:
        prompt = str(row["input"])
        target = Target(row.get(target_key) or "")
        state = TaskState(
            model=ModelName(model_name),
            sample_id=0,
            epoch=0,
            input=prompt,
            messages=[ChatMessageUser(content=prompt), ChatMessageAssistant(content=response)],
            target=target,
            output=ModelOutput.from_content(model_name, response),
            metadata=dict(row),
        )
        score = await scorer(state, target)
        if score is None:
            raise ValueError(
                f"The scorer {getattr(scorer, '__name__', type(scorer).__name__)} returned no Score for this "
                "response; a reward needs a Score on every row."
            )
        return float(convert(score.value))

    def sample_scorer(response: str, row: Mapping[str, Any]) -> float:
        return run_coroutine_sync(lambda: score_one(response, row))

    return sample_scorer


def run_coroutine_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run `factory()`'s awaitable to completion from synchronous code, wherever that code runs (see module doc)."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = None
    if library == "trio":
        raise RuntimeError(
            "sample_scorer_from_inspect cannot run inside a running trio task: trio has no re-entrant event loop. "
            "Call the scorer from a worker thread (trio.to_thread / anyio.to_thread.run_sync) or from plain code."
        )
    if library == "asyncio":
        import nest_asyncio2

        nest_asyncio2.apply()
        return asyncio.run(_as_coroutine(factory))
    if _in_anyio_worker_thread():
        return anyio.from_thread.run(_as_coroutine, factory)
    return anyio.run(_as_coroutine, factory)


async def _as_coroutine(factory: Callable[[], Awaitable[T]]) -> T:
    return await factory()


def _in_anyio_worker_thread() -> bool:
    """Whether this thread was started by `anyio.to_thread.run_sync` (so the host loop is reachable)."""
    try:
        anyio.from_thread.check_cancelled()
    except RuntimeError:  # NoEventLoopError: not an AnyIO worker thread
        return False
    return True
