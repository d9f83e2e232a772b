"""SearchDecoding: propose continuations, score each with a per-row scorer (any Inspect scorer), keep the best, iterate.

A configuration of `SearchDriver` (`controls/output/search.py`: the proposer, the frontier, the rollout accounting)
whose options are the search's budgets and whose scorer is a `SampleScorer` `(response, row) -> float`, wrapped in
`SampleSequenceScorer` so each proposal is scored against `{"input": prompt, **reward_params}`; an Inspect scorer
becomes one through `steer_hydra.evaluation.scorers.sample_scorer_from_inspect`.

Invariants (from `SearchDriver`): the result is the best-scoring proposal seen (the first on ties), so it never
scores below the first proposal; at most `max_rollouts_per_query()` continuations are rolled out per prompt; one
prompt per decode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from steer_hydra.controls.output.search import (
    SampleSequenceScorer,
    SearchDriver,
    validate_max_rollouts,
    validate_search,
)
from steer_hydra.core.controls import BaseArgs


class SearchDecoding(SearchDriver):
    """Search decoding: propose, score, keep the best, iterate, under explicit budgets.

    Each round proposes `proposals` continuations of `segment_len` tokens from each kept beam (sampled, or by beam
    search with `propose_mode="beam"`), scores every proposal since the prompt end with `scorer`, keeps the `keep`
    best unfinished ones and extends them in the next round, for at most `rounds` rounds and `max_rollouts` proposals
    in all; it returns the best proposal seen. Methods from the literature are settings of it: best-of-n reranking
    (Nakano et al., 2021, arXiv 2112.09332: one round of n full-length samples), blockwise controlled decoding
    (Mudgal et al., 2024, arXiv 2310.17022: `segment_len` blocks, keep 1), and reward-guided lookahead search as in
    DeAL (Huang et al., 2024, arXiv 2402.06147: beam proposals, keep k).

    Args:
        scorer: a per-row scorer `(response, row) -> float`, higher is better, where the row is
            `{"input": prompt, **reward_params}` (per-sample data, e.g. `{"reference": ...}`, arrives in the
            row-scoped `reward_params` runtime kwarg); `sample_scorer_from_inspect(<Inspect scorer>)` gives one.
        proposals: continuations proposed from each kept beam per round.
        keep: beams kept per round (<= proposals).
        rounds: the most rounds; more than one needs `segment_len`.
        segment_len: tokens per round (clamped to what is left of `max_new_tokens`); None: the whole budget in one
            round.
        max_rollouts: the most proposals rolled out per prompt (>= proposals); None: the static bound
            `proposals * (1 + (rounds - 1) * keep)`.
        propose_mode: `sample` (runs on every backend with rollouts) or `beam` (beam search proposals; Hugging
            Face only).

    A decoding driver, one prompt at a time (`supports_batching` is False: the provider sends one request at a time).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        scorer: Callable[..., Any]
        proposals: int = 4
        keep: int = 1
        rounds: int = 1
        segment_len: int | None = None
        max_rollouts: int | None = None
        propose_mode: Literal["sample", "beam"] = "sample"

        def validate(self) -> None:
            validate_search(
                "SearchDecoding",
                segment_len=("segment_len", self.segment_len),
                num_candidates=("proposals", self.proposals),
                keep_k=("keep", self.keep),
                max_iterations=("rounds", self.rounds),
            )
            if self.rounds > 1 and self.segment_len is None:
                raise ValueError(
                    f"SearchDecoding.rounds={self.rounds} needs segment_len (tokens per round): with the whole budget "
                    "in one round every proposal is finished after it. Fix: set segment_len, or rounds=1."
                )
            validate_max_rollouts("SearchDecoding", "max_rollouts", self.max_rollouts, self.proposals)

    supports_batching = False

    proposals: int
    keep: int
    rounds: int

    def _configure(self) -> None:
        self.row_scorer = self.args.scorer
        self.scorer = SampleSequenceScorer(self.row_scorer)
        self.num_candidates = self.proposals
        self.keep_k = self.keep
        self.max_iterations = self.rounds
