"""RewardGuidedDecoding (RAD): the model's top-k next tokens re-weighted by a reward model, as a logits processor.

RAD is `ValueGuidance` configured with the reward model as the value model, the probability of its `label` class as
the value, the top-k candidates and every other token masked; this module maps RAD's own arguments onto that
configuration (how it runs, the cached and the re-tokenized paths: `steer_hydra.controls.output.value_guidance`).

Invariants: tokens outside the top-k get -inf; a top-k token's score is its incoming score plus beta * reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.output.value_guidance import (
    HEAD_NAME,
    CandidateValues,
    ClassifierValues,
    ValueGuidance,
    ValueGuidedProcessor,
    check_guidance_args,
    decoder_parts,
    head_values,
    same_vocabulary,
    sequence_values,
)
from steer_hydra.core.controls import BaseArgs

__all__ = [
    "HEAD_NAME",
    "RewardGuidedDecoding",
    "RewardLogitsProcessor",
    "decoder_parts",
    "reward_from_logits",
    "same_vocabulary",
    "sequence_rewards",
]


def reward_from_logits(logits: torch.Tensor, label: int | None) -> torch.Tensor:
    """`[N, C]` head logits -> `[N]` rewards in [0, 1]: the probability of class `label` (default: the last class),
    or the sigmoid of the single logit of a one-output head."""
    return head_values(logits, label, "probability")


def sequence_rewards(
    reward: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, label: int | None = None
) -> torch.Tensor:
    """Reward of each left-padded row (`[N, T]` ids and mask) of a decoder classifier, read at its last position,
    without a cache."""
    return sequence_values(reward, ids, mask, label, "probability")


class RewardLogitsProcessor(ValueGuidedProcessor):
    """One call's RAD step: top-k candidates of every row scored by the reward model, then `score + beta * reward`.

    Built on the call's prompt ids and mask (left-padded rows). With `tokenizers=None` the reward model reads the
    model's token ids and keeps a KV cache over the prefixes (a decoder classifier); with `(model_tokenizer,
    reward_tokenizer)` each candidate sequence is decoded (special tokens skipped), re-tokenized and scored by the
    reward model's own forward, without a cache.
    `reward_batch_size` caps the candidate rows of one reward-model forward (None: all at once).
    """

    def __init__(
        self,
        reward: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        *,
        beta: float,
        top_k: int,
        label: int | None = None,
        reward_batch_size: int | None = None,
        tokenizers: tuple[Any, Any] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        values = ClassifierValues(
            reward,
            prompt_ids,
            prompt_mask,
            label=label,
            kind="probability",
            batch_size=reward_batch_size,
            tokenizers=tokenizers,
            pad_token_id=pad_token_id,
        )
        super().__init__(values, beta=beta, top_k=top_k)

    @classmethod
    def over(cls, values: CandidateValues, *, beta: float, top_k: int) -> RewardLogitsProcessor:
        """A RAD step over given candidate values (the control's: `ClassifierValues` of its reward model)."""
        processor = cls.__new__(cls)
        ValueGuidedProcessor.__init__(processor, values, beta=beta, top_k=top_k)
        return processor

    def rewards(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """`[B, k]` rewards of each row's sequence followed by each of its `[B, k]` candidate tokens."""
        return self.values(input_ids, candidates)


class RewardGuidedDecoding(ValueGuidance):
    """Reward-augmented decoding: each step re-weights the model's top-k next tokens by a reward model's score.

    Paper: Deng and Raffel, "Reward-Augmented Decoding: Efficient Controlled Text Generation With a Unidirectional
    Reward Model" (EMNLP 2023, arXiv 2310.09520). At each step the k most likely tokens x_1..x_k are scored by a
    unidirectional reward model on `prefix + x_i`; token x_i gets `z_i + beta * r_i` (z_i its incoming score, r_i
    in [0, 1]) and every other token -inf. Greedy decoding picks the best of these, sampling samples from their
    softmax (the paper's setting). The reward model's KV cache over the prefix is reused across steps when it
    shares the model's vocabulary (the paper's efficiency argument); otherwise the text is re-tokenized each step.
    A configuration of `ValueGuidance` (`value="probability"`, masked top-k, no normalization).

    Args:
        reward_model: reference of a sequence classifier (Hub id, path, or `steer_hydra:tiny-reward` for tests),
            ideally a decoder sharing the model's tokenizer (the cached path); any classifier works through
            re-tokenized text. Loaded at `steer()` on the model's device and dtype.
        beta: reward weight (>= 0); the paper's reference code defaults to 30 and its experiments sweep 10 to 50.
            0 leaves plain top-k decoding.
        top_k: candidates scored per step (the paper's k = 20).
        label: which class's probability is the reward (default: the last class, e.g. "positive" of a binary
            classifier); a one-output head's reward is the sigmoid of its logit (label must then be None or 0).
        reward_batch_size: most candidate rows (prefix x candidate) in one reward-model forward; None scores all
            rows x top_k candidates of a step at once.

    Hugging Face backend only (live logits processor, a second model in process). Batches (the reward cache follows
    the batch's left padding); no slot refill (rows admitted mid-decode would need the reward cache to admit them).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        reward_model: str
        beta: float = 30.0
        top_k: int = 20
        label: int | None = None
        reward_batch_size: int | None = None

        def validate(self) -> None:
            if not self.reward_model.strip():
                raise ValueError(
                    "RewardGuidedDecoding.reward_model must name a sequence classifier; got ''. "
                    "Fix: reward_model=<Hub id, path or steer_hydra:tiny-reward>."
                )
            check_guidance_args(
                "RewardGuidedDecoding",
                beta=self.beta,
                top_k=self.top_k,
                label=self.label,
                batch=("reward_batch_size", self.reward_batch_size),
                beta_fix="use the paper's range (10 to 50); to steer away from a class, set label to the other class",
                top_k_fix="use the paper's top_k=20",
            )

    value_model_field = "reward_model"
    reward_model: str
    reward_batch_size: int | None

    def _configure(self) -> None:
        self.value_model = self.reward_model
        self.value = "probability"
        self.normalize = "none"
        self.mask_non_candidates = True
        self.value_batch_size = self.reward_batch_size
        super()._configure()

    def processor(self, values: CandidateValues) -> RewardLogitsProcessor:
        return RewardLogitsProcessor.over(values, beta=self.beta, top_k=self.top_k)

    @property
    def reward(self) -> torch.nn.Module | None:
        """The loaded reward model (None before `steer()` and after `cleanup()`)."""
        return self.classifier
