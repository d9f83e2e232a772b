"""ValueGuidance: a value model's estimate of each candidate next token shifts that token's score (a logits processor).

One processor covers a family of decoding-time methods that score the continuation `prefix + x` of each candidate
token x with a value model and add `beta * value` to x's score: RAD (a reward model's probability on the top-k,
the rest -inf; `RewardGuidedDecoding` is this control configured so), FUDGE (the log-probability of an attribute
from a classifier on the top-k, beta 1), ARGS (a reward model's raw score on the top-k) and SASA (the margin of
the model's own hidden state against a linear subspace; `SASA`).

How it runs: `steer()` loads the value model (a sequence classifier) and its tokenizer beside the pipeline's model
(the backend's `load_model`: same device and dtype) and decides how to score. When it is a decoder classifier (a
trunk with a KV cache and a `score` head) whose tokenizer has the model's vocabulary (the same token-to-id map and
an embedding row for every id the model scores), each call's `ClassifierValues` keeps the classifier's KV cache over
each row's prefix (a `PrefixCache`: advanced by the tokens added since the last step, positions and attention mask
from the prompt mask, prefilled again when the sequences do not extend the ones it holds) and scores the k candidates
of a row as one more position each on that cache, repeated k times, all rows in as few forwards as `value_batch_size`
allows; the value of a sequence is the head at its last token, so a row scores the same alone or in a padded batch.
Otherwise (another tokenizer, or an encoder classifier) each candidate sequence is decoded to text, re-tokenized with
the classifier's tokenizer (padded on the right, truncated from the left) and scored by its own forward and pooling,
without a cache. `cleanup()` drops the value model.

Invariants: the candidates of a row are its `top_k` highest incoming scores (all finite ones when `top_k` is None);
a candidate's score becomes its incoming score plus `beta *` its (normalized) value; with `mask_non_candidates`
every other token gets -inf, else it keeps its score.
"""

from __future__ import annotations

import copy
import gc
import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache, call_rows, positions, prompt_mask_for, release
from steer_hydra.controls.output.contrastive_guidance import output_vocab_size
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl, Reference

HEAD_NAME = "score"  # the head of transformers' decoder *ForSequenceClassification models (Llama, GPT-2, Qwen...)
VALUE_KINDS = ("probability", "log_probability", "logit")
NORMALIZATIONS = ("none", "softmax", "minmax")


# ---------------------------------------------------------------------- values of a classifier's head
def head_values(logits: torch.Tensor, label: int | None, kind: str = "probability") -> torch.Tensor:
    """`[N, C]` head logits -> `[N]` values of class `label` (default: the last class): its probability, its
    log-probability or its raw logit; a one-output head reads its single logit through a sigmoid (log-sigmoid)."""
    logits = logits.float()
    if logits.shape[-1] == 1:
        single = logits[:, 0]
        if kind == "probability":
            return torch.sigmoid(single)
        return torch.nn.functional.logsigmoid(single) if kind == "log_probability" else single
    column = -1 if label is None else label
    if kind == "probability":
        return torch.softmax(logits, dim=-1)[:, column]
    if kind == "log_probability":
        return torch.log_softmax(logits, dim=-1)[:, column]
    return logits[:, column]


def decoder_parts(classifier: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """`(trunk, head)` of a decoder sequence classifier (its base model, which takes a KV cache, and its `score`
    head applied per position), or None for other classifiers (encoders pool their own way)."""
    trunk, head = getattr(classifier, "base_model", None), getattr(classifier, HEAD_NAME, None)
    if trunk is None or trunk is classifier or not isinstance(head, torch.nn.Linear):
        return None
    if "use_cache" not in inspect.signature(type(trunk).forward).parameters:
        return None
    return trunk, head


@torch.no_grad()
def sequence_values(
    classifier: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    label: int | None = None,
    kind: str = "probability",
) -> torch.Tensor:
    """Value of each left-padded row (`[N, T]` ids and mask) of a decoder classifier, read at its last position,
    without a cache."""
    parts = decoder_parts(classifier)
    if parts is None:
        raise ValueError(
            f"sequence_values needs a decoder classifier with a `{HEAD_NAME}` head; got {type(classifier)}."
        )
    trunk, head = parts
    device = next(classifier.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    hidden = trunk(input_ids=ids, attention_mask=mask, position_ids=positions(mask), use_cache=False)
    return head_values(head(hidden.last_hidden_state[:, -1]), label, kind)


def expanded_cache(cache: Any, rows: torch.Tensor | None, repeats: int) -> Any:
    """A copy of `cache` holding `rows` (all when None), each repeated `repeats` times; `cache` is left as it is."""
    out = copy.copy(cache)
    out.layers = [copy.copy(layer) for layer in cache.layers]
    if rows is not None:
        out.batch_select_indices(rows)
    out.batch_repeat_interleave(repeats)
    return out


def candidate_chunks(rows: int, k: int, batch_size: int | None) -> Iterator[slice]:
    """Slices of prompt rows whose `rows x k` candidate positions fit `batch_size` (None: all at once)."""
    step = rows if batch_size is None else max(1, batch_size // k)
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def cached_candidate_states(
    prefix: PrefixCache, trunk: torch.nn.Module, ids: torch.Tensor, candidates: torch.Tensor, chunk: slice
) -> torch.Tensor:
    """`[n * k, H]` final hidden states of rows `chunk` of `ids`, each followed by each of its `k` candidates: one
    more position on `prefix`'s cache (brought to `ids` first by the caller), repeated k times."""
    batch, k = candidates.shape
    n = chunk.stop - chunk.start
    index = None if n == batch else torch.arange(chunk.start, chunk.stop, device=candidates.device)
    mask = prefix.mask[chunk]
    out = trunk(
        input_ids=candidates[chunk].reshape(n * k, 1),
        attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1).repeat_interleave(k, 0),
        position_ids=mask.sum(-1, keepdim=True).repeat_interleave(k, 0),
        use_cache=True,
        **{prefix.key: expanded_cache(prefix.cache, index, k)},
    )
    return out.last_hidden_state[:, -1]


# ---------------------------------------------------------------------- candidate values
class CandidateValues(Protocol):
    """`[B, k]` values of each row's sequence followed by each of its `[B, k]` candidate tokens."""

    def __call__(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor: ...


class ClassifierValues:
    """A sequence classifier's value of `prefix + candidate` for one call's rows.

    Built on the call's prompt ids and mask (left-padded rows). With `tokenizers=None` the classifier reads the
    model's token ids and keeps a KV cache over the prefixes (a decoder classifier); with `(model_tokenizer,
    classifier_tokenizer)` each candidate sequence is decoded (special tokens skipped), re-tokenized and scored by the
    classifier's own forward, without a cache. `batch_size` caps the candidate rows of one forward (None: all).
    """

    def __init__(
        self,
        classifier: torch.nn.Module,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        *,
        label: int | None = None,
        kind: str = "probability",
        batch_size: int | None = None,
        tokenizers: tuple[Any, Any] | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.classifier = classifier
        parts = decoder_parts(classifier) if tokenizers is None else None
        if tokenizers is None and parts is None:
            raise ValueError(
                f"ClassifierValues: a {type(classifier).__name__} has no cacheable trunk and `{HEAD_NAME}` head. "
                "Fix: pass tokenizers=(model_tokenizer, classifier_tokenizer) to score re-tokenized text."
            )
        self.trunk, self.head = parts if parts is not None else (None, None)
        self.device = next(classifier.parameters()).device
        self.prompt_ids = prompt_ids
        self.prompt_mask = torch.ones_like(prompt_ids) if prompt_mask is None else prompt_mask.to(prompt_ids.device)
        self.label, self.kind, self.batch_size = label, kind, batch_size
        self.tokenizers = tokenizers
        self.pad_token_id = pad_token_id  # leading pads of a driver's re-packed rollout are masked
        self.prefix = PrefixCache(self.trunk, prompt_ids, prompt_mask, pad_token_id) if self.trunk is not None else None

    def _cached(self, ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        self.prefix.advance(ids)
        batch, k = candidates.shape
        values = [
            head_values(
                self.head(cached_candidate_states(self.prefix, self.trunk, ids, candidates, chunk)),
                self.label,
                self.kind,
            )
            for chunk in candidate_chunks(batch, k, self.batch_size)
        ]
        return torch.cat(values).view(batch, k)

    def _text(self, ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        model_tokenizer, classifier_tokenizer = self.tokenizers
        mask = prompt_mask_for(ids, self.prompt_ids, self.prompt_mask, self.pad_token_id).bool()
        batch, k = candidates.shape
        texts = [
            model_tokenizer.decode(torch.cat([row[keep], candidate.view(1)]).tolist(), skip_special_tokens=True)
            for row, keep, options in zip(ids.cpu(), mask.cpu(), candidates.cpu(), strict=True)
            for candidate in options
        ]
        values = []
        step = len(texts) if self.batch_size is None else self.batch_size
        for start in range(0, len(texts), step):
            encoded = classifier_tokenizer(
                texts[start : start + step], padding=True, truncation=True, return_tensors="pt"
            )
            out = self.classifier(
                input_ids=encoded["input_ids"].to(self.device), attention_mask=encoded["attention_mask"].to(self.device)
            )
            values.append(head_values(out.logits, self.label, self.kind))
        return torch.cat(values).view(batch, k)

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        ids, candidates = input_ids.to(self.device), candidates.to(self.device)
        if self.tokenizers is None:
            return self._cached(ids, candidates)
        return self._text(ids, candidates)


# ---------------------------------------------------------------------- the processor
def normalized(values: torch.Tensor, valid: torch.Tensor, mode: str) -> torch.Tensor:
    """Values normalized per row over its valid candidates: `softmax`, or `minmax` to [0, 1] (a row whose values
    are all equal gets 0.5); `none` returns them as they are."""
    if mode == "none":
        return values
    if mode == "softmax":
        return torch.softmax(values.masked_fill(~valid, -math.inf), dim=-1).nan_to_num(0.0)
    if mode == "minmax":
        low = values.masked_fill(~valid, math.inf).min(dim=-1, keepdim=True).values
        high = values.masked_fill(~valid, -math.inf).max(dim=-1, keepdim=True).values
        span = high - low
        scaled = (values - low) / span.clamp_min(1e-12)
        return torch.where(span > 1e-12, scaled, torch.full_like(values, 0.5))
    raise ValueError(f"normalize must be one of {NORMALIZATIONS}; got {mode!r}.")


class ValueGuidedProcessor:
    """One call's value-guided step: each row's candidates scored by `values`, then `score + beta * value`.

    Args:
        values: the candidate values (`CandidateValues`).
        beta: the weight of the value.
        top_k: candidates per row (its highest incoming scores); None: every token with a finite score.
        normalize: `none`, or per row over its candidates `softmax` or `minmax`.
        mask_non_candidates: every other token gets -inf (else it keeps its score).
    """

    def __init__(
        self,
        values: CandidateValues,
        *,
        beta: float,
        top_k: int | None,
        normalize: str = "none",
        mask_non_candidates: bool = True,
    ) -> None:
        self.values = values
        self.beta, self.top_k = beta, top_k
        self.normalize = normalize
        self.mask_non_candidates = mask_non_candidates

    def candidate_count(self, scores: torch.Tensor) -> int:
        """How many candidates per row this step scores."""
        if self.top_k is not None:
            return min(self.top_k, scores.shape[-1])
        return max(1, int(torch.isfinite(scores).sum(dim=-1).max()))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        top = scores.topk(self.candidate_count(scores), dim=-1)
        values = self.values(input_ids, top.indices).to(scores.device)
        values = normalized(values, torch.isfinite(top.values), self.normalize)
        shifted = (top.values.float() + self.beta * values).to(scores.dtype)
        base = torch.full_like(scores, -math.inf) if self.mask_non_candidates else scores
        return base.scatter(-1, top.indices, shifted)


# ---------------------------------------------------------------------- classifier loading
def prepare_text_tokenizer(classifier: torch.nn.Module, tokenizer: Any, owner: str, field: str, reference: str) -> None:
    """Let a classifier's own tokenizer batch: a pad token (its EOS when it has none, as GPT-2 classifiers need, also
    set in the model's config for its pooling), right padding (a plain forward then needs no position ids, and the
    classifier's pooling finds the last real token) and truncation from the left, which keeps the candidate."""
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"{owner}.{field}={reference!r}: its tokenizer has neither a pad nor an EOS token to pad a batch with. "
                "Fix: use a classifier whose tokenizer defines a pad token."
            )
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(classifier.config, "pad_token_id", None) is None:
        classifier.config.pad_token_id = tokenizer.pad_token_id
    tokenizer.padding_side = "right"
    tokenizer.truncation_side = "left"


def same_vocabulary(model_tokenizer: Any, other_tokenizer: Any) -> bool:
    """Whether both tokenizers map every token to the same id (so a second model can read the model's ids)."""
    if model_tokenizer is None or other_tokenizer is None:
        return False
    return model_tokenizer.get_vocab() == other_tokenizer.get_vocab()


def check_guidance_args(
    owner: str,
    *,
    beta: float,
    top_k: int | None,
    label: int | None,
    batch: tuple[str, Any],
    beta_fix: str = (
        "a non-negative weight (0 leaves the candidates' scores as they are); to steer away from a class, set label "
        "to the other class"
    ),
    top_k_fix: str = "e.g. top_k=20, or None for every token with a finite score",
) -> None:
    """Range checks shared by `ValueGuidance` and its configurations (errors name the field and the fix)."""
    if not (math.isfinite(beta) and beta >= 0):
        raise ValueError(f"{owner}.beta must be a finite number >= 0; got {beta}. Fix: {beta_fix}.")
    if top_k is not None and top_k < 1:
        raise ValueError(f"{owner}.top_k must be >= 1; got {top_k}. Fix: {top_k_fix}.")
    if label is not None and label < 0:
        raise ValueError(
            f"{owner}.label must be a class index >= 0 or None; got {label}. "
            "Fix: label=None (the last class) or the index of the class to favour."
        )
    name, value = batch
    if value is not None and value < 1:
        raise ValueError(
            f"{owner}.{name} must be >= 1 or None; got {value}. "
            f"Fix: {name}=None (all candidates of a step at once) or a positive row count."
        )


# ---------------------------------------------------------------------- the control
class ValueGuidance(OutputControl):
    """Value-guided decoding: a value model's estimate of each candidate continuation shifts the token's score.

    The generic form of reward- and classifier-guided decoding. At each step the candidates x_1..x_k (the `top_k`
    highest scores, or every finite one) are scored by a sequence classifier on `prefix + x_i`, and x_i's score
    becomes `z_i + beta * v_i` (z_i its incoming score, v_i the value, optionally normalized over the candidates);
    other tokens get -inf (`mask_non_candidates`) or keep their score. Configurations from the literature:

    - RAD (Deng and Raffel, EMNLP 2023, arXiv 2310.09520): `value="probability"`, `top_k=20`, `beta` 10-50, masked
      (`RewardGuidedDecoding`, `conf/control/reward_guided_decoding.yaml`).
    - FUDGE (Yang and Klein, NAACL 2021, arXiv 2104.05218): an attribute classifier's `value="log_probability"` of
      the wanted class added to the model's scores with `beta=1` on the top candidates (Bayes' rule:
      `log p(x | prefix) + log p(attribute | prefix, x)`) (`conf/control/fudge.yaml`).
    - ARGS (Khanov et al., ICLR 2024, arXiv 2402.01694): a reward model's raw score, `value="logit"`, weighted by
      `beta` on the top-k (`conf/control/args_guidance.yaml`).
    - SASA (Ko et al., ICLR 2025, arXiv 2410.03818): the value is a linear-subspace margin of the model's own
      hidden state (`SASA`).

    Args:
        value_model: reference of a sequence classifier (Hub id, path, or `steer_hydra:tiny-reward` for tests),
            ideally a decoder sharing the model's tokenizer (its KV cache is then reused across steps); any
            classifier works through re-tokenized text. Loaded at `steer()` on the model's device and dtype.
        beta: the value's weight (>= 0).
        top_k: candidates scored per step; None scores every token with a finite score (costly: one classifier
            position per vocabulary entry).
        value: how the head becomes a value: `probability` (of class `label`; sigmoid of a one-output head),
            `log_probability`, or the raw `logit`.
        label: the class whose value is read (default: the last class).
        normalize: `none`, or per row over its candidates `softmax` or `minmax`.
        mask_non_candidates: tokens outside the candidates get -inf (RAD, FUDGE, ARGS), else they keep their score.
        value_batch_size: most candidate rows (prefix x candidate) in one classifier forward; None: all at once.

    Hugging Face backend only (a live logits processor and a second model in process; see docs/controls.md for why
    not vLLM). Batches (the classifier's cache follows the batch's left padding); no slot refill.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        value_model: str
        beta: float = 1.0
        top_k: int | None = 20
        value: Literal["probability", "log_probability", "logit"] = "probability"
        label: int | None = None
        normalize: Literal["none", "softmax", "minmax"] = "none"
        mask_non_candidates: bool = True
        value_batch_size: int | None = None

        def validate(self) -> None:
            if not self.value_model.strip():
                raise ValueError(
                    "ValueGuidance.value_model must name a sequence classifier; got ''. "
                    "Fix: value_model=<Hub id, path or steer_hydra:tiny-reward>."
                )
            check_guidance_args(
                "ValueGuidance",
                beta=self.beta,
                top_k=self.top_k,
                label=self.label,
                batch=("value_batch_size", self.value_batch_size),
            )

    supports_batching = True
    supports_refill = False
    # the Args field naming the value model, in messages (a configuration names it its own way)
    value_model_field: str = "value_model"

    value_model: str
    beta: float
    top_k: int | None
    value: str
    label: int | None
    normalize: str
    mask_non_candidates: bool
    value_batch_size: int | None

    def _configure(self) -> None:
        self._classifier: torch.nn.Module | None = None
        self._tokenizers: tuple[Any, Any] | None = None

    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The value model `steer()` loads as a sequence classifier (its head must have been trained)."""
        value = args.get(cls.value_model_field)
        return (
            {cls.value_model_field: Reference(value, "classifier")} if isinstance(value, str) and value.strip() else {}
        )

    @property
    def classifier(self) -> torch.nn.Module | None:
        """The loaded value model (None before `steer()` and after `cleanup()`)."""
        return self._classifier

    @property
    def uses_prefix_cache(self) -> bool:
        """Whether the value model reads the model's token ids with a prefix KV cache (set at `steer()`)."""
        return self._classifier is not None and self._tokenizers is None

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def steer(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any = None,
        load_model: Callable[..., Any] | None = None,
        **kwargs: Any,
    ) -> None:
        owner, field = type(self).__name__, self.value_model_field
        if model is None or load_model is None:
            raise RuntimeError(
                f"{owner} needs the live model and its {field} in this process. Fix: use backend=huggingface."
            )
        classifier, classifier_tokenizer = load_model(
            self.value_model, head="sequence_classification", with_tokenizer=True
        )
        classes = int(getattr(classifier.config, "num_labels", 1))
        if self.label is not None and self.label >= max(classes, 1):
            del classifier
            gc.collect()
            raise ValueError(
                f"{owner}.label={self.label} but {field}={self.value_model!r} has {classes} "
                f"class(es). Fix: label in 0..{max(classes, 1) - 1}, or None for the last class."
            )
        shared = (
            decoder_parts(classifier) is not None
            and same_vocabulary(tokenizer, classifier_tokenizer)
            and classifier.get_input_embeddings().num_embeddings >= output_vocab_size(model)
        )
        if not shared:
            if tokenizer is None:
                raise RuntimeError(
                    f"{owner} needs the model's tokenizer to re-tokenize text for its {field}. "
                    "Fix: build the pipeline with its tokenizer."
                )
            prepare_text_tokenizer(classifier, classifier_tokenizer, owner, field, self.value_model)
        self._classifier = classifier
        self._tokenizers = None if shared else (tokenizer, classifier_tokenizer)
        return None

    def cleanup(self) -> None:
        if self._classifier is not None:
            device, self._classifier, self._tokenizers = next(self._classifier.parameters()).device, None, None
            release(device)

    def candidate_values(self, ids: torch.Tensor, mask: torch.Tensor | None) -> CandidateValues:
        """The values of one call (built on its left-padded prompt rows)."""
        if self._classifier is None:
            raise RuntimeError(f"{type(self).__name__} has no value model loaded. Fix: call pipeline.steer() first.")
        return ClassifierValues(
            self._classifier,
            ids,
            mask,
            label=self.label,
            kind=self.value,
            batch_size=self.value_batch_size,
            tokenizers=self._tokenizers,
            pad_token_id=getattr(self.tokenizer, "pad_token_id", None),
        )

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        ids, mask = call_rows(input_ids, kwargs)
        return [self.processor(self.candidate_values(ids, mask))]

    def processor(self, values: CandidateValues) -> ValueGuidedProcessor:
        """The step processor of one call over its candidate values."""
        return ValueGuidedProcessor(
            values,
            beta=self.beta,
            top_k=self.top_k,
            normalize=self.normalize,
            mask_non_candidates=self.mask_non_candidates,
        )
