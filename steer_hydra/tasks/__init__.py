"""Built-in Inspect tasks that run offline: short answer, multiple choice, and an instruction-following target task.

Importing this package registers the tasks with Inspect under `steer_hydra/<name>`; `SMOKE_TASKS` lists the
names the `smoke` suite runs. On the tiny random model they exercise the whole path (scores are near zero);
on a real instruction-tuned model they measure something.
"""

from steer_hydra.tasks.instruction_following import INSTRUCTION_CHECKS, instruction_checker, instruction_following
from steer_hydra.tasks.mcqa import mcqa
from steer_hydra.tasks.short_answer import short_answer

SMOKE_TASKS = ("steer_hydra/short_answer", "steer_hydra/mcqa", "steer_hydra/instruction_following")

__all__ = [
    "INSTRUCTION_CHECKS",
    "SMOKE_TASKS",
    "instruction_checker",
    "instruction_following",
    "mcqa",
    "short_answer",
]
