"""State controls: hooks on attention and the residual stream during a call (PASTA, CAA, ActAdd), and built-in
contrastive datasets to fit vectors from (`concept_pairs`)."""

from steer_hydra.controls.state.actadd import ActAdd
from steer_hydra.controls.state.caa import CAA
from steer_hydra.controls.state.concepts import (
    CONCEPTS,
    concept_actadd_prompts,
    concept_pairs,
    concept_system_prompt,
)
from steer_hydra.controls.state.pasta import PASTA
from steer_hydra.controls.state.vectors import SteeringVector

__all__ = [
    "CAA",
    "CONCEPTS",
    "PASTA",
    "ActAdd",
    "SteeringVector",
    "concept_actadd_prompts",
    "concept_pairs",
    "concept_system_prompt",
]
