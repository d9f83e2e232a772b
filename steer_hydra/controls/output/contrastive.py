"""ContrastiveDecoding: expert minus amateur log-probabilities under a plausibility cut, as a logits processor.

Contrastive decoding is `ContrastiveGuidance` configured with the amateur as its one second model at weight -1, in
log-probability space, under the plausibility cut `alpha`; this module maps its own arguments onto that
configuration (how it runs, the amateur's KV cache: `steer_hydra.controls.output.contrastive_guidance`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from steer_hydra.controls.output.contrastive_guidance import (
    ContrastiveGuidance,
    MixingLogitsProcessor,
    check_model_reference,
    mixed_scores,
    output_vocab_size,
)
from steer_hydra.core.controls import BaseArgs

__all__ = ["ContrastiveDecoding", "ContrastiveLogitsProcessor", "contrastive_scores", "output_vocab_size"]


def contrastive_scores(
    expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float, amateur_temperature: float = 1.0
) -> torch.Tensor:
    """`log p_exp - log p_ama` on tokens with `p_exp >= alpha * max p_exp`, `-inf` elsewhere (the CD objective)."""
    return mixed_scores(
        expert_logits, [amateur_logits], [-1.0], [amateur_temperature], space="log_probs", plausibility=alpha
    )


class ContrastiveLogitsProcessor(MixingLogitsProcessor):
    """One call's contrastive step: the amateur runs incrementally beside the expert with its own KV cache (a
    `PrefixCache` over the call's rows: prefilled again when the sequences do not extend the ones it holds)."""

    def __init__(
        self,
        amateur: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        alpha: float,
        amateur_temperature: float = 1.0,
        pad_token_id: int | None = None,
    ) -> None:
        super().__init__(
            [amateur],
            prompt_ids,
            prompt_mask,
            weights=[-1.0],
            temperatures=[amateur_temperature],
            space="log_probs",
            plausibility=alpha,
            pad_token_id=pad_token_id,
            owner="ContrastiveDecoding",
            fields=["amateur"],
        )


class ContrastiveDecoding(ContrastiveGuidance):
    """Contrastive decoding: prefer tokens the model (the expert) likes much more than a weaker amateur model.

    Paper: Li et al., "Contrastive Decoding: Open-ended Text Generation as Optimization" (ACL 2023,
    arXiv 2210.15097). At each step the score of token x is `log p_exp(x) - log p_ama(x)` over the adaptive
    plausibility set `{x : p_exp(x) >= alpha * max_w p_exp(w)}`; every other token gets -inf. Greedy decoding on
    these scores is the paper's search (its beam search is the same objective under `num_beams`). A configuration of
    `ContrastiveGuidance` (one second model at weight -1, log-probabilities, `plausibility=alpha`).

    Args:
        amateur: model reference of the amateur (`steer_hydra:tiny?...`, a Hub id or a path); it must share the
            model's tokenizer (same vocabulary size). Loaded at `steer()` on the model's device and dtype.
        alpha: plausibility threshold in (0, 1]; the paper's default 0.1. 1 keeps only the expert's argmax.
        amateur_temperature: the amateur's softmax temperature (the paper's tau; 1.0 = its plain log-probs).

    Hugging Face backend only (live logits processor, a second model in process). Batches (the amateur's cache
    follows the batch's left padding); no slot refill (rows admitted mid-decode would need the amateur's cache to
    admit them).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        amateur: str
        alpha: float = 0.1
        amateur_temperature: float = 1.0

        def validate(self) -> None:
            check_model_reference("ContrastiveDecoding", "amateur", self.amateur)
            if not (math.isfinite(self.alpha) and 0 < self.alpha <= 1):
                raise ValueError(
                    f"ContrastiveDecoding.alpha must be in (0, 1]; got {self.alpha}. "
                    "Fix: use the paper's alpha=0.1 (0 would admit every token, leaving the amateur's worst ones)."
                )
            if not (math.isfinite(self.amateur_temperature) and self.amateur_temperature > 0):
                raise ValueError(
                    f"ContrastiveDecoding.amateur_temperature must be a finite number > 0; "
                    f"got {self.amateur_temperature}. Fix: use 1.0."
                )

    amateur: str
    alpha: float
    amateur_temperature: float

    def _configure(self) -> None:
        self.models = [self.amateur]
        self.weights = [-1.0]
        self.temperatures = [self.amateur_temperature]
        self.base_weight = 1.0
        self.space = "log_probs"
        self.plausibility = self.alpha
        self.top_p = None
        super()._configure()

    @property
    def model_fields(self) -> list[str]:
        return ["amateur"]

    @property
    def amateur_model(self) -> torch.nn.Module | None:
        """The loaded amateur (None before `steer()` and after `cleanup()`)."""
        return self._loaded[0] if self._loaded else None
