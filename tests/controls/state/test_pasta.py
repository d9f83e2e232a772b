"""PASTA: attention mass moves exactly as log(alpha) predicts on the selected heads only; batching; check()."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from steer_hydra.controls.state import PASTA
from steer_hydra.controls.state.pasta import IMPLEMENTATION_PREFIX, active_calls
from steer_hydra.core import ModelSource, SteeringPipeline, UnsupportedPipelineError
from steer_hydra.models import TinySpec, build_tiny_model

PROMPTS = ["the capital of france is paris and the river is long", "what is the capital city"]
SUBSTRINGS = [["paris"], ["capital"]]
# tokens the substrings occupy, found independently from the tokenizer's own ids (" paris", " capital")
SPAN_WORDS = [" paris", " capital"]


def _span_columns(tokenizer, input_ids, words):
    columns = []
    for row, word in zip(input_ids.tolist(), words, strict=True):
        (token,) = tokenizer(word, add_special_tokens=False)["input_ids"]
        columns.append([i for i, t in enumerate(row) if t == token])
    return columns


def _attentions(pipeline, runtime_kwargs=None):
    """Post-softmax attention of every layer for PROMPTS, with the control's call active when kwargs are given."""
    model, tokenizer = pipeline.model, pipeline.tokenizer
    encoded = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        if runtime_kwargs is None:
            return encoded, model(**encoded, output_attentions=True).attentions
        (control,) = pipeline.state_controls
        hooks = control.get_hooks(
            encoded["input_ids"], runtime_kwargs, attention_mask=encoded["attention_mask"], model=model
        )
        (factory,) = hooks["context"]
        with factory():
            return encoded, model(**encoded, output_attentions=True).attentions


@pytest.mark.parametrize(("scale_position", "alpha"), [("include", 4.0), ("exclude", 0.2)])
def test_attention_mass_moves_by_the_predicted_renormalisation(make_pipeline, scale_position, alpha):
    pasta = PASTA(head_config={1: [0, 2]}, alpha=alpha, scale_position=scale_position)
    pipeline = make_pipeline([pasta], attn_implementation="eager")
    encoded, before = _attentions(pipeline)
    _, after = _attentions(pipeline, {"substrings": SUBSTRINGS})

    # layer 0 is not selected (and its inputs are unchanged): identical; layer 1 heads 1 and 3 likewise
    assert torch.equal(before[0], after[0])
    assert torch.equal(before[1][:, [1, 3]], after[1][:, [1, 3]])

    mask = encoded["attention_mask"].bool()
    spans = _span_columns(pipeline.tokenizer, encoded["input_ids"], SPAN_WORDS)
    for row in range(len(PROMPTS)):
        in_span = torch.zeros(mask.shape[1], dtype=torch.bool)
        in_span[spans[row]] = True
        outside = mask[row] & ~in_span
        queries = mask[row].nonzero().flatten()
        for head in (0, 2):
            p, q = before[1][row, head][queries].double(), after[1][row, head][queries].double()
            span_mass, out_mass = p[:, in_span].sum(-1), p[:, outside].sum(-1)
            if scale_position == "include":  # outside columns scaled by 1/alpha, then renormalised
                expected = span_mass / (span_mass + out_mass / alpha)
                torch.testing.assert_close(q[:, in_span].sum(-1), expected, atol=1e-5, rtol=1e-5)
                visible = span_mass > 1e-3
                assert int(visible.sum()) >= 1
                assert bool((q[:, in_span].sum(-1)[visible] > span_mass[visible]).all())
            else:  # outside columns scaled by alpha, then renormalised
                expected = alpha * out_mass / (alpha * out_mass + span_mass)
                torch.testing.assert_close(q[:, outside].sum(-1), expected, atol=1e-5, rtol=1e-5)
                visible = (span_mass > 1e-3) & (out_mass > 1e-3)
                assert int(visible.sum()) >= 1
                assert bool((q[:, outside].sum(-1)[visible] < out_mass[visible]).all())
            # the whole distribution: each column's weight is scaled by its factor and renormalised
            factor = torch.where(in_span, 1.0, 1 / alpha if scale_position == "include" else alpha).double()
            predicted = p * factor
            predicted = predicted / predicted.sum(-1, keepdim=True)
            torch.testing.assert_close(q, predicted, atol=1e-5, rtol=1e-5)
    assert active_calls() == ()


def test_alpha_one_gives_logits_identical_to_no_control(make_pipeline):
    plain = make_pipeline([])
    steered = make_pipeline([PASTA(head_config=[0, 1], alpha=1.0, scale_position="include")])
    encoded = plain.tokenizer(PROMPTS, padding=True, return_tensors="pt")
    assert steered.model.config._attn_implementation == IMPLEMENTATION_PREFIX + "sdpa"
    with torch.no_grad():
        reference = plain.model(**encoded).logits
        (control,) = steered.state_controls
        hooks = control.get_hooks(
            encoded["input_ids"], {"substrings": SUBSTRINGS}, attention_mask=encoded["attention_mask"], model=None
        )
        assert hooks == {}
        logits = steered.model(**encoded).logits
    assert torch.equal(logits, reference)
    kwargs = {"max_new_tokens": 6, "runtime_kwargs": {"substrings": SUBSTRINGS}}
    assert steered.generate(text=PROMPTS, **kwargs) == plain.generate(text=PROMPTS, max_new_tokens=6)


def test_sdpa_path_matches_eager_path(make_pipeline):
    kwargs = {"substrings": SUBSTRINGS}
    results = {}
    for implementation in ("eager", "sdpa"):
        pipeline = make_pipeline(
            [PASTA(head_config={0: [1], 1: [0, 3]}, alpha=0.05)], attn_implementation=implementation
        )
        (control,) = pipeline.state_controls
        encoded = pipeline.tokenizer(PROMPTS, padding=True, return_tensors="pt")
        hooks = control.get_hooks(
            encoded["input_ids"], kwargs, attention_mask=encoded["attention_mask"], model=pipeline.model
        )
        with torch.no_grad(), hooks["context"][0]():
            results[implementation] = pipeline.model(**encoded).logits
    plain, _ = build_tiny_model(TinySpec())
    with torch.no_grad():
        unsteered = plain(**encoded).logits
    torch.testing.assert_close(results["sdpa"], results["eager"], atol=1e-5, rtol=1e-5)
    assert (results["sdpa"] - unsteered).abs().max() > 1e-2  # the steering did something


def test_batch_with_different_substrings_matches_each_row_alone(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0, 1], alpha=0.01, scale_position="exclude")])
    chats = [
        [{"role": "user", "content": "the capital of france is paris. what is the capital of france"}],
        [{"role": "user", "content": "count one two three"}],
        [{"role": "user", "content": "tell me a short story about a cat and a dog"}],
    ]
    substrings = [["paris"], ["three", "count"], ["dog"]]
    batched = pipeline.generate(
        messages=chats, runtime_kwargs={"substrings": substrings}, max_new_tokens=10, return_output=True
    )
    for i, chat in enumerate(chats):
        alone = pipeline.generate(
            messages=chat, runtime_kwargs={"substrings": [substrings[i]]}, max_new_tokens=10, return_output=True
        )
        assert batched[i].output_ids[0].tolist() == alone.output_ids[0].tolist()
    unsteered = make_pipeline([]).generate(messages=chats, max_new_tokens=10, return_output=True)
    changed = [b.output_ids.tolist() != u.output_ids.tolist() for b, u in zip(batched, unsteered, strict=True)]
    assert sum(changed) >= 2  # the per-row spans changed the generations


def test_substring_forms(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0], alpha=0.1)])
    (control,) = pipeline.state_controls
    encoded = pipeline.tokenizer(PROMPTS, padding=True, return_tensors="pt")

    def columns(value, rows=slice(None)):
        ids, mask = encoded["input_ids"][rows], encoded["attention_mask"][rows]
        hooks = control.get_hooks(ids, {"substrings": value}, attention_mask=mask, model=pipeline.model)
        return hooks["context"][0].args[0].columns

    broadcast = columns("capital")
    per_row = columns([["capital"], ["capital"]])
    assert torch.equal(broadcast, per_row)
    assert torch.equal(columns(["paris", "river"], rows=slice(0, 1)), columns([["paris", "river"]], rows=slice(0, 1)))
    # exclude: non-span real columns get log(alpha); span and pad columns stay 0
    spans = _span_columns(pipeline.tokenizer, encoded["input_ids"], [" capital", " capital"])
    for row in range(2):
        expected = encoded["attention_mask"][row].float() * math.log(0.1)
        expected[spans[row]] = 0.0
        torch.testing.assert_close(per_row[row], expected)
    for bad in (["paris", "capital"], [["paris"]], [["paris"], "capital"], 3, [["paris"], [1]]):
        with pytest.raises(ValueError, match="must be a str .* list\\[list\\[str\\]\\] .* flat list\\[str\\] at batch"):
            columns(bad)


def test_missing_substring_warns_once_and_is_skipped(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0], alpha=0.1)])
    (control,) = pipeline.state_controls
    encoded = pipeline.tokenizer(PROMPTS[:1], return_tensors="pt")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            hooks = control.get_hooks(
                encoded["input_ids"],
                {"substrings": [["not in the prompt", "paris"]]},
                attention_mask=encoded["attention_mask"],
                model=pipeline.model,
            )
    messages = [str(w.message) for w in caught if "not in the prompt" in str(w.message)]
    assert len(messages) == 1 and "skipped" in messages[0]
    # the found substring is still highlighted
    assert int((hooks["context"][0].args[0].columns[0] == 0).sum()) == 1
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        nothing = control.get_hooks(
            encoded["input_ids"],
            {"substrings": "absent"},
            attention_mask=encoded["attention_mask"],
            model=pipeline.model,
        )
    assert nothing == {}  # no span anywhere: the call is unsteered


def test_check_refuses_flash_attention_and_names_the_fix():
    model, tokenizer = build_tiny_model()
    pipeline = SteeringPipeline(
        ModelSource(hf_model_kwargs={"attn_implementation": "flash_attention_2"}),
        model=model,
        tokenizer=tokenizer,
        controls=[PASTA(head_config=[0], alpha=0.5)],
    )
    report = pipeline.check()
    assert not report.ok
    (message,) = report.messages()
    assert "PASTA" in message and "flash_attention_2" in message and "'sdpa'" in message and "'eager'" in message
    with pytest.raises(UnsupportedPipelineError, match="flash"):
        pipeline.steer()
    ok = SteeringPipeline(
        ModelSource(hf_model_kwargs={"attn_implementation": "eager"}),
        model=model,
        tokenizer=tokenizer,
        controls=[PASTA()],
    )
    assert ok.check().ok


def test_steer_refuses_a_model_loaded_with_flash_attention(tiny):
    model, tokenizer = tiny
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match="flash attention ignores additive attention masks.*Fix:.*'sdpa'"):
        PASTA(head_config=[0], alpha=0.5).steer(model, tokenizer=tokenizer)


def test_steer_switches_implementation_and_cleanup_restores_it(tiny):
    model, tokenizer = tiny
    pasta = PASTA(head_config={1: [2]}, alpha=2.0, scale_position="include")
    pasta.steer(model, tokenizer=tokenizer)
    assert model.config._attn_implementation == "steer_hydra_pasta_sdpa"
    pasta.cleanup()
    assert model.config._attn_implementation == "sdpa"


def test_head_config_errors_name_the_field(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="PASTA.alpha must be a finite number > 0"):
        PASTA(alpha=0.0)
    with pytest.raises(TypeError, match="PASTA.alpha must be float"):
        PASTA(alpha="big")
    with pytest.raises(ValueError, match=r"PASTA.head_config\[0\] must be a non-empty list"):
        PASTA(head_config={0: []})
    with pytest.raises(ValueError, match="PASTA.head_config is empty"):
        PASTA(head_config=[])
    with pytest.raises(TypeError, match="PASTA.scale_position must be one of"):
        PASTA(scale_position="everywhere")
    with pytest.raises(ValueError, match="PASTA.head_config names layer 5, but the model has 2 layers"):
        PASTA(head_config=[5], alpha=2.0).steer(model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="PASTA.head_config names heads \\[4\\] of layer 0"):
        PASTA(head_config={0: [4]}, alpha=2.0).steer(model, tokenizer=tokenizer)


def test_runtime_kwarg_declaration_and_batching_flag(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0], alpha=0.5)])
    assert pipeline.supports_batching is True
    (entry,) = PASTA.RUNTIME_KWARGS_SCHEMA
    assert (entry["name"], entry["type"], entry["required"], entry["scope"]) == ("substrings", "list[str]", True, "row")
    plain = make_pipeline().generate(text="hello", max_new_tokens=4)
    with pytest.warns(UserWarning, match="no substrings .* left unsteered"):
        assert pipeline.generate(text="hello", max_new_tokens=4) == plain
    default = make_pipeline([PASTA(head_config=[0], alpha=0.01, substrings=["paris"])])
    steered = default.generate(text=PROMPTS[0], max_new_tokens=5)
    explicit = default.generate(text=PROMPTS[0], max_new_tokens=5, runtime_kwargs={"substrings": "paris"})
    assert steered == explicit


def test_generation_scale_position_shifts_every_prompt_column(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0], alpha=3.0, scale_position="generation")])
    (control,) = pipeline.state_controls
    encoded = pipeline.tokenizer(PROMPTS, padding=True, return_tensors="pt")
    hooks = control.get_hooks(encoded["input_ids"], {}, attention_mask=encoded["attention_mask"], model=pipeline.model)
    columns = hooks["context"][0].args[0].columns
    torch.testing.assert_close(columns, encoded["attention_mask"].float() * math.log(3.0))


def test_generic_eager_fallback_matches_the_model_eager():
    from transformers.models.llama import modeling_llama

    from steer_hydra.controls.state.pasta import _eager_for, _generic_eager

    model, _ = build_tiny_model(TinySpec(num_key_value_heads=2))
    attention = model.get_submodule("model.layers.0.self_attn")
    assert _eager_for(type(attention)) is modeling_llama.eager_attention_forward
    assert _eager_for(torch.nn.Linear) is _generic_eager
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(2, h, 5, 16, generator=generator) for h in (4, 2, 2))
    mask = torch.where(torch.rand(2, 1, 5, 5, generator=generator) > 0.3, 0.0, torch.finfo(torch.float32).min)
    expected = modeling_llama.eager_attention_forward(attention, query, key, value, mask, scaling=0.25)
    actual = _generic_eager(attention, query, key, value, mask, scaling=0.25)
    for a, e in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, e)


def test_beam_expanded_batches_keep_each_row_on_its_own_spans(make_pipeline):
    pipeline = make_pipeline([PASTA(head_config=[0, 1], alpha=0.01)])
    kwargs = {"max_new_tokens": 5, "num_beams": 3, "return_output": True}
    batched = pipeline.generate(text=PROMPTS, runtime_kwargs={"substrings": SUBSTRINGS}, **kwargs)
    for i, prompt in enumerate(PROMPTS):
        alone = pipeline.generate(text=prompt, runtime_kwargs={"substrings": [SUBSTRINGS[i]]}, **kwargs)
        assert batched[i].output_ids[0].tolist() == alone.output_ids[0].tolist()
