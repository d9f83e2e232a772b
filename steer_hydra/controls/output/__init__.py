"""Output controls: stopping rules, logits processors and decoding drivers (search, reranking)."""

from steer_hydra.controls.output.best_of_n import BestOfN
from steer_hydra.controls.output.constrained import ConstrainedDecoding, GrammarLogitsProcessor
from steer_hydra.controls.output.contrastive import ContrastiveDecoding, ContrastiveLogitsProcessor
from steer_hydra.controls.output.contrastive_guidance import (
    ContrastiveGuidance,
    DExperts,
    MixingLogitsProcessor,
    ProxyTuning,
)
from steer_hydra.controls.output.deal import DeAL
from steer_hydra.controls.output.phased import PhasedDecoding
from steer_hydra.controls.output.reward_guided import RewardGuidedDecoding, RewardLogitsProcessor
from steer_hydra.controls.output.routed import KeywordRouter, RoutedDecoding
from steer_hydra.controls.output.sasa import SASA, SubspaceMarginValues
from steer_hydra.controls.output.scorers import MajorityVoteScorer
from steer_hydra.controls.output.search import (
    Candidate,
    Frontier,
    SampleSequenceScorer,
    SearchDriver,
    SearchTrace,
    SegmentProposer,
)
from steer_hydra.controls.output.search_decoding import SearchDecoding
from steer_hydra.controls.output.stopping_rules import StoppingRules
from steer_hydra.controls.output.thinking_budget import ThinkingBudget
from steer_hydra.controls.output.value_guidance import ClassifierValues, ValueGuidance, ValueGuidedProcessor

__all__ = [
    "BestOfN",
    "Candidate",
    "ConstrainedDecoding",
    "ClassifierValues",
    "ContrastiveDecoding",
    "ContrastiveGuidance",
    "ContrastiveLogitsProcessor",
    "DExperts",
    "DeAL",
    "Frontier",
    "GrammarLogitsProcessor",
    "KeywordRouter",
    "MajorityVoteScorer",
    "MixingLogitsProcessor",
    "PhasedDecoding",
    "ProxyTuning",
    "RewardGuidedDecoding",
    "RewardLogitsProcessor",
    "RoutedDecoding",
    "SASA",
    "SampleSequenceScorer",
    "SearchDecoding",
    "SearchDriver",
    "SearchTrace",
    "SegmentProposer",
    "StoppingRules",
    "SubspaceMarginValues",
    "ThinkingBudget",
    "ValueGuidance",
    "ValueGuidedProcessor",
]
