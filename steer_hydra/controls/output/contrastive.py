"""ContrastiveDecoding: expert minus amateur log-probabilities under a plausibility cut, as a logits processor.

How it runs: `steer()` loads the amateur beside the pipeline's model (the backend's `load_model`: same device and
dtype) and checks that both score the same vocabulary. Each call gets a fresh `ContrastiveLogitsProcessor` built
on the call's left-padded prompt and its mask; at each step it advances the amateur by the tokens added since the
last step with the amateur's own KV cache (positions and attention mask from the prompt mask, every generated token
counting), so a row decodes the same alone or in a batch. `cleanup()` drops the amateur.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache, call_rows, release
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl


def output_vocab_size(model: torch.nn.Module) -> int:
    """How many scores a causal LM produces per position (its output embedding's rows)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def contrastive_scores(
    expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float, amateur_temperature: float = 1.0
) -> torch.Tensor:
    """`log p_exp - log p_ama` on tokens with `p_exp >= alpha * max p_exp`, `-inf` elsewhere (the CD objective)."""
    expert = torch.log_softmax(expert_logits.float(), dim=-1)
    amateur = torch.log_softmax(amateur_logits.float() / amateur_temperature, dim=-1)
    cutoff = expert.max(dim=-1, keepdim=True).values + math.log(alpha)
    scores = expert - amateur
    return scores.masked_fill(expert < cutoff, -float("inf")).to(expert_logits.dtype)


class ContrastiveLogitsProcessor:
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
        self.amateur = PrefixCache(amateur, prompt_ids, prompt_mask, pad_token_id)
        self.alpha, self.amateur_temperature = alpha, amateur_temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        amateur_logits = self.amateur.advance(input_ids).logits[:, -1, :]
        if amateur_logits.shape[-1] != scores.shape[-1]:
            raise RuntimeError(
                f"ContrastiveDecoding: the amateur scores {amateur_logits.shape[-1]} tokens, the model "
                f"{scores.shape[-1]}. Fix: pick an amateur that shares the model's tokenizer (amateur=...)."
            )
        return contrastive_scores(scores, amateur_logits.to(scores.device), self.alpha, self.amateur_temperature)


class ContrastiveDecoding(OutputControl):
    """Contrastive decoding: prefer tokens the model (the expert) likes much more than a weaker amateur model.

    Paper: Li et al., "Contrastive Decoding: Open-ended Text Generation as Optimization" (ACL 2023,
    arXiv 2210.15097). At each step the score of token x is `log p_exp(x) - log p_ama(x)` over the adaptive
    plausibility set `{x : p_exp(x) >= alpha * max_w p_exp(w)}`; every other token gets -inf. Greedy decoding on
    these scores is the paper's search (its beam search is the same objective under `num_beams`).

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
            if not self.amateur.strip():
                raise ValueError(
                    "ContrastiveDecoding.amateur must name a model; got ''. "
                    "Fix: amateur=<Hub id, path or steer_hydra:tiny?...> sharing the model's tokenizer."
                )
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

    supports_batching = True
    supports_refill = False

    def _configure(self) -> None:
        self._amateur: torch.nn.Module | None = None

    @property
    def amateur_model(self) -> torch.nn.Module | None:
        """The loaded amateur (None before `steer()` and after `cleanup()`)."""
        return self._amateur

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def steer(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any = None,
        load_model: Callable[[str], torch.nn.Module] | None = None,
        **kwargs: Any,
    ) -> None:
        if model is None or load_model is None:
            raise RuntimeError(
                "ContrastiveDecoding needs the live model and a second model in this process. "
                "Fix: use backend=huggingface."
            )
        amateur = load_model(self.amateur)
        expected, got = output_vocab_size(model), output_vocab_size(amateur)
        if expected != got:
            del amateur
            gc.collect()
            raise ValueError(
                f"ContrastiveDecoding.amateur={self.amateur!r} scores {got} tokens but the model scores {expected}: "
                "the amateur must share the model's tokenizer. Fix: set amateur to a smaller model of the same "
                "family (same tokenizer and vocabulary)."
            )
        self._amateur = amateur
        return None

    def cleanup(self) -> None:
        if self._amateur is not None:
            device, self._amateur = next(self._amateur.parameters()).device, None
            release(device)

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        if self._amateur is None:
            raise RuntimeError("ContrastiveDecoding has no amateur loaded. Fix: call pipeline.steer() first.")
        ids, mask = call_rows(input_ids, kwargs)
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return [ContrastiveLogitsProcessor(self._amateur, ids, mask, self.alpha, self.amateur_temperature, pad)]
