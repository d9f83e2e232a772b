"""CAST: a gated-off row decodes exactly as unsteered, a gated-on row exactly as under CAA with the same vector, and
a batch mixing them gives each row what it gets alone; the condition fit and its threshold; engine edits; Args."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, CAST
from steer_hydra.controls.state.cast import Condition, fit_condition
from steer_hydra.controls.state.probing import prompt_means
from steer_hydra.core import Capability
from steer_hydra.core.edits import condition_similarity
from steer_hydra.core.layout import resolve_layout
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, decoder_roundings

PROMPTS = [
    "the capital of france is",
    "hello",
    "count one two three four five",
    "tell me a story about a cat",
    "what is the sky",
    "write a short poem",
]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
]
CONDITION_PAIRS = [
    {"positive": "tell me about the cat and the dog", "negative": "what is two plus three"},
    {"positive": "a story about a bird in a tree", "negative": "count from one to ten"},
    {"positive": "the fish swims in the sea", "negative": "the sum of four and five"},
]
KWARGS = {"max_new_tokens": 8, "do_sample": False}


def _vector(seed=3):
    return torch.randn(64, generator=torch.Generator().manual_seed(seed))


def _midpoint(similarity):
    """A threshold halfway between the two middle similarities: half the prompts on each side."""
    ordered = similarity.sort().values
    half = len(ordered) // 2
    return float((ordered[half - 1] + ordered[half]) / 2)


def _similarities(tiny, unit, layer=0):
    """Each prompt's similarity as the gate computes it: the layer's output averaged over the prompt alone."""
    model, tokenizer = tiny
    means = prompt_means(model, tokenizer, f"model.layers.{layer}", PROMPTS, prompt_format="text", batch_size=1)
    return condition_similarity(means, unit / unit.norm())


def test_gated_rows_decode_as_caa_closed_rows_as_unsteered_and_each_row_as_alone(tiny, make_pipeline):
    condition, behaviour = _vector(7), _vector(3)
    similarity = _similarities(tiny, condition)
    threshold = _midpoint(similarity)
    opened = (similarity > threshold).tolist()
    assert 0 < sum(opened) < len(PROMPTS)  # both kinds of rows
    margin = float((similarity - threshold).abs().min())
    assert margin > 1e-4  # no prompt sits on the threshold: the batch's float rounding cannot flip a gate
    cast = make_pipeline(
        [
            CAST(
                steering_vector=behaviour,
                layer_id=1,
                multiplier=6.0,
                condition_vector=condition,
                condition_layer=0,
                threshold=threshold,
            )
        ]  # fmt: skip
    )
    caa = make_pipeline([CAA(steering_vector=behaviour, layer_id=1, multiplier=6.0)])
    plain = make_pipeline([])
    steered = cast.generate(text=PROMPTS, **KWARGS)
    under_caa, unsteered = caa.generate(text=PROMPTS, **KWARGS), plain.generate(text=PROMPTS, **KWARGS)
    for i, is_open in enumerate(opened):
        assert steered[i] == (under_caa[i] if is_open else unsteered[i]), (i, is_open)
    assert all(under_caa[i] != unsteered[i] for i in range(len(PROMPTS)))  # so both equalities can fail
    assert [cast.generate(text=p, **KWARGS) for p in PROMPTS] == steered  # each row alone = the same row in the batch
    flipped = make_pipeline(
        [
            CAST(
                steering_vector=behaviour,
                layer_id=1,
                multiplier=6.0,
                condition_vector=condition,
                condition_layer=0,
                threshold=threshold,
                comparison="<",
            )
        ]  # fmt: skip
    )
    other = flipped.generate(text=PROMPTS, **KWARGS)
    assert all(other[i] == (unsteered[i] if is_open else under_caa[i]) for i, is_open in enumerate(opened))


def test_candidates_of_one_prompt_share_its_gate(make_pipeline, tiny):
    condition, behaviour = _vector(7), _vector(3)
    similarity = _similarities(tiny, condition)
    threshold = _midpoint(similarity)
    cast = make_pipeline(
        [
            CAST(
                steering_vector=behaviour,
                layer_id=1,
                multiplier=6.0,
                condition_vector=condition,
                condition_layer=0,
                threshold=threshold,
            )
        ]  # fmt: skip
    )
    caa = make_pipeline([CAA(steering_vector=behaviour, layer_id=1, multiplier=6.0)])
    sampled = {"max_new_tokens": 6, "do_sample": True, "temperature": 1.0, "seed": 11, "n": 2}
    opened = int(torch.argmax(similarity))
    got = cast.generate(text=[PROMPTS[opened]], return_output=True, **sampled)
    want = caa.generate(text=[PROMPTS[opened]], return_output=True, **sampled)
    assert [o.output_ids.tolist() for o in got] == [o.output_ids.tolist() for o in want]


def test_the_condition_is_fitted_from_prompt_pairs_with_a_threshold_that_separates_them(tiny):
    model, tokenizer = tiny
    layout = resolve_layout(model)
    vector, threshold, comparison, accuracy = fit_condition(
        model, tokenizer, layout, 0, CONDITION_PAIRS, threshold=None, comparison=None, open_for="positive",
        prompt_format="text", batch_size=2,
    )  # fmt: skip
    positive = prompt_means(
        model, tokenizer, "model.layers.0", [p["positive"] for p in CONDITION_PAIRS], prompt_format="text", batch_size=1
    )
    negative = prompt_means(
        model, tokenizer, "model.layers.0", [p["negative"] for p in CONDITION_PAIRS], prompt_format="text", batch_size=1
    )
    # the same prompt means read in batches of 2 instead of 1: the decoder's sums in another order
    terms = decoder_roundings(model.config, 12) + 6
    assert_equal_up_to_rounding(vector, positive.mean(0) - negative.mean(0), terms=terms, operands=(positive, negative))
    unit = vector / vector.norm()
    on, off = condition_similarity(positive, unit), condition_similarity(negative, unit)
    opens = (lambda s: s > threshold) if comparison == ">" else (lambda s: s < threshold)  # noqa: E731
    assert accuracy == float((torch.cat([opens(on), ~opens(off)])).float().mean())
    assert accuracy >= 5 / 6  # 6 prompts, a direction fitted on them: at most one on the wrong side
    again = fit_condition(
        model, tokenizer, layout, 0, CONDITION_PAIRS, threshold=None, comparison=None, open_for="negative",
        prompt_format="text", batch_size=2,
    )  # fmt: skip
    flips = (lambda s: s > again[1]) if again[2] == ">" else (lambda s: s < again[1])  # noqa: E731
    assert float(torch.cat([flips(off), ~flips(on)]).float().mean()) == again[3] >= 5 / 6  # opens for negatives


def test_engine_edits_are_the_condition_and_caas_addition_gated_by_it(tiny):
    model, tokenizer = tiny
    control = CAST(data=PAIRS, layer_id=1, multiplier=2.0, condition_data=CONDITION_PAIRS, condition_layer=0,
                   prompt_format="text")  # fmt: skip
    control.steer(model, tokenizer=tokenizer)
    caa = CAA(data=PAIRS, layer_id=1, multiplier=2.0, prompt_format="text")
    caa.steer(model, tokenizer=tokenizer)
    condition, gated = control.residual_edits()
    rule = control.condition
    assert (condition.layer, condition.site, condition.mode, condition.gate) == (0, "output", "condition", rule.gate)
    assert (condition.threshold, condition.comparison) == (rule.threshold, rule.comparison)
    assert torch.equal(condition.rows[0], rule.unit)
    (expected,) = caa.residual_edits()
    assert gated.gate == rule.gate and gated.scope == "after_prompt" and torch.equal(gated.rows, expected.rows)
    assert (gated.layer, gated.site, gated.mode) == (expected.layer, expected.site, expected.mode)
    engine = CAST(data=PAIRS, layer_id=1, multiplier=2.0, condition_data=CONDITION_PAIRS, condition_layer=0,
                  prompt_format="text")  # fmt: skip
    engine.steer(model, tokenizer=tokenizer, fitted_vector=control.fitted_vector)  # an engine backend's cached fit
    assert [(e.gate, e.rows.tolist()) for e in engine.residual_edits()] == [
        (e.gate, e.rows.tolist()) for e in control.residual_edits()
    ]
    assert Condition(rule.unit * 1.0, 0, rule.threshold + 0.1, rule.comparison).gate != rule.gate


def test_check_refill_and_declarations(make_pipeline):
    given = CAST(steering_vector=_vector(), condition_vector=_vector(1), threshold=0.2)
    fitted = CAST(data=PAIRS, condition_data=CONDITION_PAIRS)
    for kind in ("huggingface", "vllm", "vllm_serve"):
        assert make_pipeline([given], steer=False).check(kind).ok, kind
    assert make_pipeline([fitted], steer=False).check("vllm").ok
    (message,) = make_pipeline([fitted], steer=False).check("vllm_serve").messages()
    assert "CAST" in message and "hidden_capture" in message and "Fix:" in message
    assert "CAST does not declare supports_refill" in make_pipeline([given]).refill_blockers()
    assert fitted.requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert given.requirements() == {Capability.IN_PROCESS_TORCH}
    assert CAST.supports_batching and not CAST.supports_refill and CAST.adds_residual


def test_args_errors_name_the_field_and_the_fix(tiny):
    with pytest.raises(ValueError, match="CAST needs exactly one of steering_vector= .* got neither"):
        CAST(condition_vector=_vector(), threshold=0.1)
    with pytest.raises(ValueError, match="exactly one of condition_vector= .* got both"):
        CAST(steering_vector=_vector(), condition_vector=_vector(), condition_data=CONDITION_PAIRS)
    with pytest.raises(ValueError, match="CAST.threshold is fitted from condition_data=.* Fix: threshold="):
        CAST(steering_vector=_vector(), condition_vector=_vector())
    with pytest.raises(ValueError, match=r"CAST.condition_data\[0\] needs a non-empty string 'negative'"):
        CAST(steering_vector=_vector(), condition_data=[{"positive": "a"}])
    with pytest.raises(TypeError, match="CAST.comparison must be"):
        CAST(steering_vector=_vector(), condition_vector=_vector(), threshold=0.1, comparison=">=")
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="condition_layer=5 is out of range.*Fix"):
        CAST(steering_vector=_vector(), condition_vector=_vector(), threshold=0.1, condition_layer=5).steer(
            model, tokenizer=tokenizer
        )
    with pytest.raises(ValueError, match="zero norm"):
        CAST(steering_vector=_vector(), condition_vector=torch.zeros(64), threshold=0.1).steer(
            model, tokenizer=tokenizer
        )
    with pytest.raises(RuntimeError, match=r"residual_edits called before steer\(\)"):
        CAST(steering_vector=_vector(), condition_vector=_vector(), threshold=0.1).residual_edits()
