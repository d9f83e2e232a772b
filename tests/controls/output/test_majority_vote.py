"""MajorityVoteScorer: self-consistency without references."""

from __future__ import annotations

from steer_hydra.controls.output import BestOfN, MajorityVoteScorer
from steer_hydra.controls.output.scorers import normalize_answer


def test_normalize_answer_takes_first_line_without_punctuation():
    assert normalize_answer("\n  Paris.\nbecause") == "paris"
    assert normalize_answer("The  answer: 42!") == "the answer 42"


def test_scores_are_agreement_shares():
    scores = MajorityVoteScorer()("q", ["Paris.", "paris", "Rome", "", "PARIS!"], {})
    assert scores == [0.6, 0.6, 0.2, 0.0, 0.6]


def test_best_of_n_with_majority_vote_returns_a_modal_candidate(make_pipeline):
    control = BestOfN(n=6, scorer=MajorityVoteScorer())
    pipeline = make_pipeline([control])
    out = pipeline.generate(
        messages=[{"role": "user", "content": "hi"}], max_new_tokens=1, temperature=0.5, seed=0, return_output=True
    )
    candidates = [text for _, text, _, _ in control.last_trace.candidates]
    answers = [normalize_answer(c) for c in candidates]
    chosen = normalize_answer(out.decode(pipeline.tokenizer)[0])
    assert len(candidates) == 6 and len(set(answers)) < 6  # some agreement, so the vote decides
    assert answers.count(chosen) == max(answers.count(a) for a in answers if a)
