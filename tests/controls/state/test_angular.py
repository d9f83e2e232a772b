"""AngularSteering: every steered activation keeps its norm, its component in the plane turns by exactly the angle
(or to it), the rest is kept; the plane from a fit or given vectors; batching, refill, engine edits, Args errors.

Tolerances come from float32 arithmetic: the plane coordinates are dot products of `hidden` terms, each off by at
most `hidden * u * |s|` (u = 2**-24, unit basis vectors), and the edit adds two scaled basis vectors back, so the
steered vector is within a few `hidden * u * |s|` of the exact rotation: relative tolerance `TOL = 8 * hidden * u`.
An angle read from plane coordinates of length r is off by at most about `TOL * |s| / r` radians.
"""

from __future__ import annotations

import math

import pytest
import torch

from steer_hydra.controls.state import CAA, AngularSteering, SteeringVector
from steer_hydra.controls.state.angular import plane_basis
from steer_hydra.core import Capability
from steer_hydra.core.edits import rotate_in_plane
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, decoder_roundings

HIDDEN = 64
U = 2.0**-24
TOL = 8 * HIDDEN * U
PROMPTS = ["the capital of france is", "hello", "count one two three four five"]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
]
SEQUENCE = torch.tensor([[1, 50, 60, 70, 80, 90, 100, 110, 120]])  # a 6-token prompt + 3 "generated" tokens


def _vector(seed=3):
    return torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))


def _steered(tiny, **kwargs):
    model, tokenizer = tiny
    control = AngularSteering(**kwargs)
    control.steer(model, tokenizer=tokenizer)
    return control


def _layer_outputs(model, record_inputs, apply_hooks, hooks=None):
    """Layer 0's output (layer 1's input) over `SEQUENCE`, after `hooks`."""
    with torch.no_grad(), apply_hooks(model, hooks or {}), record_inputs(model.get_submodule("model.layers.1")) as rec:
        model(input_ids=SEQUENCE)
    return rec.inputs[0][0]


def _coordinates(stream, basis):
    p1, p2 = stream @ basis[0], stream @ basis[1]
    rest = stream - p1[:, None] * basis[0] - p2[:, None] * basis[1]
    return p1, p2, rest


@pytest.mark.parametrize("degrees", [30.0, -75.0, 180.0])
def test_each_activation_keeps_its_norm_and_its_plane_component_turns_by_the_angle(
    tiny, record_inputs, apply_hooks, degrees
):
    model, _ = tiny
    control = _steered(tiny, steering_vector=_vector(), reference_vector=_vector(4), angle=degrees, layers=[0])
    plain = _layer_outputs(model, record_inputs, apply_hooks)
    hooks = control.get_hooks(SEQUENCE[:, :6], {}, attention_mask=torch.ones(1, 6, dtype=torch.long))
    steered = _layer_outputs(model, record_inputs, apply_hooks, hooks)
    norms = plain.norm(dim=-1)
    assert ((steered.norm(dim=-1) - norms).abs() <= TOL * norms).all()  # norm preserved, relative
    basis = control.basis.double()
    p1, p2, rest = _coordinates(plain.double(), basis)
    q1, q2, kept = _coordinates(steered.double(), basis)
    radius = torch.sqrt(p1**2 + p2**2)
    turned = torch.atan2(q2, q1) - torch.atan2(p2, p1)
    wrapped = torch.remainder(turned - math.radians(degrees) + math.pi, 2 * math.pi) - math.pi
    assert (wrapped.abs() <= TOL * norms.double() / radius).all(), wrapped  # rotated by the angle, every position
    assert ((torch.sqrt(q1**2 + q2**2) - radius).abs() <= TOL * norms.double()).all()  # the plane length kept
    assert ((kept - rest).norm(dim=-1) <= TOL * norms.double()).all()  # the rest of the activation kept
    assert (steered - plain).norm(dim=-1).min() > 0.1  # and every position really moved (the test can fail)


def test_to_mode_sets_the_plane_component_to_the_angle_from_the_direction(tiny, record_inputs, apply_hooks):
    model, _ = tiny
    control = _steered(
        tiny,
        steering_vector=_vector(),
        reference="random",
        angle=-40.0,
        angle_mode="to",
        layers=[0],
        token_scope="last_k",
        last_k=2,
    )
    plain = _layer_outputs(model, record_inputs, apply_hooks)
    steered = _layer_outputs(model, record_inputs, apply_hooks, control.get_hooks(SEQUENCE[:, :6], {}))
    assert torch.equal(steered[:4], plain[:4])  # token scope: the prompt's last 2 tokens and after
    basis = control.basis.double()
    q1, q2, _ = _coordinates(steered[4:].double(), basis)
    norms = plain[4:].norm(dim=-1).double()
    assert ((torch.atan2(q2, q1) - math.radians(-40.0)).abs() <= TOL * norms / torch.sqrt(q1**2 + q2**2)).all()
    assert ((steered[4:].norm(dim=-1) - plain[4:].norm(dim=-1)).abs() <= TOL * plain[4:].norm(dim=-1)).all()


def test_the_shared_rotation_in_float32_matches_float64_within_the_derived_bound():
    generator = torch.Generator().manual_seed(0)
    stream = torch.randn(200, HIDDEN, generator=generator) * torch.logspace(-2, 3, 200)[:, None]
    basis = plane_basis(torch.randn(HIDDEN, generator=generator), torch.randn(HIDDEN, generator=generator), "t")
    for to_angle in (False, True):
        got = rotate_in_plane(stream, basis[0], basis[1], math.cos(1.1), math.sin(1.1), to_angle=to_angle)
        exact = rotate_in_plane(
            stream.double(), basis[0].double(), basis[1].double(), math.cos(1.1), math.sin(1.1), to_angle=to_angle
        )
        scale = stream.double().norm(dim=-1)
        assert got.dtype == torch.float32
        assert ((got.double() - exact).norm(dim=-1) <= TOL * scale).all()
        # the basis is orthonormal only to float32 rounding (components off by u / 2): so is the exact rotation
        assert ((exact.norm(dim=-1) - scale).abs() <= 8 * U * scale).all()


def test_the_fitted_direction_is_caas_and_the_mean_reference_lies_in_the_plane(tiny):
    model, tokenizer = tiny
    control = _steered(tiny, data=PAIRS, layer_id=0, angle=20.0, prompt_format="text", accumulate="completion")
    caa = CAA(data=PAIRS, layer_id=0, prompt_format="text", accumulate="completion")
    caa.steer(model, tokenizer=tokenizer)
    unit = caa.vector.tensor / caa.vector.tensor.norm()
    # one mean difference summed in another order, then normalized (a norm over HIDDEN terms): unit vectors
    assert_equal_up_to_rounding(control.basis[0], unit, terms=decoder_roundings(model.config, 8) + HIDDEN)
    mean = control.fitted_vector.tensor[1]
    in_plane = (mean @ control.basis[0]) * control.basis[0] + (mean @ control.basis[1]) * control.basis[1]
    assert_equal_up_to_rounding(in_plane, mean, terms=2 * HIDDEN + 2, operands=(mean.norm(),))  # two projections
    assert abs(float(control.basis[0] @ control.basis[1])) < 1e-6
    assert control.rotated_layers == (0,) and control.fitted_vector.metadata["median_norm"] > 0
    engine = AngularSteering(data=PAIRS, layer_id=0, angle=20.0, prompt_format="text", accumulate="completion")
    engine.steer(model, tokenizer=tokenizer, fitted_vector=control.fitted_vector)  # an engine backend's cached fit
    assert torch.equal(engine.basis, control.basis)


def test_outputs_change_with_the_angle_and_a_row_alone_equals_the_same_row_in_a_batch(make_pipeline):
    kwargs = {"max_new_tokens": 8, "do_sample": False}
    plain = make_pipeline([]).generate(text=PROMPTS, **kwargs)
    zero = make_pipeline([AngularSteering(data=PAIRS, angle=0.0, prompt_format="text")])
    assert zero.generate(text=PROMPTS, **kwargs) == plain  # a zero rotation is the identity
    pipeline = make_pipeline([AngularSteering(data=PAIRS, angle=120.0, layers=[0, 1], prompt_format="text")])
    batched = pipeline.generate(text=PROMPTS, **kwargs)
    assert batched != plain
    assert [pipeline.generate(text=p, **kwargs) for p in PROMPTS] == batched


def test_refill_matches_static_batching(make_pipeline):
    control = AngularSteering(steering_vector=_vector(), angle=90.0, token_scope="after_prompt")
    pipeline = make_pipeline([control])
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    reference = pipeline.generate(messages=chats, return_output=True, max_new_tokens=6, min_new_tokens=6)
    engine = pipeline.open_refill(2)
    got, pending = {}, list(range(len(chats)))
    while pending or not engine.idle:
        while pending and engine.room:
            i = pending.pop(0)
            pipeline.admit_refill(
                engine, [lambda out, err, i=i: got.__setitem__(i, out)], messages=[chats[i]], max_new_tokens=6,
                min_new_tokens=6,
            )  # fmt: skip
        engine.step()
    assert [got[i].output_ids[0].tolist() for i in range(3)] == [o.output_ids[0].tolist() for o in reference]


def test_engine_edits_carry_the_basis_and_the_angle_in_radians(tiny):
    control = _steered(tiny, steering_vector=_vector(), angle=45.0, layers=[1, 0], token_scope="last_k", last_k=3)
    edits = control.residual_edits()
    assert [(e.layer, e.site, e.mode, e.scope, e.start(7)) for e in edits] == [
        (1, "output", "rotate", "last_k", 4),
        (0, "output", "rotate", "last_k", 4),
    ]
    assert all(torch.equal(e.rows, control.basis) and e.angle == pytest.approx(math.pi / 4) for e in edits)
    to = _steered(tiny, steering_vector=_vector(), angle=10.0, angle_mode="to")
    assert [e.mode for e in to.residual_edits()] == ["rotate_to"] and to.rotated_layers == (1,)
    assert _steered(tiny, steering_vector=_vector(), angle=360.0).residual_edits() == ()


def test_check_accepts_the_engines_and_refuses_a_fit_on_a_server_naming_the_fix(make_pipeline):
    given = make_pipeline([AngularSteering(steering_vector=_vector(), angle=10.0)], steer=False)
    fitted = make_pipeline([AngularSteering(data=PAIRS, angle=10.0)], steer=False)
    for kind in ("huggingface", "vllm", "vllm_serve"):
        assert given.check(kind).ok, kind
    assert fitted.check("vllm").ok
    (message,) = fitted.check("vllm_serve").messages()
    assert "AngularSteering" in message and "hidden_capture" in message and "Fix:" in message


def test_args_errors_name_the_field_and_the_fix(tiny):
    with pytest.raises(ValueError, match="needs exactly one of steering_vector= .* got both"):
        AngularSteering(steering_vector=_vector(), data=PAIRS)
    with pytest.raises(ValueError, match="reference='mean' .* Fix: reference='random'"):
        AngularSteering(steering_vector=_vector(), reference="mean")
    with pytest.raises(ValueError, match="takes reference_vector= or reference='random', not both"):
        AngularSteering(steering_vector=_vector(), reference_vector=_vector(1), reference="random")
    with pytest.raises(ValueError, match="layer_id=1 is the layer a direction is fitted at"):
        AngularSteering(steering_vector=_vector(), layer_id=1)
    with pytest.raises(ValueError, match="angle must be finite"):
        AngularSteering(steering_vector=_vector(), angle=float("inf"))
    with pytest.raises(TypeError, match="AngularSteering.angle_mode must be one of"):
        AngularSteering(steering_vector=_vector(), angle_mode="towards")
    with pytest.raises(ValueError, match="nearly\\) parallel .* Fix"):
        _steered(tiny, steering_vector=_vector(), reference_vector=2 * _vector())
    with pytest.raises(ValueError, match="layer 3 is out of range"):
        _steered(tiny, steering_vector=_vector(), layers=[3])
    with pytest.raises(ValueError, match="width 32 but the model's hidden size is 64"):
        _steered(tiny, steering_vector=torch.ones(32))
    with pytest.raises(RuntimeError, match=r"residual_edits called before steer\(\)"):
        AngularSteering(steering_vector=_vector()).residual_edits()


def test_declarations():
    assert AngularSteering(data=PAIRS).requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert AngularSteering(steering_vector=SteeringVector(_vector())).requirements() == {Capability.IN_PROCESS_TORCH}
    assert AngularSteering.supports_batching and AngularSteering.supports_refill and AngularSteering.adds_residual
