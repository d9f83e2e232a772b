"""`runtime_kwargs_solver`: generation that delivers a sample's per-sample runtime kwargs to the pipeline."""

from __future__ import annotations

from inspect_ai.solver import Generate, Solver, TaskState, solver

from steer_hydra.evaluation.provider import RUNTIME_KWARGS_EXTRA_BODY_KEY


@solver
def runtime_kwargs_solver(key: str = "runtime_kwargs") -> Solver:
    """Generate with `Sample.metadata[key]` (a mapping) as this sample's per-sample runtime kwargs.

    Use it in place of `generate()` in the solver chain. The mapping travels in
    `GenerateConfig.extra_body["runtime_kwargs"]` to the steer_hydra provider, which collates each "row"-scoped
    value row by row across a batched dispatch (names no enabled control declares are inert, so one task can
    carry the steering inputs of every arm). A sample without the key generates with none.

    Args:
        key: The metadata key holding the sample's runtime kwargs.
    """

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        runtime_kwargs = dict(state.metadata.get(key) or {})
        return await generate(state, extra_body={RUNTIME_KWARGS_EXTRA_BODY_KEY: runtime_kwargs})

    return solve
