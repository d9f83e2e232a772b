"""SteeringPipeline on the tiny model: sources, shapes, batching, seeds, stops, finish reasons, errors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from steer_hydra.core import (
    DecodingDriver,
    DriverResult,
    ModelSource,
    Output,
    OutputControl,
    SteeringPipeline,
    UnsupportedPipelineError,
)
from steer_hydra.models import TINY_REF

CHATS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is the capital of france"}],
    [{"role": "user", "content": "count from one to ten please"}],
]
TEXTS = ["hi", "what is the capital of france", "count from one to ten please"]


def _strip(row: torch.Tensor, pad: int) -> list[int]:
    ids = row.tolist()
    while ids and ids[-1] == pad:
        ids.pop()
    return ids


def test_generate_before_steer_raises(make_pipeline):
    pipeline = make_pipeline(steer=False)
    with pytest.raises(RuntimeError, match="steer()"):
        pipeline.generate("hi")


def test_steer_twice_is_a_noop(make_pipeline):
    pipeline = make_pipeline()
    model = pipeline.model
    assert pipeline.steer() is pipeline and pipeline.model is model and pipeline.is_steered


@pytest.mark.parametrize("source", ["messages", "text"])
def test_ragged_greedy_batch_matches_each_row_alone(make_pipeline, source):
    pipeline = make_pipeline()
    prompts = CHATS if source == "messages" else TEXTS
    batch = pipeline.generate(**{source: prompts}, max_new_tokens=12, return_output=True)
    assert len(batch) == 3
    pad = pipeline.tokenizer.pad_token_id
    for prompt, output in zip(prompts, batch, strict=True):
        alone = pipeline.generate(**{source: prompt}, max_new_tokens=12, return_output=True)
        assert _strip(output.output_ids[0], pad) == _strip(alone.output_ids[0], pad)
        # the prompt row is left-packed: its real tokens end at the last column
        assert output.adapted_input_ids[0, -1] != pad


def test_token_input_is_left_packed_from_right_padding(make_pipeline):
    pipeline = make_pipeline()
    tok = pipeline.tokenizer
    a, b = tok("hi")["input_ids"], tok("what is the capital of france")["input_ids"]
    width = len(b)
    ids = [a + [tok.pad_token_id] * (width - len(a)), b]
    mask = [[1] * len(a) + [0] * (width - len(a)), [1] * width]
    right = pipeline.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8)
    alone = pipeline.generate(input_ids=a, max_new_tokens=8)
    assert right.shape[0] == 2 and right.dim() == 2
    assert _strip(right[0], tok.pad_token_id) == _strip(alone[0], tok.pad_token_id)
    full = pipeline.generate(input_ids=a, max_new_tokens=8, return_full_sequence=True)
    assert full[0, : len(a)].tolist() == a and full.shape[1] == len(a) + alone.shape[1]


def test_return_shapes(make_pipeline):
    pipeline = make_pipeline()
    assert isinstance(pipeline.generate("hi", max_new_tokens=4), str)
    assert isinstance(pipeline.generate(messages=CHATS[0], max_new_tokens=4), str)
    texts = pipeline.generate(TEXTS, max_new_tokens=4)  # positional list behaves as text=
    assert isinstance(texts, list) and len(texts) == 3 and all(isinstance(t, str) for t in texts)
    single = pipeline.generate(messages=CHATS[0], max_new_tokens=4, return_output=True, n=3, temperature=1.0, seed=1)
    assert isinstance(single, Output) and single.output_ids.shape[0] == 3 and len(single.finish_reasons) == 3
    many = pipeline.generate(messages=CHATS[:2], max_new_tokens=4, return_output=True, n=2, temperature=1.0)
    assert len(many) == 4 and all(o.output_ids.shape[0] == 1 for o in many)
    assert torch.equal(many[0].adapted_input_ids, many[1].adapted_input_ids)
    ids = pipeline.generate(input_ids=[[1, 5, 6], [1, 7, 8]], max_new_tokens=4, n=2, temperature=1.0)
    assert ids.shape[0] == 4
    with pytest.raises(ValueError, match="return_output"):
        pipeline.generate("hi", n=2, temperature=1.0)


def test_greedy_n_candidates_are_identical(make_pipeline):
    pipeline = make_pipeline()
    out = pipeline.generate(messages=CHATS[1], max_new_tokens=6, return_output=True, n=2)
    assert torch.equal(out.output_ids[0], out.output_ids[1])


@pytest.mark.parametrize("scope", ["item", "dispatch"])
def test_seeded_sampling_is_reproducible_and_leaves_global_rng(make_pipeline, scope):
    pipeline = make_pipeline()
    before = torch.get_rng_state()  # whatever ran before: the global RNG is not this test's to set
    kwargs = dict(max_new_tokens=16, temperature=1.0, seed=7, seed_scope=scope)
    first = pipeline.generate(TEXTS, **kwargs)
    second = pipeline.generate(TEXTS, **kwargs)
    other = pipeline.generate(TEXTS, **{**kwargs, "seed": 8})
    assert torch.equal(before, torch.get_rng_state())
    assert first == second
    assert first != other


def test_item_scope_row_seed_does_not_depend_on_batch_mates(make_pipeline):
    pipeline = make_pipeline()
    kwargs = dict(max_new_tokens=16, temperature=1.0, seed=3, seed_scope="item")
    assert pipeline.generate(TEXTS, **kwargs)[0] == pipeline.generate([TEXTS[0], "other prompt"], **kwargs)[0]


def test_unseeded_sampling_advances_global_rng(make_pipeline):
    pipeline = make_pipeline()
    before = torch.get_rng_state()
    pipeline.generate("hi", max_new_tokens=4, temperature=1.0)
    assert not torch.equal(before, torch.get_rng_state())


def test_stop_string_truncates_text_and_keeps_ids(make_pipeline):
    pipeline = make_pipeline()
    tok = pipeline.tokenizer
    free = pipeline.generate(messages=CHATS[1], max_new_tokens=20, return_output=True)
    text = free.decode(tok)[0]
    stop = text[6:9]
    assert len(stop) == 3 and stop.strip()
    cut = pipeline.generate(messages=CHATS[1], max_new_tokens=20, stop_strings=[stop])
    assert cut == text[: text.index(stop)]
    out = pipeline.generate(messages=CHATS[1], max_new_tokens=20, stop_strings=[stop], return_output=True)
    assert out.finish_reasons == ["stop"]
    decoded = out.decode(tok)[0]
    assert stop in decoded and decoded.index(stop) == text.index(stop)  # ids keep the stop text
    assert out.output_ids.shape[1] < free.output_ids.shape[1]


def test_stop_token_and_length_finish_reasons(make_pipeline):
    pipeline = make_pipeline()
    free = pipeline.generate(messages=CHATS[0], max_new_tokens=10, return_output=True)
    assert free.finish_reasons == ["length"] and free.output_ids.shape[1] == 10
    third = int(free.output_ids[0, 2])
    stopped = pipeline.generate(messages=CHATS[0], max_new_tokens=10, stop_token_ids=[third], return_output=True)
    assert stopped.finish_reasons == ["stop"]
    assert stopped.output_ids[0].tolist() == free.output_ids[0, : free.output_ids[0].tolist().index(third) + 1].tolist()


class ForceEos(OutputControl):
    """Test control: a logits processor that forces eos after `after` new tokens."""

    supports_batching = True

    def __init__(self, eos: int, after: int) -> None:
        super().__init__()
        self.eos, self.after = eos, after

    def requirements(self):
        return frozenset()

    def get_logits_processors(self, input_ids, runtime_kwargs, **kwargs):
        prompt_len = input_ids.shape[1]

        def force(ids, scores):
            if ids.shape[1] - prompt_len >= self.after:
                scores = torch.full_like(scores, float("-inf"))
                scores[:, self.eos] = 0.0
            return scores

        return [force]


def test_eos_finish_reason_from_a_logits_processor(tiny):
    model, tok = tiny
    control = ForceEos(tok.eos_token_id, after=3)
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[control]).steer()
    out = pipeline.generate(messages=CHATS[:2], max_new_tokens=10, return_output=True)
    assert [o.finish_reasons for o in out] == [["eos"], ["eos"]]
    assert all(int(o.output_ids[0, 3]) == tok.eos_token_id for o in out)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"text": "hi", "messages": CHATS[0]}, "exactly one prompt source"),
        ({}, "exactly one prompt source"),
        ({"text": "hi", "attention_mask": [[1]]}, "attention_mask"),
        ({"text": "hi", "chat_template_kwargs": {"x": 1}}, "chat_template_kwargs"),
    ],
)
def test_argument_errors_are_type_errors_naming_the_argument(make_pipeline, kwargs, named):
    pipeline = make_pipeline()
    with pytest.raises(TypeError, match=named):
        pipeline.generate(**kwargs)


def test_chat_template_kwargs_reach_the_template(make_pipeline):
    pipeline = make_pipeline()
    pipeline.tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if shout %}!!{% endif %}<|assistant|>\n"
    )
    plain = pipeline.generate(messages=CHATS[0], max_new_tokens=2, return_output=True)
    loud = pipeline.generate(
        messages=CHATS[0], max_new_tokens=2, return_output=True, chat_template_kwargs={"shout": True}
    )
    assert loud.adapted_input_ids.shape[1] > plain.adapted_input_ids.shape[1]
    with pytest.raises(ValueError, match="add_generation_prompt"):
        pipeline.generate(messages=CHATS[0], chat_template_kwargs={"add_generation_prompt": False})


def test_messages_need_a_chat_template(make_pipeline):
    pipeline = make_pipeline(chat=False)
    with pytest.raises(ValueError, match="no chat template"):
        pipeline.generate(messages=CHATS[0])
    assert isinstance(pipeline.generate("hi", max_new_tokens=3), str)


class _Driver(DecodingDriver):
    def requirements(self):
        return frozenset()

    def decode(self, input_ids, attention_mask, *, rollout, runtime_kwargs, tokenizer, max_new_tokens, **kw):
        return DriverResult(rollout(input_ids, attention_mask, max_new_tokens=max_new_tokens, do_sample=False))


class OtherDriver(_Driver):
    pass


def test_check_reports_two_drivers_and_steer_refuses(tiny):
    model, tok = tiny
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[_Driver(), OtherDriver()])
    report = pipeline.check()
    assert not report.ok and len(report.failures) == 1
    failure = report.failures[0]
    assert failure.control == "OtherDriver"
    assert "only one DecodingDriver" in failure.message and "enabled=False" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="OtherDriver"):
        pipeline.steer()
    assert not pipeline.is_steered
    assert SteeringPipeline(model=model, tokenizer=tok, controls=[_Driver(), OtherDriver(enabled=False)]).check().ok


def test_driver_path_counts_rolled_out_tokens(tiny):
    model, tok = tiny
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[_Driver()]).steer()
    out = pipeline.generate(messages=CHATS[1], max_new_tokens=7, return_output=True)
    assert out.generated_tokens == 7 and out.finish_reasons == ["length"]
    plain = SteeringPipeline(model=model, tokenizer=tok).steer()
    assert torch.equal(
        plain.generate(messages=CHATS[1], max_new_tokens=7, return_output=True).output_ids, out.output_ids
    )


def test_supports_batching_and_controls(tiny):
    model, tok = tiny
    assert SteeringPipeline(model=model, tokenizer=tok).supports_batching
    driver = _Driver()
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[driver])
    assert not pipeline.supports_batching and pipeline.controls == [driver] and pipeline.output_controls == [driver]
    assert SteeringPipeline(model=model, tokenizer=tok, controls=[_Driver(enabled=False)]).supports_batching


def test_construction_errors():
    with pytest.raises(ValueError, match="needs a model"):
        SteeringPipeline()
    with pytest.raises(ValueError, match="either device='cpu' or device_map"):
        SteeringPipeline(ModelSource(TINY_REF, device="cpu", device_map={"": 0}))
    control = ForceEos(0, 1)
    with pytest.raises(ValueError, match="twice"):
        SteeringPipeline(TINY_REF, controls=[control, control])
    with pytest.raises(TypeError, match="steer_hydra controls"):
        SteeringPipeline(TINY_REF, controls=["system_prompt"])
    with pytest.raises(ValueError, match="Unknown backend kind 'vlm'"):
        SteeringPipeline(TINY_REF, backend="vlm")


def test_loads_from_reference_and_releases(tmp_path):
    pipeline = SteeringPipeline(ModelSource(TINY_REF, device="cpu"))
    assert pipeline.model is None  # construction does no I/O
    with pipeline:
        pipeline.steer()
        assert pipeline.model is not None and pipeline.tokenizer.padding_side == "left"
        assert isinstance(pipeline.generate("hi", max_new_tokens=3), str)
    assert pipeline.model is None and not pipeline.is_steered


class RecordingControl(OutputControl):
    """Records the runtime kwargs each call receives."""

    supports_batching = True
    RUNTIME_KWARGS_SCHEMA = [{"name": "tag", "type": "str", "scope": "row"}]

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def requirements(self):
        return frozenset()

    def get_logits_processors(self, input_ids, runtime_kwargs: Mapping[str, Any], **kwargs):
        self.seen.append((input_ids.shape[0], runtime_kwargs.get("tag")))
        return []


def test_row_scoped_kwargs_follow_rows_under_n_and_item_seeds(tiny):
    model, tok = tiny
    control = RecordingControl()
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[control]).steer()
    pipeline.generate(
        TEXTS[:2], runtime_kwargs={"tag": ["a", "b"]}, max_new_tokens=2, n=2, temperature=1.0, return_output=True
    )
    assert control.seen[-1] == (4, ["a", "a", "b", "b"])
    control.seen.clear()
    pipeline.generate(
        TEXTS[:2], runtime_kwargs={"tag": ["a", "b"]}, max_new_tokens=2, temperature=1.0, seed=1, seed_scope="item"
    )
    assert control.seen == [(1, ["a"]), (1, ["b"])]


class FlatListControl(RecordingControl):
    RUNTIME_KWARGS_SCHEMA = [{"name": "tag", "type": "list[str]", "scope": "row"}]


def test_flat_list_row_value_at_batch_one_is_repeated_whole_for_n(tiny):
    model, tok = tiny
    control = FlatListControl()
    pipeline = SteeringPipeline(model=model, tokenizer=tok, controls=[control]).steer()
    pipeline.generate(
        "hi", runtime_kwargs={"tag": ["x", "y"]}, max_new_tokens=2, n=3, temperature=1.0, return_output=True
    )
    assert control.seen[-1] == (3, [["x", "y"]] * 3)
    pipeline.generate(
        "hi", runtime_kwargs={"tag": [["x", "y"]]}, max_new_tokens=2, n=2, temperature=1.0, return_output=True
    )
    assert control.seen[-1] == (2, [["x", "y"]] * 2)


class FailingSteer(OutputControl):
    def requirements(self):
        return frozenset()

    def steer(self, model, tokenizer=None, **kwargs):
        raise RuntimeError("cannot prepare")


def test_a_failed_steer_keeps_no_loaded_model():
    pipeline = SteeringPipeline(ModelSource(TINY_REF, device="cpu"), controls=[FailingSteer()])
    with pytest.raises(RuntimeError, match="cannot prepare"):
        pipeline.steer()
    assert pipeline.model is None and pipeline.tokenizer is None and not pipeline.is_steered
