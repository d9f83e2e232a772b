"""Output controls: stopping rules, logits processors and decoding drivers (search, reranking)."""

from steer_hydra.controls.output.stopping_rules import StoppingRules

__all__ = ["StoppingRules"]
