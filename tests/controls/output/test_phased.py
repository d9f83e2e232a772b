"""PhasedDecoding: forced phases appear verbatim, generated phases end at their budget, their stop strings or early
(an eos dropped before a forced phase), per-row forced text, the total budget, a row alone as in a batch."""

from __future__ import annotations

import pytest

from steer_hydra.controls.output import PhasedDecoding
from steer_hydra.controls.output.phased import Forced, Generated, parse_phases
from steer_hydra.core import SteeringPipeline

PROMPTS = ["hello there cat and dog", "a", "what is the capital of france", "count one two three"]
GREEDY = {"max_new_tokens": 24, "do_sample": False}


def _row(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def test_forced_parts_appear_verbatim_around_the_generated_part(make_pipeline):
    control = PhasedDecoding(phases=[{"force": "Answer:"}, {"generate": 5}, {"force": " Done."}])
    pipeline = make_pipeline([control])
    tok = pipeline.tokenizer
    outputs = pipeline.generate(text=PROMPTS, return_output=True, **GREEDY)
    for output, spans in zip(outputs, control.last_spans, strict=True):
        ids = _row(output, tok.pad_token_id)
        text = tok.decode(ids, skip_special_tokens=True)
        assert text.startswith("Answer:") and text.endswith(" Done.")
        forced, generated, suffix = spans
        assert (forced.ended, suffix.ended) == ("forced", "forced")
        assert tok.decode(ids[forced.start : forced.end]) == "Answer:"
        assert tok.decode(ids[suffix.start : suffix.end]) == " Done." and suffix.end == len(ids)
        assert generated.ended in ("budget", "early") and generated.end - generated.start <= 5
    # every generated token was rolled out once (one rollout, one phase); forced tokens were not
    rolled = sum(s[1].end - s[1].start for s in control.last_spans)
    assert sum(o.generated_tokens for o in outputs) >= rolled > 0


def test_a_row_alone_equals_the_row_in_a_batch(make_pipeline):
    phases = [{"force": "The answer"}, {"generate": 6}, {"force": "\nSo:"}, {"generate": None}]
    pipeline = make_pipeline([PhasedDecoding(phases=phases)])
    pad = pipeline.tokenizer.pad_token_id
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    batched = pipeline.generate(messages=chats, return_output=True, **GREEDY)
    assert len({len(_row(o, pad)) for o in batched}) >= 1
    for chat, in_batch in zip(chats, batched, strict=True):
        alone = pipeline.generate(messages=[chat], return_output=True, **GREEDY)[0]
        assert _row(alone, pad) == _row(in_batch, pad)
    assert pipeline.supports_batching and PhasedDecoding.supports_refill is False


def test_a_stop_string_ends_the_generated_phase_and_the_next_phase_follows(make_pipeline):
    plain = make_pipeline([])
    tok = plain.tokenizer
    free = plain.generate(text=PROMPTS[0], return_output=True, max_new_tokens=8, do_sample=False)
    ids = _row(free, tok.pad_token_id)
    stop = tok.decode(ids[2:3])  # a piece of what the model writes at its third token
    assert stop.strip()
    control = PhasedDecoding(phases=[{"generate": 8, "stop": [stop]}, {"force": "|end"}])
    steered = make_pipeline([control])
    out = _row(
        steered.generate(text=PROMPTS[0], return_output=True, max_new_tokens=16, do_sample=False), tok.pad_token_id
    )
    ((generated, forced),) = control.last_spans
    assert generated.ended == "stop" and generated.end <= 3
    assert out[: generated.end] == ids[: generated.end]  # the model's own tokens up to the stop
    # the phase ends at the token that completes the stop string (kept in the response)
    assert stop in tok.decode(out[: generated.end]) and stop not in tok.decode(out[: generated.end - 1])
    assert tok.decode(out[forced.start :]) == "|end"


def test_an_eos_before_a_forced_phase_is_dropped(make_pipeline, step_controls):
    eos = None

    def pipeline_with(phases):
        nonlocal eos
        pipeline = make_pipeline([step_controls["force_after"](0, after=2), PhasedDecoding(phases=phases)])
        eos = pipeline.tokenizer.eos_token_id
        pipeline.output_controls[0].token_id = eos  # the model ends the sequence after two tokens
        return pipeline

    control_phases = [{"generate": 6}, {"force": " tail"}]
    pipeline = pipeline_with(control_phases)
    driver = pipeline.output_controls[1]
    out = _row(pipeline.generate(text=PROMPTS[0], return_output=True, **GREEDY), pipeline.tokenizer.pad_token_id)
    ((generated, forced),) = driver.last_spans
    assert generated.ended == "early" and generated.end - generated.start == 2 and eos not in out
    assert pipeline.tokenizer.decode(out[forced.start :]) == " tail"
    last = pipeline_with([{"force": "x"}, {"generate": 6}])  # the last phase keeps its eos (the row's end)
    out = _row(last.generate(text=PROMPTS[0], return_output=True, **GREEDY), last.tokenizer.pad_token_id)
    assert out[-1] == eos


def test_per_row_forced_texts_and_the_total_budget(make_pipeline):
    control = PhasedDecoding(phases=[{"force": "", "name": "lead"}, {"generate": 3}, {"force": " end"}])
    pipeline = make_pipeline([control])
    tok = pipeline.tokenizer
    leads = [{"lead": "Yes,"}, {"lead": "No:"}, {}]
    outputs = pipeline.generate(text=PROMPTS[:3], return_output=True, runtime_kwargs={"forced_texts": leads}, **GREEDY)
    texts = [tok.decode(_row(o, tok.pad_token_id), skip_special_tokens=True) for o in outputs]
    assert texts[0].startswith("Yes,") and texts[1].startswith("No:") and texts[2].endswith(" end")
    assert control.last_spans[2][0].start == control.last_spans[2][0].end  # no text for the third row's lead
    one = pipeline.generate(text=PROMPTS[0], runtime_kwargs={"forced_texts": {"lead": "Sure"}}, **GREEDY)
    assert one.startswith("Sure")
    with pytest.raises(ValueError, match=r"forced_texts of row 0 .* Fix"):
        pipeline.generate(text=PROMPTS[0], runtime_kwargs={"forced_texts": {"other": "x"}}, **GREEDY)
    short = PhasedDecoding(phases=[{"force": "one two three four five six"}, {"generate": 4}])
    capped = make_pipeline([short])
    output = capped.generate(text=PROMPTS[0], return_output=True, max_new_tokens=3, do_sample=False)
    assert len(_row(output, tok.pad_token_id)) == 3 and output.finish_reasons == ["length"]
    assert [s.ended for s in short.last_spans[0]] == ["forced", "skipped"]


def test_sampling_runs_and_owned_kwargs_are_refused(make_pipeline):
    pipeline = make_pipeline([PhasedDecoding(phases=[{"force": "A:"}, {"generate": 4}])])
    texts = pipeline.generate(text=PROMPTS[:2], max_new_tokens=8, do_sample=True, temperature=0.8, seed=1)
    assert all(t.startswith("A:") for t in texts)
    with pytest.raises(ValueError, match=r"PhasedDecoding sets \['min_new_tokens'\] itself.*Fix"):
        pipeline.generate(text=PROMPTS[0], max_new_tokens=8, min_new_tokens=2)


@pytest.mark.parametrize(
    ("phases", "match"),
    [
        ([], r"PhasedDecoding.phases is empty"),
        ([{"force": "a", "generate": 3}], r"phases\[0\] must be a mapping with exactly one of 'force'"),
        ([{"force": 3}], r"phases\[0\]: a forced phase is"),
        ([{"force": ""}], r"phases\[0\] forces no text"),
        ([{"generate": 0}], r"phases\[0\].generate must be a positive number of tokens or null"),
        ([{"generate": 3, "stop": "x"}], r"phases\[0\].stop must be a list of non-empty strings"),
        ([{"generate": 3, "until": "x"}], r"phases\[0\] has unknown key\(s\) \['until'\]"),
        ([{"force": "a", "name": "n"}, {"force": "b", "name": "n"}], r"the phase name 'n' is used twice"),
    ],
)
def test_invalid_plans_are_refused(phases, match):
    with pytest.raises(ValueError, match=match):
        PhasedDecoding(phases=phases)


def test_the_plan_parses_and_runs_wherever_rollouts_run():
    plan = parse_phases([{"force": "a", "name": "x"}, {"generate": None, "stop": ["\n"]}])
    assert plan == (Forced("a", "x"), Generated(None, ("\n",)))
    control = PhasedDecoding(phases=[{"force": "a"}, {"generate": 4}, {"generate": 2}])
    assert control.max_rollouts_per_query() == 2
    for backend in ("huggingface", "vllm", "vllm_serve"):
        assert SteeringPipeline("steer_hydra:tiny", controls=[control], backend=backend).check().ok, backend
