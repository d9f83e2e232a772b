"""Search decoding: `SearchDriver` (propose segments, score, keep top-k, iterate) and the pieces it is made of.

`SegmentProposer` rolls out candidate segments for the whole frontier in one call, `Frontier` ranks them, flags
finished beams and tracks the best candidate seen, and `SampleSequenceScorer` turns a per-row `SampleScorer` into
the sequence scorer the driver calls. `BestOfN` and `DeAL` are presets of `SearchDriver`.

Invariants:
- every token comes from the pipeline's `rollout`, so the other controls' hooks, processors and criteria apply to
  every forward, and the pipeline counts every rolled-out token (discarded candidates included);
- one prompt per decode (batch size 1; `supports_batching` is False);
- at most `max_rollouts_per_query()` continuations are rolled out per prompt, and no continuation is longer than
  `max_new_tokens` (each segment is clamped to the remaining budget);
- the result is the best-scoring candidate seen in any iteration (the first seen on ties): the prompt followed by
  that candidate's continuation without trailing pads.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, DecodingDriver, DriverResult
from steer_hydra.core.identity import canonical_value
from steer_hydra.core.params import DEFAULT_MAX_NEW_TOKENS
from steer_hydra.core.scoring import SampleScorer, as_score, as_scores, scorer_name
from steer_hydra.core.tensors import eos_ids, strip_trailing

logger = logging.getLogger(__name__)

REWARD_PARAMS = "reward_params"
PROPOSE_MODES = ("beam", "sample")
# generation kwargs the proposer sets itself; a caller passing them would silently change the search
_OWNED_KWARGS = ("max_new_tokens", "num_return_sequences", "num_beams")
_SAMPLING_KWARGS = ("temperature", "top_p", "top_k")


# ---------------------------------------------------------------------- scorers
class SampleSequenceScorer:
    """Score each continuation with a per-row `SampleScorer` against `{"input": prompt, **params}`.

    `params` is what the driver passes: the row's `reward_params` (e.g. `{"reference": "Paris"}`) merged over the
    search settings, so per-sample data reaches the row the scorer reads. Each call gets its own copy of the row.
    """

    __slots__ = ("row_scorer",)

    def __init__(self, row_scorer: SampleScorer | Callable[[str, Mapping[str, Any]], float]) -> None:
        if not callable(row_scorer):
            raise TypeError(
                f"SampleSequenceScorer needs a callable (response, row) -> float; got {row_scorer!r} "
                f"({type(row_scorer).__name__})."
            )
        self.row_scorer = row_scorer

    def __call__(self, prompt: str, continuations: list[str], params: Mapping[str, Any]) -> list[float]:
        row = {"input": prompt, **params}
        return [
            as_score(self.row_scorer(text, dict(row)), scorer=self.row_scorer, what=f"continuation {i} ({text[:40]!r})")
            for i, text in enumerate(continuations)
        ]

    def canonical_form(self) -> dict[str, Any]:
        """Identity for configuration digests: this class plus the row scorer's name."""
        return {"__class__": f"{__name__}.SampleSequenceScorer", "row_scorer": canonical_value(self.row_scorer)}

    def __deepcopy__(self, memo: dict[int, Any]) -> SampleSequenceScorer:
        return self  # scorers are shared, not copied (Args descriptors deep-copy their fields)

    def __repr__(self) -> str:
        return f"SampleSequenceScorer({scorer_name(self.row_scorer)})"


# ---------------------------------------------------------------------- candidates, proposer, frontier
@dataclass(slots=True)
class Candidate:
    """One proposed continuation.

    Attributes:
        ids: the continuation since the prompt end (1-D, trailing pads stripped).
        stopped: the rollout ended this row before the segment length it was asked for (eos, a stop string, a
            composed stopping criterion).
        text: `ids` decoded with special tokens skipped (what the scorer saw).
        score: the scorer's value (higher is better).
        finished: set by `Frontier.keep`: this candidate is not extended further.
        iteration: the search iteration (1-based) that proposed it.
    """

    ids: torch.Tensor
    stopped: bool
    text: str = ""
    score: float = -math.inf
    finished: bool = False
    iteration: int = 0

    @property
    def length(self) -> int:
        return int(self.ids.numel())


class SegmentProposer:
    """Roll out `num_candidates` segments per frontier prefix in one call.

    `beam` asks for `num_beams=n, num_return_sequences=n` (greedy beam search; sampling kwargs are dropped),
    `sample` for `do_sample=True, num_return_sequences=n` (temperature, top_p and top_k pass through).
    """

    def __init__(self, mode: str, num_candidates: int) -> None:
        if mode not in PROPOSE_MODES:
            raise ValueError(f"propose_mode must be one of {PROPOSE_MODES}; got {mode!r}.")
        self.mode = mode
        self.num_candidates = num_candidates

    def generation_kwargs(self, max_new_tokens: int, passthrough: Mapping[str, Any]) -> dict[str, Any]:
        """The rollout kwargs for one segment of `max_new_tokens`."""
        n = self.num_candidates
        kwargs = dict(passthrough)
        if self.mode == "beam":
            for name in _SAMPLING_KWARGS:
                kwargs.pop(name, None)
            kwargs.update(num_beams=n, num_return_sequences=n, do_sample=False)
        else:
            kwargs.update(do_sample=True, num_return_sequences=n)
        kwargs["max_new_tokens"] = max_new_tokens
        return kwargs

    def propose(
        self,
        rollout: Callable[..., torch.Tensor],
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        prefixes: Sequence[torch.Tensor],
        max_new_tokens: int,
        passthrough: Mapping[str, Any],
        pad_token_id: int | None,
    ) -> list[Candidate]:
        """Extend each prefix (all of one length) by up to `max_new_tokens`; `n` candidates per prefix, in order."""
        rows = len(prefixes)
        ids = torch.cat([prompt_ids.expand(rows, -1), torch.stack(list(prefixes)).to(prompt_ids)], dim=1)
        mask = torch.cat(
            [
                prompt_mask.expand(rows, -1),
                torch.ones(
                    (rows, ids.shape[1] - prompt_ids.shape[1]), dtype=prompt_mask.dtype, device=prompt_mask.device
                ),
            ],
            dim=1,
        )
        sequences = rollout(ids, mask, **self.generation_kwargs(max_new_tokens, passthrough))
        expected = rows * self.num_candidates
        if sequences.shape[0] != expected:
            raise RuntimeError(
                f"The rollout returned {sequences.shape[0]} rows for {rows} prefix(es) x {self.num_candidates} "
                f"candidates; expected {expected} (num_return_sequences={self.num_candidates})."
            )
        new = sequences[:, ids.shape[1] :]
        candidates = []
        for r in range(expected):
            segment = new[r][: len(strip_trailing(new[r].tolist(), pad_token_id)[0])]
            prefix = prefixes[r // self.num_candidates].to(segment)
            candidates.append(Candidate(torch.cat([prefix, segment]), stopped=segment.numel() < max_new_tokens))
        return candidates


class Frontier:
    """Top-k selection with finished flags and the best candidate seen.

    A candidate is finished when its continuation ends in an eos id, reaches the budget, or was stopped by the
    rollout before the end of its segment (eos under a generation-config id, a stop string, a composed
    criterion). Ranking is by score, highest first, stable (the earlier candidate wins a tie).
    """

    def __init__(self, keep_k: int, budget: int, eos_token_ids: Sequence[int]) -> None:
        self.keep_k = keep_k
        self.budget = budget
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.best: Candidate | None = None

    def is_finished(self, candidate: Candidate) -> bool:
        if candidate.length >= self.budget or candidate.stopped:
            return True
        return candidate.length > 0 and int(candidate.ids[-1]) in self.eos_token_ids

    def keep(self, candidates: Sequence[Candidate]) -> list[Candidate]:
        """Flag finished candidates, update `best`, and return the unfinished ones among the top `keep_k`."""
        for candidate in candidates:
            candidate.finished = self.is_finished(candidate)
            if self.best is None or candidate.score > self.best.score:
                self.best = candidate
        ranked = sorted(candidates, key=lambda c: -c.score)
        return [c for c in ranked[: self.keep_k] if not c.finished]


@dataclass(frozen=True, slots=True)
class SearchTrace:
    """What the last `decode` did (for logging and debugging).

    `candidates` holds `(iteration, text, score, finished)` for every continuation rolled out, in order.
    """

    iterations: int
    rollouts: int
    best_score: float
    candidates: tuple[tuple[int, str, float, bool], ...] = field(default_factory=tuple)


# ---------------------------------------------------------------------- the driver
def reward_params_of(runtime_kwargs: Mapping[str, Any] | None, owner: str) -> dict[str, Any]:
    """The row's `reward_params`: a mapping, or a one-element list holding one (the collator's batch-of-one form)."""
    value = (runtime_kwargs or {}).get(REWARD_PARAMS)
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, (list, tuple)) and len(value) == 1 and (value[0] is None or isinstance(value[0], Mapping)):
        return dict(value[0] or {})
    hint = ""
    if isinstance(value, (list, tuple)) and len(value) > 1:
        hint = f" A list of {len(value)} values is one per row, but {owner} decodes one prompt at a time."
    raise TypeError(
        f"{owner}: runtime kwarg {REWARD_PARAMS!r} must be a mapping (e.g. {{'reference': 'Paris'}}) or a "
        f"one-element list holding one mapping (a collated batch of one); got {value!r} "
        f"({type(value).__name__}).{hint}"
    )


class SearchDriver(DecodingDriver):
    """Decoding as search over segments.

    Each iteration proposes `num_candidates` segments of `segment_len` tokens (the whole budget when None) from
    every frontier beam (`propose_mode` "beam": beam search; "sample": sampling), scores every continuation since
    the prompt end with `scorer(prompt, continuations, params)`, keeps the top `keep_k`, and continues the
    unfinished ones until none is left or `max_iterations` is spent. `max_new_tokens` is the global budget (each
    segment is clamped to what is left). Returns the best candidate seen; `last_trace` describes the search.

    `max_rollouts` (optional) caps the continuations rolled out per prompt: an iteration extends only as many of the
    best frontier beams as the cap leaves room for (`num_candidates` each), and the search stops when none fits.

    `prompt` is the prompt decoded without special tokens; `params` holds the search settings (`propose_mode`,
    `segment_len`, `num_candidates`, `keep_k`, `max_iterations`, `max_new_tokens`, `iteration`, and `max_rollouts`
    when set) overlaid by the row's `reward_params`. A beam is finished when its continuation ends in an eos id (the
    tokenizer's, plus an `eos_token_id` generate kwarg), reaches the budget, or was stopped early by the rollout.

    Runtime kwarg `reward_params` (row scope): a mapping, or a one-element list of mappings.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        scorer: Callable[..., Any]
        segment_len: int | None
        num_candidates: int
        keep_k: int
        max_iterations: int
        propose_mode: Literal["beam", "sample"] = "beam"
        max_rollouts: int | None = None

        def validate(self) -> None:
            validate_search(
                "SearchDriver",
                segment_len=("segment_len", self.segment_len),
                num_candidates=("num_candidates", self.num_candidates),
                keep_k=("keep_k", self.keep_k),
                max_iterations=("max_iterations", self.max_iterations),
            )
            validate_max_rollouts("SearchDriver", "max_rollouts", self.max_rollouts, self.num_candidates)

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": REWARD_PARAMS,
            "type": "dict",
            "required": False,
            "scope": "row",
            "help": "Per-sample data merged into the row the reward scorer sees (e.g. {'reference': ...}).",
        }
    ]
    supports_batching = False

    scorer: Callable[..., Any]
    segment_len: int | None
    num_candidates: int
    keep_k: int
    max_iterations: int
    propose_mode: str
    max_rollouts: int | None = None  # presets without the option search to their static bound

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_trace: SearchTrace | None = None
        super().__init__(*args, **kwargs)

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        if self.propose_mode == "beam":
            return frozenset({Capability.BEAM_PROPOSALS})
        return frozenset({Capability.SAMPLED_ROLLOUTS})

    def max_rollouts_per_query(self) -> int:
        """`num_candidates * (1 + (max_iterations - 1) * keep_k)` continuations per prompt, at most (or
        `max_rollouts` when that is lower)."""
        bound = self.num_candidates * (1 + (self.max_iterations - 1) * self.keep_k)
        return bound if self.max_rollouts is None else min(bound, self.max_rollouts)

    def search_settings(self, budget: int) -> dict[str, Any]:
        """The settings passed to the scorer (under the row's `reward_params`)."""
        settings = {
            "propose_mode": self.propose_mode,
            "segment_len": self.segment_len,
            "num_candidates": self.num_candidates,
            "keep_k": self.keep_k,
            "max_iterations": self.max_iterations,
            "max_new_tokens": budget,
        }
        if self.max_rollouts is not None:
            settings["max_rollouts"] = self.max_rollouts
        return settings

    # ------------------------------------------------------------------ decode
    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        max_new_tokens: int | None = None,
        **gen_kwargs: Any,
    ) -> DriverResult:
        owner = type(self).__name__
        if input_ids.dim() != 2 or input_ids.shape[0] != 1:
            raise ValueError(
                f"{owner} decodes one prompt at a time (batch size 1); got input_ids of shape "
                f"{tuple(input_ids.shape)}. It declares supports_batching=False, so the Inspect provider clamps its "
                "batch to 1; when calling pipeline.generate() yourself, pass one prompt per call."
            )
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError(f"{owner} needs a tokenizer to decode candidates for its scorer; pass tokenizer=.")
        budget = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        if budget < 1:
            raise ValueError(f"{owner}: max_new_tokens must be >= 1; got {max_new_tokens}.")
        reward_params = reward_params_of(runtime_kwargs, owner)
        passthrough = self._passthrough(gen_kwargs, owner)
        pad = tokenizer.pad_token_id
        prompt_text = tokenizer.decode(input_ids[0][attention_mask[0].bool()], skip_special_tokens=True)
        settings = self.search_settings(budget)
        proposer = SegmentProposer(self.propose_mode, self.num_candidates)
        eos = eos_ids(getattr(tokenizer, "eos_token_id", None), gen_kwargs.get("eos_token_id"))
        frontier = Frontier(self.keep_k, budget, eos)
        step = self.segment_len or budget

        prefixes = [input_ids.new_empty(0)]
        seen: list[Candidate] = []
        iteration = 0
        while prefixes and iteration < self.max_iterations:
            if self.max_rollouts is not None:  # extend the best beams the rollout cap leaves room for
                prefixes = prefixes[: (self.max_rollouts - len(seen)) // self.num_candidates]
                if not prefixes:
                    break
            iteration += 1
            candidates: list[Candidate] = []
            for length, group in _by_length(prefixes).items():
                segment = min(step, budget - length)
                candidates += proposer.propose(rollout, input_ids, attention_mask, group, segment, passthrough, pad)
            texts = [tokenizer.decode(c.ids, skip_special_tokens=True) for c in candidates]
            params = {**settings, "iteration": iteration, **reward_params}
            scores = as_scores(self.scorer(prompt_text, texts, params), scorer=self.scorer, count=len(texts))
            for candidate, text, score in zip(candidates, texts, scores, strict=True):
                candidate.text, candidate.score, candidate.iteration = text, score, iteration
            prefixes = [c.ids for c in frontier.keep(candidates)]
            seen += candidates
            logger.debug(
                "%s iteration %d: %d candidates, best %.4g, %d continue",
                owner,
                iteration,
                len(candidates),
                frontier.best.score,
                len(prefixes),
            )
        best = frontier.best
        self.last_trace = SearchTrace(
            iterations=iteration,
            rollouts=len(seen),
            best_score=best.score,
            candidates=tuple((c.iteration, c.text, c.score, c.finished) for c in seen),
        )
        return DriverResult(torch.cat([input_ids[0], best.ids.to(input_ids)]).unsqueeze(0))

    @staticmethod
    def _passthrough(gen_kwargs: Mapping[str, Any], owner: str) -> dict[str, Any]:
        owned = sorted(set(_OWNED_KWARGS) & set(gen_kwargs))
        if owned:
            raise ValueError(
                f"{owner} sets {owned} itself (from its Args); remove them from the generate() call and configure "
                "the search instead."
            )
        passthrough = dict(gen_kwargs)
        if "do_sample" in passthrough:
            logger.debug("%s ignores do_sample=%r: its propose_mode decides.", owner, passthrough.pop("do_sample"))
        return passthrough


def _by_length(prefixes: Sequence[torch.Tensor]) -> dict[int, list[torch.Tensor]]:
    groups: dict[int, list[torch.Tensor]] = {}
    for prefix in prefixes:
        groups.setdefault(int(prefix.numel()), []).append(prefix)
    return groups


def validate_search(owner: str, **fields: tuple[str, int | None]) -> None:
    """Range checks shared by `SearchDriver` and its presets; `fields` maps a generic name to (arg name, value)."""
    for generic in ("num_candidates", "keep_k", "max_iterations"):
        name, value = fields[generic]
        if value < 1:
            raise ValueError(f"{owner}.{name} must be a positive integer; got {value}. Fix: {name} >= 1.")
    name, value = fields["segment_len"]
    if value is not None and value < 1:
        raise ValueError(
            f"{owner}.{name} must be a positive number of tokens (or None for the whole budget); got {value}. "
            f"Fix: {name} >= 1, or None."
        )
    (k_name, keep_k), (n_name, n) = fields["keep_k"], fields["num_candidates"]
    if keep_k > n:
        raise ValueError(
            f"{owner}.{k_name}={keep_k} must be <= {n_name}={n}: only {n} candidates are proposed per beam. "
            f"Fix: lower {k_name} or raise {n_name}."
        )


def validate_max_rollouts(owner: str, name: str, value: int | None, num_candidates: int) -> None:
    """A rollout cap must leave room for the first iteration's `num_candidates` proposals."""
    if value is not None and value < num_candidates:
        raise ValueError(
            f"{owner}.{name}={value} is below the {num_candidates} proposals of the first round. "
            f"Fix: {name} >= {num_candidates}, or None (the static bound)."
        )


def require_scorer(owner: str, name: str, value: Any) -> None:
    """Raise a TypeError naming the argument when a required scorer is missing or not callable."""
    if value is None:
        raise TypeError(
            f"{owner} needs {name}=: a callable (prompt, continuations, params) -> list[float], higher is better "
            "(wrap a per-row (response, row) -> float scorer in SampleSequenceScorer)."
        )
