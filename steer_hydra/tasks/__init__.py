"""Built-in Inspect tasks that run offline, each with at least 60 samples generated from fixed tables and ids.

Capability: `short_answer` (one-word facts), `arithmetic`, `mcqa` (scored on the letter or the option text).
Target behaviours: `instruction_following` (verifiable checks; the instruction travels as PASTA `substrings`)
and `concept_steering` (AxBench-style: neutral instructions, concept / relevance / fluency / harmonic scores,
disjoint `dev` and `test` splits; its concept is a small YAML file, `concepts.py`, built in under `concept_data/`
or the user's own). Importing this package registers the tasks with Inspect under
`steer_hydra/<name>`; Inspect imports it itself (through the `inspect_ai` entry point, `app/inspect_entry.py`)
the first time it resolves a `steer_hydra/...` task name. `smoke_suite()` runs `SMOKE_TASKS`. On the tiny
random model they exercise the whole path (scores are near zero); on SmolLM2 (`model=smollm2`) they measure
something.
"""

from steer_hydra.tasks.arithmetic import arithmetic
from steer_hydra.tasks.concept_steering import concept_steering
from steer_hydra.tasks.concepts import Concept, ConceptFileError, ContrastPair, builtin_concepts, load_concept
from steer_hydra.tasks.instruction_following import INSTRUCTION_CHECKS, instruction_checker, instruction_following
from steer_hydra.tasks.mcqa import mcqa
from steer_hydra.tasks.short_answer import short_answer
from steer_hydra.tasks.suites import SMOKE_TASKS, smoke_suite

__all__ = [
    "INSTRUCTION_CHECKS",
    "Concept",
    "ConceptFileError",
    "ContrastPair",
    "arithmetic",
    "builtin_concepts",
    "concept_steering",
    "load_concept",
    "SMOKE_TASKS",
    "instruction_checker",
    "instruction_following",
    "mcqa",
    "short_answer",
    "smoke_suite",
]
