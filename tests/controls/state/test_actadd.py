"""ActAdd: the positional block lands on exactly the aligned positions of the layer input; fitting; no batching."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import ActAdd


def _block(rows=3, hidden=64, seed=5):
    return torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed))


def _layer_input(model, apply_hooks, record_inputs, ids, mask, hooks=None):
    """Input of decoder layer 1 as its first submodule sees it (after any pre-hook on the layer)."""
    norm = model.get_submodule("model.layers.1.input_layernorm")
    with torch.no_grad(), record_inputs(norm) as recorder:
        if hooks is None:
            model(input_ids=ids, attention_mask=mask)
        else:
            with apply_hooks(model, hooks):
                model(input_ids=ids, attention_mask=mask)
    return recorder.inputs[0]


def test_changes_only_the_aligned_positions(tiny, apply_hooks, record_inputs):
    model, tokenizer = tiny
    block = _block()
    actadd = ActAdd(steering_vector=block, layer_id=1, multiplier=2.5, alignment=2)
    actadd.steer(model, tokenizer=tokenizer)
    ids = tokenizer(["the capital of france is paris and the river"], return_tensors="pt")["input_ids"]
    mask = torch.ones_like(ids)
    plain = _layer_input(model, apply_hooks, record_inputs, ids, mask)
    steered = _layer_input(model, apply_hooks, record_inputs, ids, mask, actadd.get_hooks(ids, {}, attention_mask=mask))
    difference = (steered - plain)[0]
    changed = difference.abs().amax(dim=-1) > 0
    assert changed.nonzero().flatten().tolist() == [2, 3, 4]
    torch.testing.assert_close(difference[2:5], 2.5 * block)


def test_left_padded_row_is_aligned_like_the_row_alone(tiny, apply_hooks, record_inputs):
    model, tokenizer = tiny
    block = _block(rows=2)
    actadd = ActAdd(steering_vector=block, layer_id=1, multiplier=1.0, alignment=1)
    actadd.steer(model, tokenizer=tokenizer)
    encoded = tokenizer(["hello", "the capital of france is paris"], padding=True, return_tensors="pt")
    ids, mask = encoded["input_ids"], encoded["attention_mask"]
    pads = int((mask[0] == 0).sum())
    assert pads > 0
    plain = _layer_input(model, apply_hooks, record_inputs, ids, mask)
    steered = _layer_input(model, apply_hooks, record_inputs, ids, mask, actadd.get_hooks(ids, {}, attention_mask=mask))
    difference = steered - plain
    assert (difference[0].abs().amax(-1) > 0).nonzero().flatten().tolist() == [pads + 1, pads + 2]
    assert (difference[1].abs().amax(-1) > 0).nonzero().flatten().tolist() == [1, 2]
    torch.testing.assert_close(difference[0, pads + 1 : pads + 3], block)


def test_block_positions_follow_the_kv_cache_into_decoding(make_pipeline, record_inputs):
    block = _block(rows=8)
    pipeline = make_pipeline([ActAdd(steering_vector=block, layer_id=1, multiplier=1.0)], chat=False)
    model = pipeline.model
    # in one steered run: the output of layer 0 (before ActAdd) and what layer 1 computes on (after ActAdd)
    with record_inputs(model.get_submodule("model.layers.1.input_layernorm")) as after:
        outputs = []
        handle = model.get_submodule("model.layers.0").register_forward_hook(lambda m, a, o: outputs.append(o))
        try:
            pipeline.generate(text="hello cat", max_new_tokens=9)
        finally:
            handle.remove()
    added = torch.cat([a - o for a, o in zip(after.inputs, outputs, strict=True)], dim=1)[0]
    prompt_len = outputs[0].shape[1]
    assert prompt_len < 8 and added.shape[0] == prompt_len + 8  # prefill plus 8 single-token decode steps
    torch.testing.assert_close(added[:8], block)  # prompt positions and the decoded ones inside the block
    assert torch.equal(added[8:], torch.zeros_like(added[8:]))  # past the block: untouched


def test_fitted_block_is_the_positional_difference_at_the_layer_input(tiny):
    model, tokenizer = tiny
    actadd = ActAdd(positive_prompt="Love", negative_prompt="Hate", multiplier=4.0)
    actadd.steer(model, tokenizer=tokenizer)
    assert actadd.layer == 1  # 20% of 2 layers, at least 1
    with torch.no_grad():
        states = {
            text: model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states[1][0]
            for text in ("Love", "Hate")
        }
    expected = states["Love"] - states["Hate"]
    assert expected.shape[0] == 2  # BOS + one word
    torch.testing.assert_close(actadd.vector.tensor, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(actadd.vector.tensor[0], torch.zeros(64))  # the shared BOS contributes nothing
    assert actadd.vector.layer == 1 and actadd.vector.metadata["positive_prompt"] == "Love"
    assert actadd.vector_hash == actadd.vector.content_hash and len(actadd.vector_hash) == 64


def test_prompts_of_different_lengths_are_padded_with_a_space(tiny):
    model, tokenizer = tiny
    actadd = ActAdd(positive_prompt="Love", negative_prompt=" love", layer_id=1)
    actadd.steer(model, tokenizer=tokenizer)
    assert actadd.vector.shape == (len(tokenizer(" love")["input_ids"]), 64)


def test_pipeline_does_not_batch_and_generates(make_pipeline):
    pipeline = make_pipeline([ActAdd(positive_prompt="Love", negative_prompt="Hate", multiplier=8.0)])
    assert pipeline.supports_batching is False
    text = pipeline.generate(messages=[{"role": "user", "content": "tell me a story"}], max_new_tokens=4)
    assert isinstance(text, str)


def test_args_errors_name_the_field(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="ActAdd takes either steering_vector= or positive_prompt="):
        ActAdd(steering_vector=_block(), positive_prompt="a", negative_prompt="b")
    with pytest.raises(ValueError, match="ActAdd needs steering_vector= or both .* negative_prompt=None"):
        ActAdd(positive_prompt="Love")
    with pytest.raises(ValueError, match="ActAdd.alignment must be >= 0"):
        ActAdd(steering_vector=_block(), alignment=-1)
    with pytest.raises(ValueError, match="ActAdd.layer_id must be >= 0"):
        ActAdd(steering_vector=_block(), layer_id=-2)
    with pytest.raises(ValueError, match="ActAdd.steering_vector has width 8"):
        ActAdd(steering_vector=torch.ones(2, 8)).steer(model, tokenizer=tokenizer)
