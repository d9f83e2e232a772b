"""BestOfN on the tiny model: the argmax of the sampled candidates, measured token accounting, reward params."""

from __future__ import annotations

import pytest

from steer_hydra.controls.output import BestOfN, SampleSequenceScorer
from steer_hydra.core import FINISH_REASONS, SteeringPipeline

CHAT = [{"role": "user", "content": "tell me something"}]


def count_e(text: str) -> float:
    return float(text.count("e"))


def _first_argmax(pairs):
    best = max(score for _, score in pairs)
    return next(text for text, score in pairs if score == best)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_returns_the_candidate_the_scorer_ranks_highest(
    tiny, recording_scorer, step_controls, record_generate, count_rolled_out, seed
):
    model, tok = tiny
    scorer = recording_scorer(count_e)
    # pad is banned so "tokens rolled out" is unambiguous (a sampled pad would read as padding)
    controls = [BestOfN(n=6, scorer=scorer), step_controls["ban"](tok.pad_token_id)]
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=controls).steer()
    calls = record_generate(pipeline.model)
    output = pipeline.generate(messages=CHAT, max_new_tokens=16, temperature=1.0, seed=seed, return_output=True)

    assert len(calls) == 1 and calls[0]["kwargs"]["num_return_sequences"] == 6 and calls[0]["kwargs"]["do_sample"]
    assert len(scorer.calls) == 1 and len(scorer.calls[0][1]) == 6
    (text,) = output.decode(pipeline.tokenizer)
    assert text == _first_argmax(scorer.seen)  # re-scored here, independently of the driver's ranking
    assert count_e(text) == max(score for _, score in scorer.seen)
    # every sampled token is counted, the discarded candidates' included
    pad = pipeline.tokenizer.pad_token_id
    assert output.generated_tokens == count_rolled_out(calls, pad)
    assert output.generated_tokens >= 6 * 1 and output.generated_tokens > output.output_ids.shape[1]
    rows = calls[0]["sequences"][:, calls[0]["input_ids"].shape[1] :]
    assert output.output_ids[0].tolist() in [_strip(r, pad) for r in rows.tolist()]


def _strip(row, pad):
    while row and row[-1] == pad:
        row.pop()
    return row


def test_generate_messages_reports_finish_reasons_and_text_return(make_pipeline, recording_scorer):
    scorer = recording_scorer(count_e)
    pipeline = make_pipeline([BestOfN(n=4, scorer=scorer)])
    tok = pipeline.tokenizer
    output = pipeline.generate(messages=CHAT, max_new_tokens=8, seed=3, temperature=1.0, return_output=True)
    ids = _strip(output.output_ids[0].tolist(), tok.pad_token_id)
    expected = "eos" if ids and ids[-1] == tok.eos_token_id else ("length" if len(ids) == 8 else None)
    assert output.finish_reasons == [expected] and expected in FINISH_REASONS
    assert output.adapted_input_ids.shape[0] == 1 and output.generated_tokens is not None
    # the text return of the same seeded call is the same best candidate
    text = pipeline.generate(messages=CHAT, max_new_tokens=8, seed=3, temperature=1.0)
    assert text == output.decode(tok)[0]


def test_seeded_calls_repeat_and_leave_the_global_rng_alone(make_pipeline):
    import torch

    pipeline = make_pipeline([BestOfN(n=3, scorer=lambda p, c, params: [count_e(t) for t in c])])
    state = torch.random.get_rng_state()
    first = pipeline.generate(messages=CHAT, max_new_tokens=10, seed=11, temperature=1.0, return_output=True)
    second = pipeline.generate(messages=CHAT, max_new_tokens=10, seed=11, temperature=1.0, return_output=True)
    assert torch.equal(first.output_ids, second.output_ids)
    assert first.generated_tokens == second.generated_tokens
    assert torch.equal(state, torch.random.get_rng_state())


@pytest.mark.parametrize("form", ["mapping", "one-element list"])
def test_reward_params_reach_the_row_of_every_sample(make_pipeline, form):
    rows = []

    def row_scorer(response, row):
        rows.append((response, row))
        return float(row["reference"] in response) - 0.01 * len(response)

    pipeline = make_pipeline([BestOfN(n=5, scorer=SampleSequenceScorer(row_scorer))])
    params = {"reference": "e", "source": "unit"}
    value = params if form == "mapping" else [params]
    pipeline.generate(messages=CHAT, max_new_tokens=6, runtime_kwargs={"reward_params": value})
    assert len(rows) == 5
    for _, row in rows:
        assert row["reference"] == "e" and row["source"] == "unit"
        assert "tell me something" in row["input"]
        assert row["num_candidates"] == 5 and row["max_new_tokens"] == 6


def test_bad_reward_params_and_bad_scorer_fail_through_the_pipeline(make_pipeline):
    pipeline = make_pipeline([BestOfN(n=2, scorer=lambda p, c, params: [0.0] * len(c))])
    with pytest.raises(TypeError, match="reward_params.*must be a mapping"):
        pipeline.generate(messages=CHAT, max_new_tokens=4, runtime_kwargs={"reward_params": "Paris"})

    def label_scorer(prompt, continuations, params):
        return ["best"] + [0.0] * (len(continuations) - 1)

    pipeline = make_pipeline([BestOfN(n=2, scorer=label_scorer)])
    with pytest.raises(TypeError, match=r"label_scorer returned 'best' \(str\)"):
        pipeline.generate(messages=CHAT, max_new_tokens=4)


def test_a_batch_is_refused_with_the_reason(make_pipeline):
    pipeline = make_pipeline([BestOfN(n=2, scorer=lambda p, c, params: [0.0] * len(c))])
    assert pipeline.supports_batching is False
    with pytest.raises(ValueError, match="BestOfN decodes one prompt at a time"):
        pipeline.generate(messages=[CHAT, CHAT], max_new_tokens=4)
