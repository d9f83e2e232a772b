"""The state controls on other decoder families (grouped-query attention, sliding windows, Gemma's eager)."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, PASTA
from steer_hydra.core import SteeringPipeline
from steer_hydra.models import build_tiny_tokenizer
from steer_hydra.models.tiny import build_family_model

PROMPTS = ["the capital of france is paris and the river", "count one two three"]
SUBSTRINGS = [["paris"], ["two"]]


def _model(model_type: str, attn: str, vocab: int, **overrides):
    model = build_family_model(model_type, attn_implementation=attn, vocab_size=vocab, **overrides)
    for parameter in model.parameters():  # larger weights, so that attention is far from uniform
        parameter.data.mul_(8.0 if parameter.dim() > 1 else 1.0)
    return model.eval()


def _generate(model_type, attn, controls, runtime_kwargs):
    tokenizer = build_tiny_tokenizer()
    model = _model(model_type, attn, len(tokenizer))
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=controls).steer()
    try:
        out = pipeline.generate(text=PROMPTS, max_new_tokens=6, runtime_kwargs=runtime_kwargs, return_output=True)
        return [o.output_ids[0].tolist() for o in out]
    finally:
        pipeline.release()


@pytest.mark.parametrize("model_type", ["qwen2", "gemma3_text"])
def test_pasta_sdpa_and_eager_agree_with_grouped_query_attention(model_type):
    kwargs = {"substrings": SUBSTRINGS}
    results = {
        attn: _generate(model_type, attn, [PASTA(head_config={0: [0, 3], 1: [1]}, alpha=0.001)], kwargs)
        for attn in ("eager", "sdpa")
    }
    assert results["eager"] == results["sdpa"]
    assert results["sdpa"] != _generate(model_type, "sdpa", [], None)  # the steering changed the greedy tokens


def test_two_pasta_controls_compose_like_one_over_both_head_sets():
    kwargs = {"substrings": SUBSTRINGS}
    with pytest.warns(UserWarning, match="read by several controls"):
        split = _generate(
            "qwen2",
            "sdpa",
            [PASTA(head_config={1: [0]}, alpha=0.001), PASTA(head_config={1: [2]}, alpha=0.001)],
            kwargs,
        )
    joined = _generate("qwen2", "sdpa", [PASTA(head_config={1: [0, 2]}, alpha=0.001)], kwargs)
    assert split == joined


def test_caa_hooks_the_layer_output_of_gemma(record_inputs, apply_hooks):
    tokenizer = build_tiny_tokenizer()
    model = _model("gemma3_text", "sdpa", len(tokenizer))
    vector = torch.randn(32, generator=torch.Generator().manual_seed(1))
    caa = CAA(steering_vector=vector, layer_id=0, multiplier=2.0, token_scope="all")
    caa.steer(model, tokenizer=tokenizer)
    ids = tokenizer(PROMPTS[:1], return_tensors="pt")["input_ids"]
    layer1 = model.get_submodule("model.layers.1")
    with torch.no_grad(), record_inputs(layer1) as plain:
        model(input_ids=ids)
    with torch.no_grad(), apply_hooks(model, caa.get_hooks(ids, {}, model=model)), record_inputs(layer1) as steered:
        model(input_ids=ids)
    torch.testing.assert_close(steered.inputs[0] - plain.inputs[0], (2.0 * vector).expand_as(plain.inputs[0]))


def test_pasta_on_sliding_window_layers_past_the_window_matches_uncached_decoding():
    tokenizer = build_tiny_tokenizer()
    outputs = {}
    for name, controls, cache in (
        ("cached", [PASTA(head_config=[0, 1], alpha=0.001)], True),
        ("uncached", [PASTA(head_config=[0, 1], alpha=0.001)], False),
        ("unsteered", [], True),
    ):
        model = _model("gemma3_text", "sdpa", len(tokenizer), sliding_window=4)
        pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=controls).steer()
        out = pipeline.generate(
            text=PROMPTS,
            max_new_tokens=8,
            use_cache=cache,
            runtime_kwargs={"substrings": SUBSTRINGS},
            return_output=True,
        )
        outputs[name] = [o.output_ids[0].tolist() for o in out]
        pipeline.release()
    # with a KV cache the sliding layers only hold the last positions; the bias must follow their columns
    assert outputs["cached"] == outputs["uncached"]
    assert outputs["cached"] != outputs["unsteered"]
