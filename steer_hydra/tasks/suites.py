"""Built-in suites over the built-in tasks: `smoke_suite()`, the Python form of `conf/suite/smoke.yaml`."""

from __future__ import annotations

from steer_hydra.evaluation.suite import InspectSuite

SMOKE_TASKS = ("steer_hydra/short_answer", "steer_hydra/mcqa", "steer_hydra/instruction_following")


def smoke_suite(*, limit: int | None = 12, max_tokens: int = 24) -> InspectSuite:
    """The `smoke` suite: the three built-in offline tasks (short answer, multiple choice, instruction following).

    Greedy, `limit` samples per task; runs on the tiny model in seconds and means something on a real model.
    """
    return InspectSuite(
        name="smoke",
        tasks=SMOKE_TASKS,
        limit=limit,
        generate_overrides={"temperature": 0.0, "max_tokens": max_tokens},
    )
