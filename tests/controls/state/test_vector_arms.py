"""Fitted vectors for studies: completion-token means, strengths in median-norm units, random and negated arms."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, ActAdd, SteeringVector
from steer_hydra.controls.state.layer_vector import apply_direction

PAIRS = [
    {"prompt": "are you kind", "positive": " yes i am very kind", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false it is not blue"},
]


def _layer_outputs(model, ids):
    seen = []
    handle = model.get_submodule("model.layers.0").register_forward_hook(lambda m, a, o: seen.append(o))
    try:
        with torch.no_grad():
            model(input_ids=torch.tensor([ids]))
    finally:
        handle.remove()
    hidden = seen[0]
    return (hidden if isinstance(hidden, torch.Tensor) else hidden[0])[0]


def test_completion_mean_difference_equals_an_independent_computation(tiny):
    model, tokenizer = tiny
    caa = CAA(data=PAIRS, layer_id=0, prompt_format="chat", accumulate="completion", batch_size=2)
    caa.steer(model, tokenizer=tokenizer)
    sides, norms = {"positive": [], "negative": []}, []
    for pair in PAIRS:
        head = tokenizer.apply_chat_template(
            [{"role": "user", "content": pair["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        n_prompt = len(tokenizer(head, add_special_tokens=False)["input_ids"])
        for side in sides:
            ids = tokenizer(head + pair[side], add_special_tokens=False)["input_ids"]
            answer = _layer_outputs(model, ids)[n_prompt:]  # each row alone: no padding involved
            sides[side].append(answer.mean(dim=0))
            norms.append(answer.norm(dim=-1))
    expected = torch.stack(sides["positive"]).mean(0) - torch.stack(sides["negative"]).mean(0)
    torch.testing.assert_close(caa.vector.tensor, expected, atol=1e-5, rtol=1e-5)
    assert caa.vector.metadata["accumulate"] == "completion"
    assert caa.vector.metadata["median_norm"] == pytest.approx(float(torch.cat(norms).median()), rel=1e-5)


def test_median_norm_strength_adds_multiplier_times_the_residual_scale(tiny):
    model, tokenizer = tiny
    caa = CAA(data=PAIRS, layer_id=0, multiplier=0.5, accumulate="completion", strength_unit="median_norm")
    caa.steer(model, tokenizer=tokenizer)
    (delta,) = caa.added_rows()
    assert caa.unit_scale == pytest.approx(caa.vector.metadata["median_norm"])
    assert float(delta.norm()) == pytest.approx(0.5 * caa.unit_scale, rel=1e-5)
    torch.testing.assert_close(delta / delta.norm(), caa.vector.tensor / caa.vector.tensor.norm())


def test_median_norm_needs_a_fitted_vector():
    given = CAA(steering_vector=torch.ones(64), layer_id=0, strength_unit="median_norm")
    from steer_hydra.models import build_tiny_model

    model, tokenizer = build_tiny_model()
    with pytest.raises(ValueError, match="median_norm"):
        given.steer(model, tokenizer=tokenizer)


def test_negated_and_random_arms_are_built_as_specified(tiny):
    model, tokenizer = tiny
    arms = {
        direction: CAA(data=PAIRS, layer_id=0, accumulate="completion", direction=direction, direction_seed=5)
        for direction in ("vector", "negated", "random")
    }
    for control in arms.values():
        control.steer(model, tokenizer=tokenizer)
    fitted = arms["vector"].vector.tensor
    torch.testing.assert_close(arms["negated"].vector.tensor, -fitted)
    random = arms["random"].vector.tensor
    assert float(random.norm()) == pytest.approx(float(fitted.norm()), rel=1e-5)  # matched norm
    cosine = float(torch.nn.functional.cosine_similarity(random, fitted, dim=0))
    assert abs(cosine) < 0.5  # a different direction (64 dims: |cos| of a random pair is ~0.1)
    expected = torch.randn(64, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(random, expected / expected.norm() * fitted.norm())
    # provenance: each arm says what it did and from which vector
    assert arms["random"].vector.metadata["source_vector"] == arms["vector"].vector_hash
    assert arms["negated"].vector.metadata["direction"] == "negated"
    assert len({a.vector_hash for a in arms.values()}) == 3


def test_random_blocks_match_each_rows_norm():
    block = SteeringVector(torch.tensor([[3.0, 4.0, 0.0], [0.0, 0.0, 2.0]]), layer=1)
    random = apply_direction(block, "random", 0).tensor
    torch.testing.assert_close(random.norm(dim=-1), torch.tensor([5.0, 2.0]))


def test_actadd_takes_the_same_arms(tiny):
    model, tokenizer = tiny
    plain = ActAdd(positive_prompt="love cats", negative_prompt="hate", layer_id=1)
    negated = ActAdd(positive_prompt="love cats", negative_prompt="hate", layer_id=1, direction="negated")
    scaled = ActAdd(positive_prompt="love cats", negative_prompt="hate", layer_id=1, strength_unit="median_norm")
    for control in (plain, negated, scaled):
        control.steer(model, tokenizer=tokenizer)
    torch.testing.assert_close(negated.vector.tensor, -plain.vector.tensor)
    assert scaled.unit_scale == pytest.approx(plain.vector.metadata["median_norm"])
    rows = plain.vector.tensor.norm(dim=-1) > 0  # the shared BOS row is zero and stays zero
    assert bool(rows.any()) and not bool(scaled._steering[~rows].any())
    torch.testing.assert_close(scaled._steering[rows].norm(dim=-1), torch.full((int(rows.sum()),), scaled.unit_scale))


def test_a_negative_direction_seed_is_refused():
    with pytest.raises(ValueError, match="direction_seed"):
        CAA(data=PAIRS, direction_seed=-1)
