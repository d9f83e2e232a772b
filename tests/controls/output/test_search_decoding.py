"""SearchDecoding: the result never scores below the first proposal, the budgets (proposals per round, rounds, max
rollouts) bound the rollouts counted at the model, an Inspect scorer through sample_scorer_from_inspect, refusals."""

from __future__ import annotations

import pytest
from inspect_ai.scorer import includes

from steer_hydra.controls.output import SearchDecoding
from steer_hydra.core import SteeringPipeline
from steer_hydra.evaluation.scorers import sample_scorer_from_inspect
from steer_hydra.models import TINY_REF

CHAT = [{"role": "user", "content": "tell me something"}]


class RowScorer:
    """A per-row scorer (`(response, row) -> float`) counting a letter, recording every call in order."""

    def __init__(self, letter: str = "e") -> None:
        self.letter = letter
        self.calls: list[tuple[str, dict]] = []

    def score(self, response: str) -> float:
        return float(response.count(self.letter))

    def __call__(self, response: str, row: dict) -> float:
        self.calls.append((response, dict(row)))
        return self.score(response)


def _rollout_rows(calls) -> int:
    """Continuations the model rolled out: the rows of every recorded generate call."""
    return sum(int(call["sequences"].shape[0]) for call in calls)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_result_never_scores_below_the_first_proposal(tiny, record_generate, step_controls, seed):
    model, tok = tiny
    scorer = RowScorer()
    control = SearchDecoding(scorer=scorer, proposals=3, keep=2, rounds=3, segment_len=3)
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[control, step_controls["ban"](tok.pad_token_id)])
    pipeline.steer()
    output = pipeline.generate(messages=CHAT, max_new_tokens=9, temperature=1.0, seed=seed, return_output=True)
    (text,) = output.decode(tok)
    count = scorer.score
    proposals = [response for response, _ in scorer.calls]
    assert len(proposals) == control.last_trace.rollouts > 3  # more than one round ran
    assert count(text) >= count(proposals[0])
    assert count(text) == max(count(p) for p in proposals) == control.last_trace.best_score
    assert all(row["input"] and row["num_candidates"] == 3 and row["max_iterations"] == 3 for _, row in scorer.calls)


@pytest.mark.parametrize(
    ("kwargs", "bound"),
    [
        ({"proposals": 3, "keep": 2, "rounds": 3, "segment_len": 2}, 3 * (1 + 2 * 2)),
        ({"proposals": 3, "keep": 2, "rounds": 3, "segment_len": 2, "max_rollouts": 7}, 6),  # a round fits twice 3
        ({"proposals": 4, "keep": 1, "rounds": 1}, 4),
    ],
)
def test_budgets_bound_the_rollouts_counted_at_the_model(tiny, record_generate, step_controls, kwargs, bound):
    model, tok = tiny
    control = SearchDecoding(scorer=RowScorer(), **kwargs)
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[control, step_controls["ban"](tok.eos_token_id)])
    pipeline.steer()
    calls = record_generate(pipeline.model)
    pipeline.generate(messages=CHAT, max_new_tokens=8, temperature=1.0, seed=0, return_output=True)
    rolled = _rollout_rows(calls)
    assert rolled == control.last_trace.rollouts <= control.max_rollouts_per_query()
    assert rolled == bound  # eos is banned: no beam finishes early, so every budget is spent exactly
    assert all(c["kwargs"]["num_return_sequences"] == kwargs["proposals"] for c in calls)
    if "max_rollouts" in kwargs:
        assert control.max_rollouts_per_query() == kwargs["max_rollouts"] and rolled <= kwargs["max_rollouts"]


def test_an_inspect_scorer_through_sample_scorer_from_inspect_reads_the_rows_reference(make_pipeline):
    row_scorer = sample_scorer_from_inspect(includes())
    control = SearchDecoding(scorer=row_scorer, proposals=6)
    pipeline = make_pipeline([control])
    free = make_pipeline([]).generate(messages=CHAT, max_new_tokens=6, temperature=1.0, seed=0)
    reference = free.split()[0] if free.split() else free
    output = pipeline.generate(
        messages=CHAT,
        max_new_tokens=6,
        temperature=1.0,
        seed=0,
        runtime_kwargs={"reward_params": {"reference": reference}},
        return_output=True,
    )
    (text,) = output.decode(pipeline.tokenizer)
    scores = [score for _, _, score, _ in control.last_trace.candidates]
    assert set(scores) <= {0.0, 1.0} and len(scores) == 6
    assert row_scorer(text, {"input": "x", "reference": reference}) == max(scores)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rounds": 2}, r"SearchDecoding.rounds=2 needs segment_len .* Fix"),
        ({"proposals": 0}, r"SearchDecoding.proposals must be a positive integer; got 0. Fix"),
        ({"keep": 3, "proposals": 2}, r"SearchDecoding.keep=3 must be <= proposals=2.* Fix"),
        ({"max_rollouts": 2, "proposals": 3}, r"SearchDecoding.max_rollouts=2 is below the 3 proposals.* Fix"),
        ({"segment_len": 0}, r"SearchDecoding.segment_len must be a positive number of tokens"),
    ],
)
def test_invalid_budgets_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SearchDecoding(scorer=RowScorer(), **kwargs)
    with pytest.raises(TypeError, match="scorer"):
        SearchDecoding()


def test_sampled_search_runs_wherever_rollouts_run_and_beam_search_only_on_hugging_face():
    sampled = SearchDecoding(scorer=RowScorer(), proposals=2, rounds=2, segment_len=2)
    beams = SearchDecoding(scorer=RowScorer(), proposals=2, propose_mode="beam")
    for backend in ("huggingface", "vllm", "vllm_serve"):
        assert SteeringPipeline(TINY_REF, controls=[sampled], backend=backend).check().ok
    (failure,) = SteeringPipeline(TINY_REF, controls=[beams], backend="vllm").check().failures
    assert "beam_proposals" in failure.message and "Fix: use backend=huggingface" in failure.message
    assert sampled.supports_batching is False
