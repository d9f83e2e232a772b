"""ContrastiveGuidance: the next-token scores of second models mixed with the model's, as a logits processor.

The generic form of decoding-time ensembles of a model with smaller ones that share its tokenizer: contrastive
decoding (the model minus an amateur, under a plausibility cut; `ContrastiveDecoding`), DExperts (plus an expert,
minus an anti-expert, inside the model's nucleus; `DExperts`) and proxy-tuning (plus a tuned small model, minus its
untuned base; `ProxyTuning`).

How it runs: `steer()` loads every second model beside the pipeline's model (the backend's `load_model`: same
device and dtype) and checks that each scores the model's vocabulary. Each call gets a fresh `MixingLogitsProcessor`
built on the call's left-padded prompt and its mask; at each step every second model is advanced by the tokens added
since the last step with its own KV cache (a `PrefixCache`: positions and attention mask from the prompt mask, every
generated token counting; prefilled again when the sequences do not extend the ones it holds), so a row decodes the
same alone or in a batch. `cleanup()` drops the second models.

The mix, per row (`mixed_scores`): `base_weight * s(model) + sum_i weights[i] * s_i(model_i / temperatures[i])`, where
`s` is the raw logits (`space="logits"`) or the log-softmax (`space="log_probs"`); then tokens outside the model's
nucleus (`top_p`) or below `plausibility` times the model's most likely token's probability get -inf.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.controls.output.auxiliary import PrefixCache, call_rows, release
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl, Reference

SPACES = ("logits", "log_probs")


def output_vocab_size(model: torch.nn.Module) -> int:
    """How many scores a causal LM produces per position (its output embedding's rows)."""
    head = model.get_output_embeddings()
    if head is not None and getattr(head, "weight", None) is not None:
        return int(head.weight.shape[0])
    return int(model.config.vocab_size)


def nucleus_mask(log_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """True for the tokens outside each row's nucleus: the smallest set of most likely tokens whose probability
    reaches `top_p` (the most likely token always stays)."""
    ordered, order = log_probs.sort(dim=-1, descending=True)
    probs = ordered.exp()
    before = probs.cumsum(dim=-1) - probs  # the mass of the tokens ranked above each one
    outside_sorted = before >= top_p
    outside_sorted[..., 0] = False
    return torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)


def mixed_scores(
    base_logits: torch.Tensor,
    aux_logits: Sequence[torch.Tensor],
    weights: Sequence[float],
    temperatures: Sequence[float] | None = None,
    *,
    base_weight: float = 1.0,
    space: str = "logits",
    plausibility: float | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The model's scores mixed with second models' (see the module docstring), in float32, returned in the model
    scores' dtype."""
    if space not in SPACES:
        raise ValueError(f"space must be one of {SPACES}; got {space!r}.")
    temperatures = [1.0] * len(aux_logits) if temperatures is None else list(temperatures)
    base_log_probs = torch.log_softmax(base_logits.float(), dim=-1)
    base = base_log_probs if space == "log_probs" else base_logits.float()
    mixed = base_weight * base
    for logits, weight, temperature in zip(aux_logits, weights, temperatures, strict=True):
        scaled = logits.float() / temperature
        mixed = mixed + weight * (torch.log_softmax(scaled, dim=-1) if space == "log_probs" else scaled)
    if plausibility is not None:
        cutoff = base_log_probs.max(dim=-1, keepdim=True).values + math.log(plausibility)
        mixed = mixed.masked_fill(base_log_probs < cutoff, -math.inf)
    if top_p is not None and top_p < 1:
        mixed = mixed.masked_fill(nucleus_mask(base_log_probs, top_p), -math.inf)
    return mixed.to(base_logits.dtype)


class MixingLogitsProcessor:
    """One call's mixing step: every second model runs incrementally beside the model with its own KV cache (a
    `PrefixCache` over the call's rows), and its scores join the model's (`mixed_scores`).

    `fields` names each second model in messages (e.g. `amateur`); `owner` the control.
    """

    def __init__(
        self,
        models: Sequence[torch.nn.Module],
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        *,
        weights: Sequence[float],
        temperatures: Sequence[float] | None = None,
        base_weight: float = 1.0,
        space: str = "logits",
        plausibility: float | None = None,
        top_p: float | None = None,
        pad_token_id: int | None = None,
        owner: str = "ContrastiveGuidance",
        fields: Sequence[str] | None = None,
    ) -> None:
        self.caches = [PrefixCache(model, prompt_ids, prompt_mask, pad_token_id) for model in models]
        self.weights = list(weights)
        self.temperatures = [1.0] * len(self.caches) if temperatures is None else list(temperatures)
        self.base_weight, self.space = base_weight, space
        self.plausibility, self.top_p = plausibility, top_p
        self.owner = owner
        self.fields = list(fields) if fields is not None else [f"models[{i}]" for i in range(len(self.caches))]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        aux = []
        for cache, field in zip(self.caches, self.fields, strict=True):
            logits = cache.advance(input_ids).logits[:, -1, :]
            if logits.shape[-1] != scores.shape[-1]:
                raise RuntimeError(
                    f"{self.owner}: the {field} scores {logits.shape[-1]} tokens, the model {scores.shape[-1]}. "
                    f"Fix: pick a {field} that shares the model's tokenizer ({field}=...)."
                )
            aux.append(logits.to(scores.device))
        return mixed_scores(
            scores,
            aux,
            self.weights,
            self.temperatures,
            base_weight=self.base_weight,
            space=self.space,
            plausibility=self.plausibility,
            top_p=self.top_p,
        )


def check_model_reference(owner: str, field: str, value: str) -> None:
    """A second model's reference must name a model."""
    if not value.strip():
        raise ValueError(
            f"{owner}.{field} must name a model; got ''. "
            f"Fix: {field}=<Hub id, path or steer_hydra:tiny?...> sharing the model's tokenizer."
        )


def check_fraction(owner: str, field: str, value: float | None, fix: str) -> None:
    """An optional threshold in (0, 1]."""
    if value is not None and not (math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"{owner}.{field} must be in (0, 1]; got {value}. Fix: {fix}.")


class ContrastiveGuidance(OutputControl):
    """Contrastive guidance: mix the next-token scores of second models (sharing the model's tokenizer) with the
    model's, each with a signed weight, optionally inside the model's plausible set.

    Each step scores token x as `base_weight * s(x) + sum_i weights[i] * s_i(x)` with `s` the model's raw logits or
    log-probabilities (`space`) and `s_i` the second models' (at `temperatures[i]`); tokens outside the model's
    nucleus (`top_p`) or with `p(x) < plausibility * max p` get -inf. Configurations from the literature:

    - Contrastive decoding (Li et al., ACL 2023, arXiv 2210.15097): one amateur with weight -1, `space="log_probs"`,
      `plausibility=alpha` (`ContrastiveDecoding`).
    - DExperts (Liu et al., ACL 2021, arXiv 2105.03023): an expert and an anti-expert with weights `alpha` and
      `-alpha` on raw logits, inside the model's nucleus (`DExperts`).
    - Proxy-tuning (Liu et al., COLM 2024, arXiv 2401.08565): a tuned small model and its untuned base with weights
      +1 and -1 on raw logits (`ProxyTuning`).

    Args:
        models: references of the second models (`steer_hydra:tiny?...`, Hub ids or paths), each sharing the
            model's tokenizer (same vocabulary size); loaded at `steer()` on the model's device and dtype.
        weights: one signed weight per second model.
        temperatures: one softmax temperature per second model (its logits are divided by it); None: all 1.
        base_weight: the model's own weight.
        space: `logits` (raw scores) or `log_probs` (log-softmax of each model).
        plausibility: keep tokens with `p(x) >= plausibility * max p` under the model (CD's alpha); None: all.
        top_p: keep the model's nucleus of this mass (DExperts' filter); None or 1: all.

    Hugging Face backend only (a live logits processor, second models in process; see docs/controls.md for why not
    vLLM). Batches (each second model's cache follows the batch's left padding); no slot refill (rows admitted
    mid-decode would need the caches to admit them).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        models: list[str]
        weights: list[float]
        temperatures: list[float] | None = None
        base_weight: float = 1.0
        space: Literal["logits", "log_probs"] = "logits"
        plausibility: float | None = None
        top_p: float | None = None

        def validate(self) -> None:
            owner = "ContrastiveGuidance"
            if not self.models:
                raise ValueError(f"{owner}.models is empty. Fix: name at least one second model (models=[...]).")
            for i, reference in enumerate(self.models):
                check_model_reference(owner, f"models[{i}]", reference)
            check_weights(owner, self.models, self.weights, self.temperatures, self.base_weight)
            check_fraction(owner, "plausibility", self.plausibility, "e.g. 0.1 (contrastive decoding's alpha), or None")
            check_fraction(owner, "top_p", self.top_p, "e.g. 0.9 (DExperts' nucleus), or None")

    supports_batching = True
    supports_refill = False

    models: list[str]
    weights: list[float]
    temperatures: list[float] | None
    base_weight: float
    space: str
    plausibility: float | None
    top_p: float | None

    def _configure(self) -> None:
        self._loaded: list[torch.nn.Module] | None = None

    @property
    def model_fields(self) -> list[str]:
        """How messages name each second model (the Args field holding its reference)."""
        return [f"models[{i}]" for i in range(len(self.models))]

    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The second models `steer()` loads: `models[i]`, or a configuration's `expert`, `anti_expert`, `amateur`."""
        found: dict[str, Reference] = {}
        models = args.get("models")
        if isinstance(models, (list, tuple)):
            found.update(
                {f"models[{i}]": Reference(m) for i, m in enumerate(models) if isinstance(m, str) and m.strip()}
            )
        for name in ("expert", "anti_expert", "amateur"):
            value = args.get(name)
            if isinstance(value, str) and value.strip():
                found[name] = Reference(value)
        return found

    @property
    def loaded_models(self) -> list[torch.nn.Module] | None:
        """The loaded second models (None before `steer()` and after `cleanup()`)."""
        return self._loaded

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def steer(
        self,
        model: torch.nn.Module | None,
        tokenizer: Any = None,
        load_model: Callable[[str], torch.nn.Module] | None = None,
        **kwargs: Any,
    ) -> None:
        owner = type(self).__name__
        if model is None or load_model is None:
            raise RuntimeError(
                f"{owner} needs the live model and its second models in this process. Fix: use backend=huggingface."
            )
        expected = output_vocab_size(model)
        loaded: list[torch.nn.Module] = []
        for reference, field in zip(self.models, self.model_fields, strict=True):
            second = load_model(reference)
            got = output_vocab_size(second)
            if got != expected:
                del second, loaded
                gc.collect()
                raise ValueError(
                    f"{owner}.{field}={reference!r} scores {got} tokens but the model scores {expected}: the {field} "
                    f"must share the model's tokenizer. Fix: set {field} to a smaller model of the same family (same "
                    "tokenizer and vocabulary)."
                )
            loaded.append(second)
        self._loaded = loaded
        return None

    def cleanup(self) -> None:
        if self._loaded:
            device, self._loaded = next(self._loaded[0].parameters()).device, None
            release(device)
        self._loaded = None

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        if self._loaded is None:
            raise RuntimeError(f"{type(self).__name__} has no second model loaded. Fix: call pipeline.steer() first.")
        ids, mask = call_rows(input_ids, kwargs)
        return [
            MixingLogitsProcessor(
                self._loaded,
                ids,
                mask,
                weights=self.weights,
                temperatures=self.temperatures,
                base_weight=self.base_weight,
                space=self.space,
                plausibility=self.plausibility,
                top_p=self.top_p,
                pad_token_id=getattr(self.tokenizer, "pad_token_id", None),
                owner=type(self).__name__,
                fields=self.model_fields,
            )
        ]


def check_weights(
    owner: str,
    models: Sequence[str],
    weights: Sequence[float],
    temperatures: Sequence[float] | None,
    base_weight: float,
) -> None:
    """One finite weight per second model, positive temperatures, a finite base weight."""
    if len(weights) != len(models):
        raise ValueError(
            f"{owner}.weights has {len(weights)} entries for {len(models)} models. Fix: one weight per model."
        )
    if not all(math.isfinite(w) for w in (*weights, base_weight)):
        raise ValueError(
            f"{owner}.weights and base_weight must be finite; got {list(weights)}, {base_weight}. "
            "Fix: finite signed weights (e.g. [-1.0] for an amateur)."
        )
    if temperatures is not None:
        if len(temperatures) != len(models):
            raise ValueError(
                f"{owner}.temperatures has {len(temperatures)} entries for {len(models)} models. "
                "Fix: one temperature per model, or None (all 1)."
            )
        if not all(math.isfinite(t) and t > 0 for t in temperatures):
            raise ValueError(f"{owner}.temperatures must be finite numbers > 0; got {list(temperatures)}. Fix: 1.0.")


class DExperts(ContrastiveGuidance):
    """DExperts: decoding-time experts (Liu et al., "DExperts: Decoding-Time Controlled Text Generation with Experts
    and Anti-Experts", ACL 2021, arXiv 2105.03023).

    The model's logits are steered by the difference of an expert (a small model tuned toward the attribute) and an
    anti-expert (tuned toward its opposite): `z + alpha * (z_expert - z_anti)`, sampled within the model's nucleus
    (`top_p`, the paper filters the model's distribution before the ensemble). A `ContrastiveGuidance`
    configuration (weights `alpha` and `-alpha` on raw logits).

    Args:
        expert: reference of the expert (sharing the model's tokenizer).
        anti_expert: reference of the anti-expert (sharing the model's tokenizer).
        alpha: the steering strength (the paper uses 2.0 for detoxification, 3.2 for sentiment).
        top_p: the model's nucleus the ensemble samples in (the paper's 0.9); None or 1: every token.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        expert: str
        anti_expert: str
        alpha: float = 2.0
        top_p: float | None = 0.9

        def validate(self) -> None:
            check_model_reference("DExperts", "expert", self.expert)
            check_model_reference("DExperts", "anti_expert", self.anti_expert)
            if not math.isfinite(self.alpha):
                raise ValueError(f"DExperts.alpha must be a finite number; got {self.alpha}. Fix: e.g. 2.0.")
            check_fraction("DExperts", "top_p", self.top_p, "the paper's 0.9, or None")

    expert: str
    anti_expert: str
    alpha: float

    def _configure(self) -> None:
        self.models = [self.expert, self.anti_expert]
        self.weights = [self.alpha, -self.alpha]
        self.temperatures = None
        self.base_weight = 1.0
        self.space = "logits"
        self.plausibility = None
        super()._configure()

    @property
    def model_fields(self) -> list[str]:
        return ["expert", "anti_expert"]


class ProxyTuning(ContrastiveGuidance):
    """Proxy-tuning (Liu et al., "Tuning Language Models by Proxy", COLM 2024, arXiv 2401.08565).

    A large model is steered as if it were tuned, by the logit offset between a small tuned model (the expert) and
    the same small model untuned (the anti-expert): `z + alpha * (z_expert - z_anti)` with `alpha = 1` in the paper.
    A `ContrastiveGuidance` configuration (weights `alpha` and `-alpha` on raw logits, no filter).

    Args:
        expert: reference of the small tuned model (sharing the model's tokenizer).
        anti_expert: reference of the small model before tuning.
        alpha: the offset's weight (1.0: the paper's proxy-tuning).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        expert: str
        anti_expert: str
        alpha: float = 1.0

        def validate(self) -> None:
            check_model_reference("ProxyTuning", "expert", self.expert)
            check_model_reference("ProxyTuning", "anti_expert", self.anti_expert)
            if not math.isfinite(self.alpha):
                raise ValueError(f"ProxyTuning.alpha must be a finite number; got {self.alpha}. Fix: 1.0.")

    expert: str
    anti_expert: str
    alpha: float

    def _configure(self) -> None:
        self.models = [self.expert, self.anti_expert]
        self.weights = [self.alpha, -self.alpha]
        self.temperatures = None
        self.base_weight = 1.0
        self.space = "logits"
        self.plausibility = None
        self.top_p = None
        super()._configure()

    @property
    def model_fields(self) -> list[str]:
        return ["expert", "anti_expert"]
