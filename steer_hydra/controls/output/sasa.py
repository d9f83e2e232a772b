"""SASA: self-disciplined autoregressive sampling, candidate tokens re-weighted by their margin against a subspace of an
unwanted attribute in the model's own representation space, as a logits processor.

How it runs: `steer()` takes the live model (Hugging Face) and either fits the subspace from labeled examples
(`data`: each example's last-token final hidden state, one closed-form linear discriminant between the wanted and
the unwanted examples, `probes.fit_linear_probe`) or takes a given one (`direction`, `offset`). Each call gets a
`ValueGuidedProcessor` over `SubspaceMarginValues`: the model's own KV cache over each row's prefix (a second cache
beside generate's, a `PrefixCache` on the model's trunk: advanced by the tokens added since the last step, prefilled
again when the sequences do not extend the ones it holds), and each of the row's candidate tokens run as one more
position on it; the candidate's value is the margin `direction . h + offset` of that position's final hidden state
h (positive: the wanted side). A row scores the same alone or in a padded batch. The extra forwards run on the same
model under the arm's state hooks, so the margin is read from the representation the steered model decodes with.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache
from steer_hydra.controls.output.probes import (
    Margin,
    encode_texts,
    exchange_rows,
    fit_linear_probe,
    states_of_rows,
    trunk_of,
    two_class_margin,
)
from steer_hydra.controls.output.value_guidance import (
    CandidateValues,
    ValueGuidance,
    cached_candidate_states,
    candidate_chunks,
    check_guidance_args,
)
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs

WANTED, UNWANTED = "wanted", "unwanted"


class SubspaceMarginValues:
    """The margin of `prefix + candidate` for one call's rows: the model's final hidden state at the candidate's
    position (one more position on the model's own prefix cache), projected on a unit direction plus an offset."""

    def __init__(
        self,
        model: torch.nn.Module,
        margin: Margin,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        *,
        batch_size: int | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.trunk = trunk_of(model)
        self.device = model.get_input_embeddings().weight.device
        self.margin = margin
        self.batch_size = batch_size
        self.prefix = PrefixCache(self.trunk, prompt_ids, prompt_mask, pad_token_id)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        ids, candidates = input_ids.to(self.device), candidates.to(self.device)
        self.prefix.advance(ids)
        batch, k = candidates.shape
        values = [
            self.margin(cached_candidate_states(self.prefix, self.trunk, ids, candidates, chunk).float())
            for chunk in candidate_chunks(batch, k, self.batch_size)
        ]
        return torch.cat(values).view(batch, k)


def labeled_rows(data: Sequence[Mapping[str, Any]], tokenizer: Any, owner: str) -> tuple[list[list[int]], list[str]]:
    """Token rows and `wanted`/`unwanted` labels of SASA's examples: `{text, label}` (label 1 or True: the unwanted
    attribute) as plain text, and `{prompt, positive, negative}` pairs as exchanges (the negative response unwanted)."""
    rows: list[list[int]] = []
    labels: list[str] = []
    for i, example in enumerate(data):
        if {"prompt", "positive", "negative"} <= set(example):
            prompt = str(example["prompt"])
            rows += exchange_rows(tokenizer, [(prompt, str(example["positive"])), (prompt, str(example["negative"]))])
            labels += [WANTED, UNWANTED]
        elif {"text", "label"} <= set(example):
            label = example["label"]
            if label not in (0, 1, True, False):
                raise ValueError(
                    f"{owner}.data[{i}].label must be 0 (wanted) or 1 (the unwanted attribute); got {label!r}. "
                    "Fix: label each text 0 or 1."
                )
            rows += encode_texts(tokenizer, [str(example["text"])])
            labels.append(UNWANTED if label else WANTED)
        else:
            raise ValueError(
                f"{owner}.data[{i}] has keys {sorted(example)}; an example is {{text, label}} (label 1: the unwanted "
                "attribute) or {prompt, positive, negative} (the negative response unwanted). Fix: use one of them."
            )
    return rows, labels


class SASA(ValueGuidance):
    """SASA: self-disciplined autoregressive sampling (Ko et al., "Large Language Models can Become Strong
    Self-Detoxifiers", ICLR 2025, arXiv 2410.03818).

    A linear classifier in the model's own embedding space (the final hidden state of a text's last token) separates
    texts with an unwanted attribute (e.g. toxic) from texts without it; its direction and offset define the signed
    margin of a context (positive: the wanted side). At each step each candidate token x is appended to the context,
    the model's hidden state of `context + x` gives its margin m(x), and x's score becomes `z(x) + beta * m(x)`:
    the distribution closest to the model's (in KL) that raises the expected margin, `q(x) ~ p(x) exp(beta m(x))`,
    so sampling drifts away from the unwanted subspace. The classifier is fitted in closed form from labeled `data`
    (linear discriminant analysis of the two classes, shared covariance shrunk by `shrinkage`), or given.

    Args:
        data: labeled examples to fit the subspace from at `steer()`: `{text, label}` (label 1: the unwanted
            attribute) or `{prompt, positive, negative}` pairs (the negative response unwanted, read as the
            pipeline reads an answer: the chat-templated prompt followed by the response).
        direction: a given classifier direction in the model's hidden size (normalized to unit length; the offset
            is divided by its norm); exactly one of `data` and `direction`.
        offset: the given classifier's offset (`direction . h + offset > 0`: the wanted side).
        beta: the margin's weight (>= 0; in units of the margin along the unit direction).
        top_k: candidates per step (each costs one position on the model); None: every token with a finite score.
        normalize: `none` (the closed form above), `softmax` (beta times the softmax of the candidates' margins:
            bounded shifts whatever the margins' scale) or `minmax`.
        candidate_batch_size: most candidate positions in one forward; None: all of a step at once.
        shrinkage: how far the pooled covariance is shrunk toward a multiple of the identity when fitting (0: none).
        fit_batch_size: examples per forward when fitting.

    Hugging Face backend only (the model's hidden states of candidate continuations, in process; see
    docs/controls.md for why not vLLM). Batches; no slot refill.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        data: list[dict] | None = None
        direction: list[float] | None = None
        offset: float = 0.0
        beta: float = 1.0
        top_k: int | None = 50
        normalize: Literal["none", "softmax", "minmax"] = "none"
        candidate_batch_size: int | None = None
        shrinkage: float = 0.05
        fit_batch_size: int = 8

        def validate(self) -> None:
            if (self.data is None) == (self.direction is None):
                raise ValueError(
                    "SASA needs exactly one of data (labeled examples to fit the subspace from) and direction (a given "
                    "classifier direction). Fix: pass data=[{text, label}, ...] or direction=[...]."
                )
            if self.data is not None and len(self.data) < 2:
                raise ValueError(
                    f"SASA.data holds {len(self.data)} example(s). Fix: give examples of both classes (at least two "
                    "of each, or two {prompt, positive, negative} pairs)."
                )
            if self.direction is not None and not any(self.direction):
                raise ValueError("SASA.direction is all zeros. Fix: give the classifier's direction in hidden units.")
            if not math.isfinite(self.offset):
                raise ValueError(f"SASA.offset must be finite; got {self.offset}. Fix: 0.0.")
            check_guidance_args(
                "SASA",
                beta=self.beta,
                top_k=self.top_k,
                label=None,
                batch=("candidate_batch_size", self.candidate_batch_size),
                beta_fix="a non-negative weight in margin units (e.g. 1.0)",
                top_k_fix="e.g. top_k=50, or None for every token with a finite score",
            )
            if not 0 <= self.shrinkage < 1:
                raise ValueError(f"SASA.shrinkage must be in [0, 1); got {self.shrinkage}. Fix: e.g. 0.05.")
            if self.fit_batch_size < 1:
                raise ValueError(f"SASA.fit_batch_size must be >= 1; got {self.fit_batch_size}. Fix: e.g. 8.")

    data: list[dict] | None
    direction: list[float] | None
    offset: float
    candidate_batch_size: int | None
    shrinkage: float
    fit_batch_size: int

    def _configure(self) -> None:
        self.value_model = ""
        self.value = "logit"
        self.label = None
        self.mask_non_candidates = True
        self.value_batch_size = self.candidate_batch_size
        self._model: torch.nn.Module | None = None
        self._margin: Margin | None = None
        super()._configure()

    @property
    def margin(self) -> Margin | None:
        """The subspace's margin (fitted or given; None before `steer()` and after `cleanup()`)."""
        return self._margin

    @property
    def vector_hash(self) -> str | None:
        if self._margin is None:
            return None
        digest = hashlib.sha256(self._margin.direction.float().contiguous().numpy().tobytes())
        digest.update(repr(float(self._margin.offset)).encode())
        return digest.hexdigest()[:16]

    def requirements(self) -> frozenset[Capability]:
        needs = {Capability.IN_PROCESS_TORCH}
        if self.data is not None:
            needs.add(Capability.HIDDEN_CAPTURE)
        return frozenset(needs)

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        if model is None:
            raise RuntimeError(
                "SASA needs the live model (it reads the model's hidden states of candidate continuations). "
                "Fix: use backend=huggingface."
            )
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        self.tokenizer = tokenizer
        hidden = int(model.get_input_embeddings().weight.shape[-1])
        if self.direction is not None:
            if len(self.direction) != hidden:
                raise ValueError(
                    f"SASA.direction has {len(self.direction)} entries but the model's hidden size is {hidden}. "
                    "Fix: give a direction fitted on this model (or fit one with data=)."
                )
            direction = torch.tensor(self.direction, dtype=torch.float32)
            norm = float(direction.norm())
            margin = Margin(direction / norm, float(self.offset) / norm)
        else:
            if tokenizer is None:
                raise RuntimeError("SASA needs the model's tokenizer to fit from data. Fix: pass the tokenizer.")
            rows, labels = labeled_rows(self.data, tokenizer, "SASA")
            states = states_of_rows(model, rows, tokenizer.pad_token_id, self.fit_batch_size)
            probe = fit_linear_probe(states, labels, shrinkage=self.shrinkage, owner="SASA")
            margin = two_class_margin(probe, WANTED)
        self._model, self._margin = model, margin
        return None

    def cleanup(self) -> None:
        self._model, self._margin = None, None

    def candidate_values(self, ids: torch.Tensor, mask: torch.Tensor | None) -> CandidateValues:
        if self._model is None or self._margin is None:
            raise RuntimeError("SASA has no subspace yet. Fix: call pipeline.steer() first.")
        return SubspaceMarginValues(
            self._model,
            self._margin,
            ids,
            mask,
            batch_size=self.candidate_batch_size,
            pad_token_id=getattr(self.tokenizer, "pad_token_id", None),
        )

    def margins_of(self, texts: Sequence[str]) -> torch.Tensor:
        """The margins of whole texts (their last token's state), e.g. to check a fitted subspace on held-out text."""
        if self._model is None or self._margin is None:
            raise RuntimeError("SASA has no subspace yet. Fix: call pipeline.steer() first.")
        rows = encode_texts(self.tokenizer, texts)
        return self._margin(states_of_rows(self._model, rows, self.tokenizer.pad_token_id, self.fit_batch_size))
