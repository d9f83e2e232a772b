"""Prompt optimizers: input controls whose instruction (a system prompt or a prefix of the user's message) is chosen
at `steer()` against a `SampleScorer` on training rows: PRewrite (an RL-trained rewriter), CPO (a per-query choice
by a causal effect model) and GEPA (reflective evolution, through the gepa package)."""

from steer_hydra.controls.optimizers.base import InspectProposer, PromptOptimizer
from steer_hydra.controls.optimizers.cpo import CPO
from steer_hydra.controls.optimizers.gepa import GEPAPrompt
from steer_hydra.controls.optimizers.prewrite import PRewrite

__all__ = ["CPO", "GEPAPrompt", "InspectProposer", "PRewrite", "PromptOptimizer"]
