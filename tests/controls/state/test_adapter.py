"""ActivationAdapter: CAA, directional ablation, CAST, angular steering and ITI's head-slice addition expressed through
the general form decode exactly as the dedicated controls (token for token, greedy, the tiny model); its Args."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, CAST, ITI, ActivationAdapter, AngularSteering, DirectionalAblation
from steer_hydra.core import Capability

PROMPTS = ["the capital of france is", "hello", "count one two three four five", "tell me a story about a cat"]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
]
KWARGS = {"max_new_tokens": 8, "do_sample": False}


def _vector(seed=3, width=64):
    return torch.randn(width, generator=torch.Generator().manual_seed(seed))


def _same(make_pipeline, dedicated, adapter, *, alone=False):
    """Both decode every prompt to the same tokens (batched, and with `alone` one by one too); the steering really
    acts (the unsteered pipeline decodes otherwise)."""
    ours, theirs = make_pipeline([adapter]), make_pipeline([dedicated])
    got, want = ours.generate(text=PROMPTS, **KWARGS), theirs.generate(text=PROMPTS, **KWARGS)
    assert got == want
    if alone:
        assert [ours.generate(text=p, **KWARGS) for p in PROMPTS] == want
    assert make_pipeline([]).generate(text=PROMPTS, **KWARGS) != want
    return ours.controls[0], theirs.controls[0]


@pytest.mark.parametrize(
    "caa_args",
    [
        {"steering_vector": _vector(), "layer_id": 1, "multiplier": 4.0},
        {"steering_vector": _vector(), "layer_id": 0, "multiplier": -3.0, "token_scope": "all"},
        {"steering_vector": _vector() * 5, "layer_id": 1, "multiplier": 12.0, "normalize_vector": True,
         "token_scope": "last_k", "last_k": 2},
        {"data": PAIRS, "layer_id": 0, "multiplier": 1.5, "strength_unit": "median_norm", "prompt_format": "text",
         "accumulate": "completion"},
        {"data": PAIRS, "multiplier": 3.0, "direction": "random", "direction_seed": 4, "prompt_format": "text"},
    ],
    ids=["given", "all-positions", "normalized-last-k", "fitted-median-norm", "random-direction"],
)  # fmt: skip
def test_caa_through_the_adapter_decodes_exactly_as_caa(make_pipeline, caa_args):
    args = dict(caa_args)
    adapter_args = {"transform": "add", "vector": args.pop("steering_vector", None), **args}
    if adapter_args["vector"] is not None:  # a given vector: CAA's layer_id is the adapter's scope
        adapter_args["layers"] = [adapter_args.pop("layer_id")]
    else:
        adapter_args.pop("vector")
    alone = "data" in caa_args and "direction" not in caa_args  # one case also row by row
    ours, theirs = _same(make_pipeline, CAA(**caa_args), ActivationAdapter(**adapter_args), alone=alone)
    (mine,), (caas,) = ours.residual_edits(), theirs.residual_edits()
    assert torch.equal(mine.rows, caas.rows) and (mine.layer, mine.site, mine.scope) == (
        caas.layer,
        "output",
        caas.scope,
    )


@pytest.mark.parametrize(
    "ablation_args",
    [
        {"direction_vector": _vector(5)},
        {"direction_vector": _vector(5), "layers": [1], "token_scope": "last_k", "last_k": 3},
        {"data": PAIRS, "layer_id": 0, "token_scope": "after_prompt", "prompt_format": "text"},
    ],
    ids=["every-layer", "one-layer-last-k", "fitted-after-prompt"],
)
def test_directional_ablation_through_the_adapter_decodes_exactly_as_the_ablation(make_pipeline, ablation_args):
    args = dict(ablation_args)
    vector = args.pop("direction_vector", None)
    given = {"vector": vector} if vector is not None else {}
    sites = ["input", "attention", "output"]
    adapter = ActivationAdapter(transform="project", **given, sites=sites, **{"token_scope": "all", **args})
    ours, theirs = _same(make_pipeline, DirectionalAblation(**ablation_args), adapter)
    assert [(e.layer, e.site, e.mode) for e in ours.residual_edits()] == [
        (e.layer, e.site, e.mode) for e in theirs.residual_edits()
    ]
    assert all(torch.equal(a.rows, b.rows) for a, b in zip(ours.residual_edits(), theirs.residual_edits(), strict=True))


def test_cast_through_the_adapter_decodes_exactly_as_cast(make_pipeline):
    condition_pairs = [
        {"positive": "tell me about the cat and the dog", "negative": "what is two plus three"},
        {"positive": "a story about a bird in a tree", "negative": "count from one to ten"},
    ]
    shared = {"multiplier": 6.0, "condition_data": condition_pairs, "condition_layer": 0, "prompt_format": "text"}
    cast = CAST(steering_vector=_vector(), layer_id=1, **shared)
    adapter = ActivationAdapter(transform="add", vector=_vector(), layers=[1], **shared)
    ours, theirs = _same(make_pipeline, cast, adapter, alone=True)
    assert ours.condition.gate == theirs.condition.gate
    assert [e.mode for e in ours.residual_edits()] == ["condition", "from"]


def test_angular_steering_through_the_adapter_decodes_exactly_as_angular_steering(make_pipeline):
    for angle_mode in ("by", "to"):
        dedicated = AngularSteering(steering_vector=_vector(), reference_vector=_vector(8), angle=100.0,
                                    angle_mode=angle_mode, layers=[0, 1])  # fmt: skip
        adapter = ActivationAdapter(transform="rotate", vector=_vector(), reference_vector=_vector(8), angle=100.0,
                                    angle_mode=angle_mode, layers=[0, 1], token_scope="all")  # fmt: skip
        _same(make_pipeline, dedicated, adapter)


def test_a_head_slice_addition_through_the_adapter_decodes_exactly_as_iti(make_pipeline, tiny):
    directions = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(1))
    iti = ITI(directions=directions, heads=[[1, 0], [1, 2]], alpha=6.0, strength_unit="absolute")
    model, tokenizer = tiny
    iti.steer(model, tokenizer=tokenizer)
    (edit,) = iti.residual_edits()
    adapter = ActivationAdapter(transform="add", vector=edit.rows[0], layers=[1], sites=["heads"], token_scope="last_k",
                                last_k=1)  # fmt: skip
    fresh = ITI(directions=directions, heads=[[1, 0], [1, 2]], alpha=6.0, strength_unit="absolute")
    _same(make_pipeline, fresh, adapter)


def test_refill_declarations_and_check(make_pipeline):
    ungated = ActivationAdapter(vector=_vector(), layers=[1])
    gated = ActivationAdapter(vector=_vector(), layers=[1], condition_vector=_vector(2), threshold=0.1)
    assert ungated.supports_refill and not gated.supports_refill
    assert make_pipeline([ungated]).refill_blockers() == []
    assert "ActivationAdapter does not declare supports_refill" in make_pipeline([gated]).refill_blockers()
    fitted = ActivationAdapter(data=PAIRS)
    assert fitted.requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert ungated.requirements() == {Capability.IN_PROCESS_TORCH} and ActivationAdapter.adds_residual
    for kind in ("huggingface", "vllm", "vllm_serve"):
        assert make_pipeline([gated], steer=False).check(kind).ok, kind
    (message,) = make_pipeline([fitted], steer=False).check("vllm_serve").messages()
    assert "hidden_capture" in message and "Fix:" in message


def test_an_engine_fit_reproduces_the_edits(tiny):
    model, tokenizer = tiny
    condition_pairs = [{"positive": "a cat", "negative": "two plus three"}, {"positive": "a bird", "negative": "ten"}]
    control = ActivationAdapter(data=PAIRS, multiplier=2.0, condition_data=condition_pairs, prompt_format="text")
    control.steer(model, tokenizer=tokenizer)
    engine = ActivationAdapter(data=PAIRS, multiplier=2.0, condition_data=condition_pairs, prompt_format="text")
    engine.steer(model, tokenizer=tokenizer, fitted_vector=control.fitted_vector)
    assert [(e.mode, e.gate, e.rows.tolist()) for e in engine.residual_edits()] == [
        (e.mode, e.gate, e.rows.tolist()) for e in control.residual_edits()
    ]


def test_args_errors_name_the_field_and_the_fix(tiny):
    with pytest.raises(ValueError, match="needs exactly one of vector= .* got both"):
        ActivationAdapter(vector=_vector(), data=PAIRS)
    with pytest.raises(ValueError, match="transform='project' does not read them. Fix: drop them"):
        ActivationAdapter(transform="project", vector=_vector(), multiplier=2.0)
    with pytest.raises(ValueError, match="angle and reference_vector belong to transform='rotate'"):
        ActivationAdapter(vector=_vector(), angle=30.0)
    with pytest.raises(ValueError, match="sites must list distinct sites among"):
        ActivationAdapter(vector=_vector(), sites=["output", "output"])
    with pytest.raises(ValueError, match="a gated transform acts after the prompt.*Fix: token_scope='after_prompt'"):
        ActivationAdapter(vector=_vector(), condition_vector=_vector(), threshold=0.1, token_scope="all")
    with pytest.raises(ValueError, match="describe a gate; no condition_vector= .* Fix"):
        ActivationAdapter(vector=_vector(), threshold=0.1)
    with pytest.raises(ValueError, match="threshold is fitted from condition_data="):
        ActivationAdapter(vector=_vector(), condition_vector=_vector())
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="site 'heads' is 64 wide .* Fix"):
        ActivationAdapter(vector=_vector(width=32), sites=["heads"], layers=[0]).steer(model, tokenizer=tokenizer)
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        ActivationAdapter(vector=_vector(), layers=[2]).steer(model, tokenizer=tokenizer)
    with pytest.raises(RuntimeError, match=r"residual_edits called before steer\(\)"):
        ActivationAdapter(vector=_vector()).residual_edits()
