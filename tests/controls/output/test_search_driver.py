"""SearchDriver machinery without a model: a scripted rollout checks proposals, frontier, budget, bound, errors."""

from __future__ import annotations

import math

import pytest
import torch

from steer_hydra.controls.output import BestOfN, DeAL, SampleSequenceScorer, SearchDriver
from steer_hydra.controls.output.search import Frontier, reward_params_of
from steer_hydra.core import declared_scopes, runtime_kwargs_schema
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.identity import canonical_value
from steer_hydra.core.scoring import SampleScorer, SequenceScorer, as_score
from steer_hydra.models import build_tiny_model

PROMPT = torch.tensor([[1, 5, 205, 78, 6]])
MASK = torch.ones_like(PROMPT)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_model()[1]


class ScriptedRollout:
    """A `model.generate` stand-in: candidate j of each input row gets j 'a' tokens, then 'b' tokens.

    `ending(row_index, j)` may return "eos" (last token is eos), "short" (stop one token early, pads after).
    Records every call's kwargs and row count.
    """

    def __init__(self, tok, ending=None):
        self.tok = tok
        self.a, self.b = tok.convert_tokens_to_ids("a"), tok.convert_tokens_to_ids("b")
        self.ending = ending or (lambda row, j: None)
        self.calls: list[dict] = []
        self.rows = 0

    def __call__(self, input_ids, attention_mask, **kwargs):
        assert attention_mask.shape == input_ids.shape
        n, m = kwargs["num_return_sequences"], kwargs["max_new_tokens"]
        self.calls.append({**kwargs, "rows": input_ids.shape[0], "width": input_ids.shape[1]})
        pad = self.tok.pad_token_id
        out = []
        for r in range(input_ids.shape[0]):
            for j in range(n):
                seg = ([self.a] * j + [self.b] * m)[:m]
                end = self.ending(self.rows, j)
                if end == "eos":
                    seg[-1] = self.tok.eos_token_id
                elif end == "short":
                    seg = seg[:-1] + [pad]
                out.append(torch.cat([input_ids[r], torch.tensor(seg)]))
            self.rows += 1
        return torch.stack(out)


def count_a(prompt, continuations, params):
    return [float(text.count("a")) for text in continuations]


def driver(**overrides):
    args = dict(scorer=count_a, segment_len=2, num_candidates=3, keep_k=2, max_iterations=4, propose_mode="beam")
    return SearchDriver(**{**args, **overrides})


def decode(d, tok, rollout, budget=100, runtime_kwargs=None, **gen_kwargs):
    result = d.decode(
        PROMPT,
        MASK,
        rollout=rollout,
        runtime_kwargs=runtime_kwargs or {},
        tokenizer=tok,
        max_new_tokens=budget,
        **gen_kwargs,
    )
    assert torch.equal(result.sequences[:, : PROMPT.shape[1]], PROMPT)
    return result.sequences[0, PROMPT.shape[1] :].tolist()


# ---------------------------------------------------------------------- declarations
def test_declarations_and_bounds():
    d = driver()
    assert declared_scopes([d]) == {"reward_params": "row"}
    assert runtime_kwargs_schema([d])["reward_params"]["type"] == "dict"
    assert d.max_rollouts_per_query() == 3 * (1 + 3 * 2)
    assert d.requirements() == {Capability.BEAM_PROPOSALS}
    assert driver(propose_mode="sample").requirements() == {Capability.SAMPLED_ROLLOUTS}
    deal = DeAL(reward_func=count_a)
    assert deal.max_rollouts_per_query() == 140  # 5 * (1 + 9 * 3), the spec's default bound
    assert (deal.segment_len, deal.num_candidates, deal.keep_k, deal.propose_mode) == (10, 5, 3, "beam")
    best = BestOfN(n=6, scorer=count_a)
    assert best.max_rollouts_per_query() == 6
    assert (best.segment_len, best.keep_k, best.max_iterations, best.propose_mode) == (None, 1, 1, "sample")
    assert not (d.supports_batching or deal.supports_batching or best.supports_batching)


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: BestOfN(n=0, scorer=count_a), "BestOfN.n must be a positive integer"),
        (lambda: BestOfN(n=4), "BestOfN needs scorer="),
        (lambda: BestOfN(n=4, scorer="reward"), "scorer"),
        (lambda: DeAL(topk=6, init_beams=5, reward_func=count_a), r"DeAL.topk=6 must be <= init_beams=5"),
        (lambda: DeAL(lookahead=0, reward_func=count_a), "DeAL.lookahead must be a positive"),
        (lambda: DeAL(), "DeAL needs reward_func="),
        (lambda: driver(keep_k=0), "SearchDriver.keep_k must be a positive integer"),
        (lambda: driver(propose_mode="greedy"), "propose_mode"),
        (lambda: SearchDriver(scorer=count_a), "missing"),
    ],
)
def test_args_errors_name_the_field(build, match):
    with pytest.raises((TypeError, ValueError), match=match):
        build()


# ---------------------------------------------------------------------- search behaviour
def test_rollouts_reach_the_bound_exactly_when_no_beam_finishes(tok):
    rollout = ScriptedRollout(tok)
    d = driver()
    decode(d, tok, rollout)
    assert sum(c["rows"] * c["num_return_sequences"] for c in rollout.calls) == d.max_rollouts_per_query() == 21
    assert [c["rows"] for c in rollout.calls] == [1, 2, 2, 2]  # the frontier is batched: keep_k rows per call
    assert all(c["num_beams"] == 3 and c["do_sample"] is False and c["max_new_tokens"] == 2 for c in rollout.calls)
    # widths grow by one segment per iteration: every frontier row extends its prefix
    assert [c["width"] for c in rollout.calls] == [5, 7, 9, 11]
    assert d.last_trace.rollouts == 21 and d.last_trace.iterations == 4


def test_returns_best_seen_and_extends_the_top_k(tok):
    rollout = ScriptedRollout(tok)
    out = decode(driver(), tok, rollout)
    a = tok.convert_tokens_to_ids("a")
    # candidate 2 ("aa") wins every iteration, so the best is four segments of "aa"
    assert out == [a] * 8


def test_best_seen_may_come_from_an_earlier_iteration(tok):
    rollout = ScriptedRollout(tok)
    d = driver(scorer=lambda p, conts, params: [-len(t) + t.count("a") for t in conts])
    out = decode(d, tok, rollout)
    # longer continuations score lower: the best is an iteration-1 candidate ("aa", score 0)
    assert tok.decode(out) == "aa"
    assert d.last_trace.best_score == max(score for _, _, score, _ in d.last_trace.candidates) == 0


def test_segments_are_clamped_to_the_budget(tok):
    rollout = ScriptedRollout(tok)
    out = decode(driver(keep_k=1, max_iterations=10), tok, rollout, budget=5)
    assert [c["max_new_tokens"] for c in rollout.calls] == [2, 2, 1]
    assert len(out) == 5


def test_eos_finishes_a_beam(tok):
    # the best candidate of the first call (j=2: 'aa' then eos) ends in eos: with keep_k=1 the search stops there
    rollout = ScriptedRollout(tok, ending=lambda row, j: "eos" if j == 2 else None)
    out = decode(driver(keep_k=1, segment_len=3), tok, rollout)
    assert len(rollout.calls) == 1
    assert tok.decode(out, skip_special_tokens=True) == "aa" and out[-1] == tok.eos_token_id and len(out) == 3


def test_a_row_stopped_early_is_finished(tok):
    # j=2 is cut one token short (a stop string or criterion): it is finished, not extended
    rollout = ScriptedRollout(tok, ending=lambda row, j: "short" if j == 2 else None)
    d = driver(keep_k=2)
    decode(d, tok, rollout)
    # call 1 keeps j=2 (finished) and j=1; only j=1 continues: the second call has one row
    assert [c["rows"] for c in rollout.calls[:2]] == [1, 1]


def test_frontier_ranks_stably_and_tracks_best():
    from steer_hydra.controls.output.search import Candidate

    frontier = Frontier(keep_k=2, budget=10, eos_token_ids=[2])
    cands = [Candidate(torch.tensor([7, 7]), False, score=s) for s in (1.0, 3.0, 3.0, -math.inf)]
    cands[2].ids = torch.tensor([7, 2])  # ends in eos
    kept = frontier.keep(cands)
    assert frontier.best is cands[1]  # first of the tied maxima
    assert kept == [cands[1]]  # cands[2] is kept in the top 2 but finished
    assert cands[2].finished and not cands[1].finished


def test_sample_mode_passes_sampling_kwargs_and_beam_mode_drops_them(tok):
    rollout = ScriptedRollout(tok)
    decode(driver(propose_mode="sample", max_iterations=1), tok, rollout, temperature=0.7, top_k=5)
    call = rollout.calls[0]
    assert call["do_sample"] is True and "num_beams" not in call and (call["temperature"], call["top_k"]) == (0.7, 5)
    rollout = ScriptedRollout(tok)
    decode(driver(max_iterations=1), tok, rollout, temperature=0.7, repetition_penalty=1.2)
    call = rollout.calls[0]
    assert "temperature" not in call and call["repetition_penalty"] == 1.2 and call["num_beams"] == 3


def test_owned_generation_kwargs_are_refused(tok):
    with pytest.raises(ValueError, match=r"SearchDriver sets \['num_beams'\] itself"):
        decode(driver(), tok, ScriptedRollout(tok), num_beams=4)


# ---------------------------------------------------------------------- reward params and scorer params
@pytest.mark.parametrize("form", [{"reference": "Paris"}, [{"reference": "Paris"}], ({"reference": "Paris"},)])
def test_reward_params_forms_reach_the_scorer(tok, form, recording_scorer):
    scorer = recording_scorer(lambda text: 0.0)
    decode(driver(scorer=scorer, max_iterations=2), tok, ScriptedRollout(tok), runtime_kwargs={"reward_params": form})
    assert len(scorer.calls) == 2
    for _, _, params in scorer.calls:
        assert params["reference"] == "Paris"
        assert params["segment_len"] == 2 and params["max_new_tokens"] == 100
    assert [params["iteration"] for _, _, params in scorer.calls] == [1, 2]
    assert scorer.calls[0][0] == tok.decode(PROMPT[0], skip_special_tokens=True)


def test_reward_params_override_search_settings_and_may_be_absent(tok, recording_scorer):
    assert reward_params_of({}, "X") == {} and reward_params_of({"reward_params": [None]}, "X") == {}
    scorer = recording_scorer(lambda text: 0.0)
    decode(
        driver(scorer=scorer, max_iterations=1),
        tok,
        ScriptedRollout(tok),
        runtime_kwargs={"reward_params": {"keep_k": "mine"}},
    )
    assert scorer.calls[0][2]["keep_k"] == "mine"


@pytest.mark.parametrize(
    "value, extra",
    [
        ("Paris", ""),
        (5, ""),
        ([1], ""),
        ([{"reference": "a"}, {"reference": "b"}], "A list of 2 values is one per row"),
    ],
)
def test_bad_reward_params_form_names_the_accepted_forms(tok, value, extra):
    with pytest.raises(TypeError, match="must be a mapping .* or a one-element list holding one mapping") as info:
        decode(driver(), tok, ScriptedRollout(tok), runtime_kwargs={"reward_params": value})
    assert "reward_params" in str(info.value) and extra in str(info.value)


def test_batch_larger_than_one_is_refused_with_the_reason(tok):
    with pytest.raises(ValueError, match="one prompt at a time") as info:
        driver().decode(
            PROMPT.repeat(2, 1),
            MASK.repeat(2, 1),
            rollout=ScriptedRollout(tok),
            runtime_kwargs={},
            tokenizer=tok,
            max_new_tokens=4,
        )
    assert "supports_batching=False" in str(info.value) and "clamps its batch to 1" in str(info.value)


# ---------------------------------------------------------------------- scorer return values
def not_a_number(prompt, continuations, params):
    return ["good"] * len(continuations)


def nan_scorer(prompt, continuations, params):
    return [float("nan")] * len(continuations)


def short_scorer(prompt, continuations, params):
    return [1.0]


@pytest.mark.parametrize(
    "scorer, error, match",
    [
        (not_a_number, TypeError, r"not_a_number returned 'good' \(str\) for continuation 0"),
        (nan_scorer, ValueError, "nan_scorer returned NaN"),
        (short_scorer, ValueError, "short_scorer returned 1 scores for 3 continuations"),
        (lambda p, c, params: None, TypeError, "returned None"),
    ],
)
def test_a_scorer_returning_a_non_number_fails_naming_scorer_and_value(tok, scorer, error, match):
    with pytest.raises(error, match=match):
        decode(driver(scorer=scorer), tok, ScriptedRollout(tok))


def test_scores_may_be_tensors_and_numpy_numbers():
    import numpy as np

    assert as_score(torch.tensor(2.5), scorer=count_a) == 2.5
    assert as_score(np.float32(1.5), scorer=count_a) == 1.5
    assert as_score(True, scorer=count_a) == 1.0
    assert as_score(-math.inf, scorer=count_a) == -math.inf
    with pytest.raises(TypeError, match="count_a returned tensor"):
        as_score(torch.tensor([1.0, 2.0]), scorer=count_a)


# ---------------------------------------------------------------------- SampleSequenceScorer
def test_sample_sequence_scorer_scores_each_continuation_against_its_row():
    rows = []

    def row_scorer(response, row):
        rows.append(row)
        row["mutated"] = True  # each call gets its own copy
        return float(response == row["reference"])

    scorer = SampleSequenceScorer(row_scorer)
    assert isinstance(scorer, SequenceScorer) and isinstance(row_scorer, SampleScorer)
    scores = scorer("Where is the Eiffel Tower?", ["Paris", "Rome"], {"reference": "Paris", "keep_k": 1})
    assert scores == [1.0, 0.0]
    assert rows[1] == {"input": "Where is the Eiffel Tower?", "reference": "Paris", "keep_k": 1, "mutated": True}
    assert len(rows) == 2 and rows[0] is not rows[1]
    assert "row_scorer" in repr(scorer)
    assert canonical_value(scorer)["row_scorer"] == canonical_value(row_scorer)


def test_sample_sequence_scorer_names_a_row_scorer_returning_a_non_number():
    def bad_row_scorer(response, row):
        return {"score": 1}

    with pytest.raises(TypeError, match=r"bad_row_scorer returned \{'score': 1\} \(dict\) for continuation 0"):
        SampleSequenceScorer(bad_row_scorer)("p", ["x"], {})
    with pytest.raises(TypeError, match="callable"):
        SampleSequenceScorer("reference")


def test_descriptor_keeps_the_scorer_identity():
    scorer = SampleSequenceScorer(count_a)
    best = BestOfN(n=2, scorer=scorer)
    assert best.descriptor()["args"]["scorer"] is scorer
    assert canonical_value(best.descriptor()) == canonical_value(
        BestOfN(n=2, scorer=SampleSequenceScorer(count_a)).descriptor()
    )
