"""The worker plugin's newer edit kinds, without vLLM: head-slice additions at the attention output projection's input
(ITI), rotations in a plane (angular steering) and per-request gates read from the prompt (CAST), on a stand-in model
with vLLM's decoder-layer contract and a stand-in model runner (as tests/backends/test_vllm_steering.py), plus the
client side: the wire form of the new fields, nonces and lowering of the new controls.
"""

from __future__ import annotations

import copy
import json
import math
import types

import numpy as np
import pytest
import torch
from test_vllm_offline import fake_vllm  # noqa: E402,F401 - the stand-in vLLM module (a fixture)
from vllm_toy import HIDDEN, ToyModel
from vllm_toy import runner as _runner
from vllm_toy import xargs as _xargs

from steer_hydra.backends.vllm.plugin import build_plan, install, parse, rotate_rows
from steer_hydra.backends.vllm.steering import XARGS_KEY, XARGS_NONCE, bind, lower, meta_skeleton, steering_fields
from steer_hydra.controls.state import CAST, ITI, ActivationAdapter, AngularSteering
from steer_hydra.core import BackendSpec, SteeringPipeline
from steer_hydra.core.controls import ResidualAddition
from steer_hydra.core.edits import condition_similarity, rotate_in_plane
from steer_hydra.models import TINY_REF, resolve_model_reference
from steer_hydra.testing.numerics import assert_equal_up_to_rounding

HEADS = 2
DIM = HIDDEN // HEADS
# The roundings that accumulate into one output element of ToyModel: per layer three linears (a dot product of
# HIDDEN terms plus the bias each), two tanh, the position mix and two residual sums; the edits add a few.
TOY_ROUNDINGS = 3 * (3 * (HIDDEN + 1) + 5) + 4


def _linear(seed: int, width: int = HIDDEN) -> torch.nn.Linear:
    linear = torch.nn.Linear(width, width)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(width, width, generator=torch.Generator().manual_seed(seed)) / 2)
        linear.bias.zero_()
    return linear


class ToyAttention(torch.nn.Module):
    """vLLM's attention shape: the heads' outputs side by side go through `o_proj`."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.mix = _linear(seed)
        self.o_proj = _linear(seed + 100)

    def forward(self, hidden_states):
        return self.o_proj(torch.tanh(self.mix(hidden_states)))


def _step(model, batch, steering):
    """One engine step: `batch` = [(req_id, token ids, first position)]; returns (output, hooks, token bounds)."""
    requests = [(rid, len(ids), steering.get(rid)) for rid, ids, _ in batch]
    hooks = install(_runner(model, requests))
    ids = torch.cat([torch.tensor(t) for _, t, _ in batch])
    positions = torch.cat([torch.arange(p, p + len(t)) for _, t, p in batch])
    with torch.inference_mode():
        out = model(input_ids=ids, positions=positions)
    return out, hooks, np.cumsum([0] + [len(t) for _, t, _ in batch])


@pytest.fixture
def toy():
    torch.manual_seed(0)
    return ToyModel(ToyAttention, _linear)


def _unit(seed, width=HIDDEN):
    vector = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    return vector / vector.norm()


# ---------------------------------------------------------------------- heads: ITI's head-slice addition
def test_a_head_slice_addition_moves_only_that_heads_slice_of_its_own_requests(toy):
    row = torch.zeros(1, HIDDEN)
    row[0, DIM:] = torch.randn(DIM, generator=torch.Generator().manual_seed(1))  # head 1 only
    edit = ResidualAddition(1, "heads", "from", row, "last_k", last_k=1)
    before, after = [], []
    o_proj = toy.layers[1].self_attn.o_proj
    o_proj.register_forward_pre_hook(lambda m, a: before.append(a[0].clone()))  # before the plugin's hook
    install(_runner(toy, []))
    o_proj.register_forward_pre_hook(lambda m, a: after.append(a[0].clone()))  # after it
    plain = copy.deepcopy(toy)
    batch = [("a", [3, 4, 5, 6], 0), ("b", [7, 8, 9], 0)]
    steering = {"a": _xargs([edit], 4)}
    out, _, _ = _step(toy, batch, steering)
    x, y = before[-1], after[-1]
    assert torch.equal(y[:3], x[:3]) and torch.equal(y[4:], x[4:])  # a's earlier positions and b: untouched
    assert torch.equal(y[3, :DIM], x[3, :DIM])  # head 0 of a's last prompt token: untouched, bit for bit
    assert torch.equal(y[3, DIM:], x[3, DIM:] + row[0, DIM:])  # head 1: exactly its shift
    alone, _, _ = _step(plain, batch[:1], steering)
    assert_equal_up_to_rounding(out[:4], alone, terms=TOY_ROUNDINGS)  # another batch shape sums in another order
    unsteered, _, _ = _step(copy.deepcopy(plain), batch[1:], {})
    assert torch.equal(out[4:], unsteered)


def test_a_head_edit_wider_than_the_projections_input_is_refused_naming_tensor_parallel(toy):
    edit = ResidualAddition(0, "heads", "from", torch.ones(1, 2 * HIDDEN), "all")
    with pytest.raises(RuntimeError, match="tensor_parallel_size=1"):
        _step(toy, [("a", [1, 2], 0)], {"a": _xargs([edit], 2)})


def test_a_model_without_an_output_projection_refuses_head_edits(toy):
    for layer in toy.layers:
        layer.self_attn.out = layer.self_attn.o_proj
        del layer.self_attn.o_proj
        layer.self_attn.forward = types.MethodType(lambda self, h: self.out(torch.tanh(self.mix(h))), layer.self_attn)
    edit = ResidualAddition(0, "heads", "from", torch.ones(1, HIDDEN), "all")
    with pytest.raises(RuntimeError, match="no attention output projection .* Fix: run this control on backend=hugg"):
        _step(toy, [("a", [1, 2], 0)], {"a": _xargs([edit], 2)})


# ---------------------------------------------------------------------- rotate: angular steering
def _basis(seed=2):
    first, second = _unit(seed), torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed + 1))
    second = second - (second @ first) * first
    return torch.stack([first, second / second.norm()])


@pytest.mark.parametrize("mode", ["rotate", "rotate_to"])
def test_a_rotation_keeps_each_streams_norm_and_turns_its_plane_component(toy, mode):
    basis = _basis()
    edit = ResidualAddition(1, "output", mode, basis, "all", angle=0.7)
    plain_model = copy.deepcopy(toy)
    streams = {}
    for name, model in (("steered", toy), ("plain", plain_model)):
        install(_runner(model, []))  # the plugin's hooks first: the recorder below sees what they leave
        model.layers[2].register_forward_pre_hook(lambda m, a, name=name: streams.__setitem__(name, a[1] + a[2]))
    batch = [("a", [3, 4, 5], 0), ("b", [7, 8], 0)]
    _step(toy, batch, {"a": _xargs([edit], 3)})
    _step(plain_model, batch, {})
    steered, plain = streams["steered"], streams["plain"]  # the stream after layer 1
    tol = 8 * HIDDEN * 2.0**-24  # float32 dot products over HIDDEN terms (see tests/controls/state/test_angular.py)
    norms = plain.norm(dim=-1)
    assert ((steered.norm(dim=-1) - norms).abs() <= tol * norms).all()
    p, q = plain[:3] @ basis.T, steered[:3] @ basis.T
    turned = torch.atan2(q[:, 1], q[:, 0]) - (0 if mode == "rotate_to" else torch.atan2(p[:, 1], p[:, 0]))
    wrapped = torch.remainder(turned - 0.7 + math.pi, 2 * math.pi) - math.pi
    assert (wrapped.abs() <= tol * norms[:3] / p.norm(dim=-1)).all()
    assert (q - p).norm(dim=-1).min() > 1e-3  # every position of a really turned
    assert torch.equal(steered[3:], plain[3:])  # request b: untouched
    expected = rotate_in_plane(
        plain[:3], basis[0], basis[1], math.cos(0.7), math.sin(0.7), to_angle=mode == "rotate_to"
    )
    torch.testing.assert_close(steered[:3], expected, atol=tol * float(norms.max()), rtol=0)


def test_rotate_rows_unpacks_the_basis_and_the_angle_of_each_token():
    generator = torch.Generator().manual_seed(5)
    hidden, residual = torch.randn(4, HIDDEN, generator=generator), torch.randn(4, HIDDEN, generator=generator)
    first, second = _basis(3), _basis(7)
    wires = [[{"layer": 0, "site": "output", "mode": "rotate", "rows": b.tolist(), "angle": a}] for b, a in
             ((first, 0.3), (second, -1.2))]  # fmt: skip
    packed = torch.stack([parse(json.dumps(w))[0].packed()[0] for w in wires])
    index = torch.tensor([1, 3])
    with torch.inference_mode():
        edited = rotate_rows(hidden, residual, index, packed, to_angle=False)
    stream = hidden + residual
    for token, (basis, angle) in zip((1, 3), ((first, 0.3), (second, -1.2)), strict=True):
        expected = rotate_in_plane(stream[token], basis[0], basis[1], math.cos(angle), math.sin(angle), to_angle=False)
        # two formulas of one rotation: two dot products over HIDDEN terms and the sums around them
        assert_equal_up_to_rounding((edited + residual)[token], expected, terms=2 * HIDDEN + 6, operands=(stream,))
    assert torch.equal(edited[[0, 2]], hidden[[0, 2]])


# ---------------------------------------------------------------------- condition: CAST's per-request gates
def _layer_stream(model, tokens, layer):
    """The stream after decoder layer `layer` of `tokens` prefilled alone, with no steering."""
    clean = copy.deepcopy(model)
    seen = []
    clean.layers[layer].register_forward_hook(lambda m, a, o: seen.append(o[0] + o[1]))
    with torch.inference_mode():
        clean(input_ids=torch.tensor(tokens), positions=torch.arange(len(tokens)))
    return seen[0]


def _gated(unit, threshold, comparison=">", gate="g"):
    condition = ResidualAddition(0, "output", "condition", unit[None], "after_prompt", gate=gate, threshold=threshold,
                                 comparison=comparison)  # fmt: skip
    behaviour = ResidualAddition(2, "output", "from", torch.full((1, HIDDEN), 0.75), "after_prompt", gate=gate)
    return condition, behaviour


def test_each_requests_gate_comes_from_its_own_prompt_read_in_chunks_and_gates_only_its_own_edits(toy):
    unit = _unit(11)
    prompts = {"a": [3, 4, 5, 6, 7], "b": [9, 10, 11, 12], "c": [13, 14, 15]}
    similarity = {r: float(condition_similarity(_layer_stream(toy, t, 0).mean(0), unit)) for r, t in prompts.items()}
    assert len({round(s, 3) for s in similarity.values()}) == 3  # distinct similarities: thresholds can split them
    middle = sorted(similarity.values())[1]
    threshold = middle + 1e-4  # just above b's... whichever is the middle one: the two lower ones stay closed
    opened = {r: s > threshold for r, s in similarity.items()}
    assert sum(opened.values()) == 1
    additions = dict.fromkeys(prompts, list(_gated(unit, threshold)))
    steering = {r: _xargs(a, len(prompts[r])) for r, a in additions.items()}
    assert len({x[XARGS_NONCE] for x in steering.values()}) == 3  # a nonce per request
    ungated = ResidualAddition(2, "output", "from", torch.full((1, HIDDEN), 0.75), "after_prompt")
    plain_model, open_model = copy.deepcopy(toy), copy.deepcopy(toy)
    steps = [
        [("a", prompts["a"][:2], 0), ("b", prompts["b"], 0)],  # a's prompt in two chunks
        [("a", prompts["a"][2:], 2), ("b", [20], 4), ("c", prompts["c"], 0)],
        [("a", [21], 5), ("b", [22], 5), ("c", [23], 3)],
        [("a", [24], 6), ("b", [25], 6), ("c", [26], 4)],
    ]
    for number, batch in enumerate(steps):
        out, hooks, bounds = _step(toy, batch, steering)
        plain_batch, _, _ = _step(plain_model, batch, {})
        for i, (rid, ids, first) in enumerate(batch):
            got, plain = out[bounds[i] : bounds[i + 1]], plain_batch[bounds[i] : bounds[i + 1]]
            if first >= len(prompts[rid]) and opened[rid]:  # a decode position, gate open: the ungated addition
                rows = {rid: _xargs([ungated], len(prompts[rid]))}
                expected, _, _ = _step(open_model, [(rid, ids, first)], rows)
                assert_equal_up_to_rounding(got, expected, terms=TOY_ROUNDINGS, msg=f"{rid} at step {number}")
                assert not torch.allclose(got, plain)
            else:  # gate closed, or the prompt itself (never steered): exactly unsteered, bit for bit
                assert torch.equal(got, plain), f"{rid} at step {number}"
        decided = {name[0]: value for name, value in hooks.decided.items()}
        if number == 1:  # a's second chunk and c's whole prompt completed their reading in this step
            assert {r: decided[steering[r][XARGS_NONCE]] for r in prompts} == opened
    assert not hooks.pending


def test_candidates_sharing_a_nonce_share_the_decision_and_an_undecided_gate_refuses(toy):
    unit = _unit(12)
    prompt = [3, 4, 5, 6]
    similarity = float(condition_similarity(_layer_stream(toy, prompt, 0).mean(0), unit))
    xargs = _xargs(list(_gated(unit, similarity - 1e-3)), len(prompt))  # opens
    steering = {"a": xargs, "a2": xargs}  # two candidates of one prompt (vLLM's n): the same extra_args
    _step(toy, [("a", prompt, 0)], steering)
    # the second candidate found the prompt's blocks cached: only its last position is computed
    _step(toy, [("a", [30], 4), ("a2", prompt[3:], 3)], steering)
    out, hooks, _ = _step(toy, [("a", [31], 5), ("a2", [30], 4)], steering)
    assert len(hooks.plan) == 1 and hooks.plan[0].index.tolist() == [0, 1]  # both get the gated edit
    other = _xargs(list(_gated(unit, similarity - 1e-3)), len(prompt))  # another request: its own nonce
    _step(toy, [("x", prompt[3:], 3)], {"x": other})  # its prompt's first positions never computed here
    with pytest.raises(RuntimeError, match="gate 'g' .* undecided .* Fix"):
        _step(toy, [("x", [30], 4)], {"x": other})


def test_a_closed_gate_at_the_boundary_and_the_less_than_comparison(toy):
    unit = _unit(13)
    prompt = [5, 6, 7]
    similarity = float(condition_similarity(_layer_stream(toy, prompt, 0).mean(0), unit))
    for threshold, comparison, expected in (
        (similarity + 1e-3, ">", False),
        (similarity - 1e-3, ">", True),
        (similarity + 1e-3, "<", True),
        (similarity - 1e-3, "<", False),
    ):
        model = copy.deepcopy(toy)
        xargs = _xargs(list(_gated(unit, threshold, comparison)), len(prompt))
        _, hooks, _ = _step(model, [("r", prompt, 0)], {"r": xargs})
        assert hooks.decided[(xargs[XARGS_NONCE], "g")] is expected, (threshold, comparison)
        _, hooks, _ = _step(model, [("r", [9], 3)], {"r": xargs})
        assert len(hooks.plan) == int(expected)


def test_build_plan_takes_decided_gates_by_name():
    unit = _unit(14)
    xargs = _xargs(list(_gated(unit, 0.5)), 3)
    positions = torch.tensor([3])
    assert build_plan([(0, 1, xargs)], positions, num_layers=3, gates={"g": False}) == []
    (steer,) = build_plan([(0, 1, xargs)], positions, num_layers=3, gates={"g": True})
    assert (steer.layer, steer.site, steer.op) == (2, "output", "add")
    with pytest.raises(RuntimeError, match="undecided"):
        build_plan([(0, 1, xargs)], positions, num_layers=3)
    (reading,) = build_plan([(0, 3, xargs)], torch.tensor([0, 1, 2]), num_layers=3)  # the prompt: read it
    assert reading.op == "condition" and reading.offsets.tolist() == [0, 1, 2]
    orphan = _xargs([ResidualAddition(2, "output", "from", torch.ones(1, HIDDEN), "after_prompt", gate="h")], 3)
    with pytest.raises(ValueError, match="gated by 'h', which no condition"):
        build_plan([(0, 1, orphan)], positions, num_layers=3)


# ---------------------------------------------------------------------- the client side
def test_the_new_fields_travel_on_the_wire_and_only_conditions_get_a_nonce():
    basis = _basis()
    rotation = ResidualAddition(0, "output", "rotate_to", basis, "all", angle=-0.25)
    condition, gated = _gated(_unit(1), 0.125, "<")
    (wired_rotation,) = json.loads(steering_fields([rotation], 4)["vllm_xargs"][XARGS_KEY])
    assert wired_rotation["angle"] == -0.25 and "gate" not in wired_rotation
    assert XARGS_NONCE not in steering_fields([rotation], 4)["vllm_xargs"]
    assert steering_fields([rotation], 4) == steering_fields([rotation], 4)  # no nonce: one salt per steering
    first, second = steering_fields([condition, gated], 4), steering_fields([condition, gated], 4)
    assert first["vllm_xargs"][XARGS_NONCE] != second["vllm_xargs"][XARGS_NONCE]
    assert first["cache_salt"] != second["cache_salt"]  # a request of its own: no shared prefix-cache blocks
    wired = json.loads(first["vllm_xargs"][XARGS_KEY])
    assert (wired[0]["threshold"], wired[0]["comparison"], wired[0]["gate"], wired[1]["gate"]) == (0.125, "<", "g", "g")
    parsed = parse(first["vllm_xargs"][XARGS_KEY])
    assert (parsed[0].mode, parsed[0].threshold, parsed[0].comparison) == ("condition", 0.125, "<")
    assert parse(steering_fields([rotation], 4)["vllm_xargs"][XARGS_KEY])[0].angle == -0.25
    other_angle = ResidualAddition(0, "output", "rotate_to", basis, "all", angle=0.5)
    assert steering_fields([other_angle], 4)["cache_salt"] != steering_fields([rotation], 4)["cache_salt"]


@pytest.fixture(scope="module")
def skeleton():
    return meta_skeleton(resolve_model_reference(TINY_REF), trust_remote_code=False)


def test_iti_and_angular_steering_lower_on_the_meta_skeleton(skeleton):
    directions = torch.randn(2, 4, 16, generator=torch.Generator().manual_seed(0))
    iti = ITI(directions=directions, heads=[[1, 2]], alpha=3.0, strength_unit="absolute")
    bind(iti, skeleton, None, "vllm")
    (edit,) = lower(iti)
    assert (edit.layer, edit.site, edit.mode, edit.rows.shape) == (1, "heads", "from", (1, 64))
    expected = 3.0 * directions[1, 2] / directions[1, 2].norm()
    assert_equal_up_to_rounding(edit.rows[0, 32:48], expected, terms=64 + 2)  # a norm over head_dim, two products
    angular = AngularSteering(steering_vector=torch.randn(64), angle=30.0)
    bind(angular, skeleton, None, "vllm")
    (rotation,) = lower(angular)
    assert rotation.mode == "rotate" and rotation.angle == pytest.approx(math.pi / 6)
    with pytest.raises(ValueError, match="cannot capture"):
        bind(ITI(data=[{"positive": "a", "negative": "b"}] * 2), skeleton, None, "vllm_serve")


def test_cast_lowers_to_its_condition_and_the_gated_caa_addition(skeleton):
    condition = torch.randn(64, generator=torch.Generator().manual_seed(1))
    cast = CAST(steering_vector=torch.ones(64), layer_id=1, multiplier=2.0, condition_vector=condition,
                condition_layer=0, threshold=0.3, comparison="<")  # fmt: skip
    bind(cast, skeleton, None, "vllm")
    reading, gated = lower(cast)
    assert (reading.layer, reading.mode, reading.threshold, reading.comparison) == (0, "condition", 0.3, "<")
    assert (gated.layer, gated.mode, gated.gate, gated.scope) == (1, "from", reading.gate, "after_prompt")
    assert torch.equal(gated.rows[0], torch.full((64,), 2.0))  # 2.0 x 1.0, exactly
    fields = steering_fields([reading, gated], 5)
    assert XARGS_NONCE in fields["vllm_xargs"] and fields["vllm_xargs"]["steer_hydra_start"] == [5, 5]
    parsed = parse(fields["vllm_xargs"][XARGS_KEY])
    assert parsed[1].gate == parsed[0].gate and parsed[0].rows.shape == (1, 64)


# ---------------------------------------------------------------------- the offline backend, with a stand-in vLLM
FIT_PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
    {"prompt": "is fire hot", "positive": " yes always", "negative": " never"},
]
CONDITION_PAIRS = [
    {"positive": "tell me about the cat and the dog", "negative": "what is two plus three"},
    {"positive": "a story about a bird in a tree", "negative": "count from one to ten"},
]


def _new_controls():
    return [
        ITI(data=FIT_PAIRS, top_k=3, alpha=2.0, prompt_format="text"),
        CAST(data=FIT_PAIRS, layer_id=1, condition_data=CONDITION_PAIRS, condition_layer=0, prompt_format="text"),
        AngularSteering(data=FIT_PAIRS, layer_id=0, angle=30.0, prompt_format="text"),
    ]


def test_fits_made_for_the_engine_match_in_process_fits_and_the_edits_ride_on_each_request(
    fake_vllm,  # noqa: F811 - the stand-in vLLM of test_vllm_offline
    monkeypatch,
    tmp_path,
):
    monkeypatch.setenv("STEER_HYDRA_CACHE", str(tmp_path / "cache"))
    served = _new_controls()
    pipeline = SteeringPipeline(TINY_REF, controls=served, backend=BackendSpec("vllm", {"enforce_eager": True}))
    assert pipeline.check().ok
    pipeline.steer()  # each fit on the Hugging Face model of the checkpoint, cached, then bound on a meta skeleton
    assert len(list((tmp_path / "cache" / "vectors").glob("*.safetensors"))) == 3
    in_process = _new_controls()
    SteeringPipeline(TINY_REF, controls=in_process).steer().release()
    for engine_control, reference in zip(served, in_process, strict=True):
        got, want = lower(engine_control), reference.residual_edits()
        assert [(e.layer, e.site, e.mode, e.gate) for e in got] == [(e.layer, e.site, e.mode, e.gate) for e in want]
        for a, b in zip(got, want, strict=True):  # the same fit on another load of the same weights: the same rows
            assert torch.equal(a.rows, b.rows), type(reference).__name__
    pipeline.generate(input_ids=[[1, 50, 60], [1, 70, 80]], max_new_tokens=3)
    _, (requests, sampling, _) = pipeline._backend.engine.calls  # after the probe
    payloads = [json.loads(s.kwargs["extra_args"][XARGS_KEY]) for s in sampling]
    modes = {(e["site"], e["mode"]) for e in payloads[0]}
    assert {("heads", "from"), ("output", "condition"), ("output", "from"), ("output", "rotate")} <= modes
    nonces = [s.kwargs["extra_args"][XARGS_NONCE] for s in sampling]
    assert nonces[0] != nonces[1] and requests[0]["cache_salt"] != requests[1]["cache_salt"]
    pipeline.release()


def test_activation_adapter_lowers_to_the_dedicated_controls_edits(skeleton):
    from steer_hydra.controls.state import DirectionalAblation

    r = torch.randn(64, generator=torch.Generator().manual_seed(2))
    adapter = ActivationAdapter(
        transform="project", vector=r, sites=["input", "attention", "output"], token_scope="all"
    )
    ablation = DirectionalAblation(direction_vector=r)
    for control in (adapter, ablation):
        bind(control, skeleton, None, "vllm")
    got, want = lower(adapter), lower(ablation)
    assert [(e.layer, e.site, e.mode, e.start(9)) for e in got] == [(e.layer, e.site, e.mode, e.start(9)) for e in want]
    assert all(torch.equal(a.rows, b.rows) for a, b in zip(got, want, strict=True))
    gated = ActivationAdapter(vector=r, layers=[1], condition_vector=-r, condition_layer=0, threshold=0.5)
    bind(gated, skeleton, None, "vllm")
    reading, addition = lower(gated)
    assert (reading.mode, reading.layer, addition.gate, addition.layer) == ("condition", 0, reading.gate, 1)
    assert XARGS_NONCE in steering_fields(lower(gated), 4)["vllm_xargs"]
