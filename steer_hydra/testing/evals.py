"""`eval_one`: one Inspect eval of one task on a provider model, the way tests and benchmarks run one."""

from __future__ import annotations

from typing import Any


def eval_one(task: Any, model: Any, *, log_dir: Any = None, **eval_kwargs: Any) -> Any:
    """Evaluate `task` on `model` (an Inspect `Model` over a steered pipeline) with the display off and the
    provider's own `max_connections()` passed explicitly (Inspect's adaptive concurrency ignores it otherwise);
    `log_dir=None` keeps the log in memory. Returns the one `EvalLog`; closing the model is left to the caller."""
    from inspect_ai import eval as inspect_eval

    (log,) = inspect_eval(
        task,
        model=model,
        display="none",
        log_dir=None if log_dir is None else str(log_dir),
        max_connections=model.api.max_connections(),
        **eval_kwargs,
    )
    return log
