"""CAA: exactly multiplier * v after the prompt at the steered layer (also left-padded, with KV cache); fitting."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, SteeringVector
from steer_hydra.core import Capability

PROMPTS = ["the capital of france is", "hello", "count one two three four five"]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
]


def _vector(hidden=64, seed=3):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(hidden, generator=generator)


def test_generate_adds_exactly_multiplier_v_after_the_prompt_on_left_padded_rows(make_pipeline, record_inputs):
    vector = _vector()
    steered = make_pipeline([CAA(steering_vector=vector, layer_id=0, multiplier=3.0)])
    plain = make_pipeline([])
    runs = {}
    for name, pipeline in (("steered", steered), ("plain", plain)):
        # the input of layer 1 is the (steered) output of layer 0
        with record_inputs(pipeline.model.get_submodule("model.layers.1")) as recorder:
            out = pipeline.generate(text=PROMPTS, max_new_tokens=3, return_output=True)
        runs[name] = (recorder.inputs, out)
    steered_inputs, plain_inputs = runs["steered"][0], runs["plain"][0]
    prompt_len = runs["plain"][1][0].adapted_input_ids.shape[1]
    # prefill: the whole (left-padded) prompt, every row, is untouched
    assert steered_inputs[0].shape[:2] == (3, prompt_len)
    assert torch.equal(steered_inputs[0], plain_inputs[0])
    # first decode step (position == prompt length, KV cache in use): exactly + multiplier * v on every row
    assert steered_inputs[1].shape[1] == 1
    torch.testing.assert_close(steered_inputs[1] - plain_inputs[1], (3.0 * vector).expand(3, 1, 64), atol=1e-5, rtol=0)
    assert torch.equal(steered_inputs[1], plain_inputs[1] + 3.0 * vector)
    # later steps are steered too (their inputs differ from the unsteered run by at least the vector)
    assert all(not torch.equal(s, p) for s, p in zip(steered_inputs[2:], plain_inputs[2:], strict=True))


@pytest.mark.parametrize(
    ("scope", "last_k", "first_steered"),
    [("after_prompt", None, 6), ("all", None, 0), ("last_k", 2, 4)],
)
def test_token_scopes_on_a_full_forward(tiny, apply_hooks, record_inputs, scope, last_k, first_steered):
    model, tokenizer = tiny
    vector = _vector()
    caa = CAA(steering_vector=vector, layer_id=0, multiplier=-2.0, token_scope=scope, last_k=last_k)
    caa.steer(model, tokenizer=tokenizer)
    prompt = torch.tensor([[1, 50, 60, 70, 80, 90]])  # padded prompt length 6
    sequence = torch.cat([prompt, torch.tensor([[100, 110, 120]])], dim=1)  # prompt + 3 "generated" tokens
    layer1 = model.get_submodule("model.layers.1")
    with torch.no_grad(), record_inputs(layer1) as plain:
        model(input_ids=sequence)
    hooks = caa.get_hooks(prompt, {}, attention_mask=torch.ones_like(prompt), model=model)
    with torch.no_grad(), apply_hooks(model, hooks), record_inputs(layer1) as steered:
        model(input_ids=sequence)
    difference = steered.inputs[0] - plain.inputs[0]
    assert torch.equal(difference[:, :first_steered], torch.zeros_like(difference[:, :first_steered]))
    torch.testing.assert_close(difference[0, first_steered:], (-2.0 * vector).expand(9 - first_steered, 64))


def test_fitted_vector_equals_an_independent_mean_difference(tiny):
    model, tokenizer = tiny
    caa = CAA(data=PAIRS, layer_id=0, prompt_format="text", batch_size=2)
    caa.steer(model, tokenizer=tokenizer)
    differences = []
    with torch.no_grad():
        for pair in PAIRS:
            last = {}
            for side in ("positive", "negative"):
                encoded = tokenizer(pair["prompt"] + pair[side], return_tensors="pt")
                hidden_states = model(**encoded, output_hidden_states=True).hidden_states
                last[side] = hidden_states[1][0, -1]  # output of decoder layer 0 at the answer token
            differences.append(last["positive"] - last["negative"])
    expected = torch.stack(differences).mean(dim=0)
    torch.testing.assert_close(caa.vector.tensor, expected, atol=1e-5, rtol=1e-5)
    assert caa.vector.layer == 0 and caa.vector.metadata["pairs"] == 3
    assert caa.vector_hash == caa.vector.content_hash


def test_fitting_with_the_chat_template(tiny):
    model, tokenizer = tiny
    caa = CAA(data=PAIRS[:2], layer_id=1, prompt_format="chat")
    caa.steer(model, tokenizer=tokenizer)
    differences = []
    seen = []
    handle = model.get_submodule("model.layers.1").register_forward_hook(lambda m, a, o: seen.append(o))
    with torch.no_grad():
        for pair in PAIRS[:2]:
            last = {}
            for side in ("positive", "negative"):
                head = tokenizer.apply_chat_template(
                    [{"role": "user", "content": pair["prompt"]}], tokenize=False, add_generation_prompt=True
                )
                ids = tokenizer(head + pair[side], add_special_tokens=False, return_tensors="pt")["input_ids"]
                assert ids[0, 0] == tokenizer.bos_token_id and (ids[0] == tokenizer.bos_token_id).sum() == 1
                model(input_ids=ids)
                last[side] = seen.pop()[0, -1]
            differences.append(last["positive"] - last["negative"])
    handle.remove()
    torch.testing.assert_close(caa.vector.tensor, torch.stack(differences).mean(0), atol=1e-5, rtol=1e-5)


def test_vector_from_a_saved_file_keeps_its_layer_and_hash(tiny, tmp_path):
    model, tokenizer = tiny
    saved = SteeringVector(_vector(), layer=1, metadata={"source": "test"})
    path = saved.save(tmp_path / "v.safetensors")
    caa = CAA(steering_vector=str(path))
    caa.steer(model, tokenizer=tokenizer)
    assert caa.layer == 1
    assert caa.vector_hash == saved.content_hash
    assert torch.equal(caa.vector.tensor, saved.tensor)
    default_layer = CAA(steering_vector=_vector())
    default_layer.steer(model, tokenizer=tokenizer)
    assert default_layer.layer == 1  # round(0.4 * 2 layers)


def test_normalisation_and_norm_preservation(tiny, apply_hooks, record_inputs):
    model, tokenizer = tiny
    vector = _vector() * 7
    prompt = torch.tensor([[1, 50, 60]])
    sequence = torch.tensor([[1, 50, 60, 70, 80]])
    layer1 = model.get_submodule("model.layers.1")
    with torch.no_grad(), record_inputs(layer1) as plain:
        model(input_ids=sequence)
    normalized = CAA(steering_vector=vector, layer_id=0, multiplier=2.0, normalize_vector=True)
    normalized.steer(model, tokenizer=tokenizer)
    with torch.no_grad(), apply_hooks(model, normalized.get_hooks(prompt, {}, model=model)), record_inputs(layer1) as s:
        model(input_ids=sequence)
    torch.testing.assert_close((s.inputs[0] - plain.inputs[0])[0, 3:], (2.0 * vector / vector.norm()).expand(2, 64))
    preserved = CAA(steering_vector=vector, layer_id=0, multiplier=2.0, use_norm_preservation=True)
    preserved.steer(model, tokenizer=tokenizer)
    with torch.no_grad(), apply_hooks(model, preserved.get_hooks(prompt, {}, model=model)), record_inputs(layer1) as p:
        model(input_ids=sequence)
    torch.testing.assert_close(p.inputs[0].norm(dim=-1), plain.inputs[0].norm(dim=-1))
    assert not torch.allclose(p.inputs[0][0, 3:], plain.inputs[0][0, 3:])
    assert torch.equal(p.inputs[0][0, :3], plain.inputs[0][0, :3])


def test_args_errors_name_the_field(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="CAA needs exactly one of steering_vector= .* got both"):
        CAA(steering_vector=_vector(), data=PAIRS)
    with pytest.raises(ValueError, match="got neither"):
        CAA()
    with pytest.raises(ValueError, match=r"CAA.data\[1\] needs a non-empty string 'negative'"):
        CAA(data=[PAIRS[0], {"positive": "a"}])
    with pytest.raises(ValueError, match="CAA.last_k must be an int >= 1"):
        CAA(steering_vector=_vector(), token_scope="last_k")
    with pytest.raises(ValueError, match="CAA.last_k=3 is only used with token_scope='last_k'"):
        CAA(steering_vector=_vector(), last_k=3)
    with pytest.raises(TypeError, match="CAA.token_scope must be one of"):
        CAA(steering_vector=_vector(), token_scope="prompt")
    with pytest.raises(TypeError, match="CAA.multiplier must be float"):
        CAA(steering_vector=_vector(), multiplier="2")
    with pytest.raises(ValueError, match="CAA.layer_id=7 is out of range; the model has 2 layers"):
        CAA(steering_vector=_vector(), layer_id=7).steer(model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="CAA.steering_vector has width 32 but the model's hidden size is 64"):
        CAA(steering_vector=torch.ones(32)).steer(model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="one direction \\[hidden\\]; got shape \\(3, 64\\)"):
        CAA(steering_vector=torch.ones(3, 64)).steer(model, tokenizer=tokenizer)


def test_declarations(make_pipeline):
    assert CAA(data=PAIRS).requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert CAA(steering_vector=_vector()).requirements() == {Capability.IN_PROCESS_TORCH}
    assert CAA.RUNTIME_KWARGS_SCHEMA == []
    assert make_pipeline([CAA(steering_vector=_vector())]).supports_batching is True
