"""CAA and ActAdd lowered to vLLM: the client-side lowering and the worker plugin's token-to-request mapping (no vLLM).

The plugin's hooks run here on a stand-in model with vLLM's decoder-layer contract (`layer(positions, hidden,
residual) -> (hidden, residual)`, the stream being their sum) and a stand-in model runner (persistent batch order,
`query_start_loc`, per-request `extra_args`), so the flat-batch mapping is checked against each request run alone.
"""

from __future__ import annotations

import copy
import json
import types

import numpy as np
import pytest
import torch
from vllm_toy import HIDDEN, ToyModel
from vllm_toy import runner as _runner
from vllm_toy import xargs as _xargs

from steer_hydra.backends.vllm import plugin as vllm_plugin
from steer_hydra.backends.vllm.plugin import add_rows, build_plan, install, request_spec
from steer_hydra.backends.vllm.steering import (
    XARGS_KEY,
    XARGS_START,
    bind,
    is_lowerable,
    lower,
    lowered_requirements,
    meta_skeleton,
    steering_fields,
    wire,
)
from steer_hydra.controls.state import CAA, PASTA, ActAdd
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import ResidualAddition
from steer_hydra.models import TINY_REF, resolve_model_reference
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, rounding_atol

# The roundings that accumulate into one output element of ToyModel: per layer two linears (a dot product of HIDDEN
# terms plus the bias each), two tanh, the position mix and two residual sums; the steering additions add a few.
TOY_ROUNDINGS = 3 * (2 * (HIDDEN + 1) + 5) + 4


def assert_as_alone(actual: torch.Tensor, alone: torch.Tensor, msg: object = None) -> None:
    """A request's rows in a batch equal the rows it gets alone, but for the rounding of another summation order
    (another batch shape takes another matmul kernel; another CPU another one still)."""
    assert_equal_up_to_rounding(actual, alone, terms=TOY_ROUNDINGS, msg=msg)


# ---------------------------------------------------------------------- lowering (client side)
@pytest.fixture(scope="module")
def skeleton():
    model = meta_skeleton(resolve_model_reference(TINY_REF), trust_remote_code=False)
    assert next(model.parameters()).device.type == "meta"  # no weights, no memory
    return model


def test_caa_lowers_to_its_own_delta_at_the_layer_output_with_a_start_per_scope(skeleton):
    vector = torch.linspace(-1, 1, 64)
    for scope, last_k, starts in (("after_prompt", None, (7, 3)), ("all", None, (0, 0)), ("last_k", 2, (5, 1))):
        caa = CAA(steering_vector=vector, layer_id=1, multiplier=3.0, token_scope=scope, last_k=last_k)
        bind(caa, skeleton, None, "vllm")
        (addition,) = lower(caa)
        assert (addition.layer, addition.site, addition.mode) == (1, "output", "from")
        assert torch.allclose(addition.rows[0], 3.0 * vector)
        assert (addition.start(7), addition.start(3)) == starts
    normalized = CAA(steering_vector=vector, layer_id=0, multiplier=2.0, normalize_vector=True)
    bind(normalized, skeleton, None, "vllm")
    # two norms over 64 elements, a division and a product: 2 * 64 + 2 roundings on magnitudes up to 2
    assert lower(normalized)[0].rows.norm().item() == pytest.approx(2.0, abs=rounding_atol(2.0, terms=2 * 64 + 2))
    silent = CAA(steering_vector=vector, layer_id=0, multiplier=0.0)
    bind(silent, skeleton, None, "vllm")
    assert lower(silent) == ()


def test_actadd_lowers_to_a_positional_block_at_the_layer_input(skeleton):
    block = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    actadd = ActAdd(steering_vector=block, layer_id=1, multiplier=-2.0, alignment=1, use_norm_preservation=True)
    bind(actadd, skeleton, None, "vllm")
    (addition,) = lower(actadd)
    assert (addition.layer, addition.site, addition.mode, addition.preserve_norm) == (1, "input", "block", True)
    assert torch.allclose(addition.rows, -2.0 * block)
    assert addition.start(10) == addition.start(2) == 1  # counted from the first prompt token, whatever its length


def test_vectors_to_fit_are_refused_naming_the_fix_and_in_process_torch_is_no_longer_needed(skeleton):
    fitted = CAA(data=[{"positive": "yes", "negative": "no"}])
    assert lowered_requirements(fitted) == {Capability.HIDDEN_CAPTURE}
    assert lowered_requirements(CAA(steering_vector=torch.ones(64))) == frozenset()
    with pytest.raises(ValueError, match=r"cannot capture.*SteeringVector.save.*steering_vector=PATH"):
        bind(fitted, skeleton, None, "vllm")
    with pytest.raises(ValueError, match=r"hidden size|64"):
        bind(CAA(steering_vector=torch.ones(10), layer_id=0), skeleton, None, "vllm")


def test_only_controls_declaring_adds_residual_are_lowered():
    assert is_lowerable(CAA(steering_vector=torch.ones(64))) and is_lowerable(ActAdd(steering_vector=torch.ones(64)))
    pasta = PASTA(head_config=[0])
    assert not is_lowerable(pasta)
    assert lowered_requirements(pasta) == {Capability.IN_PROCESS_TORCH}
    look_alike = types.SimpleNamespace(layer=0, vector=None, multiplier=1.0, token_scope="all", adds_residual=True)
    assert not is_lowerable(look_alike)  # a declaration on a StateControl, not a surface of attributes
    with pytest.raises(RuntimeError, match=r"CAA.residual_addition called before steer\(\); steer the pipeline"):
        lower(CAA(steering_vector=torch.ones(64)))


def test_wire_fields_carry_the_rows_exactly_and_salt_the_cache_per_steering():
    rows = torch.randn(1, HIDDEN, generator=torch.Generator().manual_seed(1))
    addition = ResidualAddition(0, "output", "from", rows, "after_prompt")
    fields = steering_fields([addition], prompt_length=5)
    xargs = fields["vllm_xargs"]
    (wire,) = json.loads(xargs[XARGS_KEY])
    assert torch.equal(torch.tensor(wire["rows"], dtype=torch.float32), rows)  # float32 round-trips exactly
    assert xargs[XARGS_START] == [5]
    other = ResidualAddition(0, "output", "from", rows * 2, "after_prompt")
    assert steering_fields([other], 5)["cache_salt"] != fields["cache_salt"]
    assert steering_fields([addition], 5)["cache_salt"] == fields["cache_salt"]
    assert steering_fields([], 5) == {}  # unsteered rows: no xargs, no salt (they share the prefix cache)


# ---------------------------------------------------------------------- the worker plugin
def _linear(seed: int) -> torch.nn.Linear:
    linear = torch.nn.Linear(HIDDEN, HIDDEN)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(HIDDEN, HIDDEN, generator=torch.Generator().manual_seed(seed)))
    return linear


class ToyAttention(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.linear = _linear(seed)

    def forward(self, hidden_states):
        return torch.tanh(self.linear(hidden_states))


@pytest.fixture
def toy():
    with torch.random.fork_rng(devices=[]):  # the same toy whatever ran before; the global RNG left as it was
        torch.manual_seed(0)
        return ToyModel(ToyAttention, _linear)


def _forward(model, runner, chunks):
    """One engine step over `chunks` = [(token ids, first position)], flattened in batch order."""
    hooks = install(runner)
    ids = torch.cat([torch.tensor(t) for t, _ in chunks])
    positions = torch.cat([torch.arange(p, p + len(t)) for t, p in chunks])
    with torch.inference_mode():
        out = model(input_ids=ids, positions=positions)
    return out, hooks


def test_a_mixed_batch_gives_each_request_what_it_gets_alone(toy):
    caa = ResidualAddition(1, "output", "from", torch.full((1, HIDDEN), 0.5), "after_prompt")
    block = torch.randn(2, HIDDEN, generator=torch.Generator().manual_seed(2))
    actadd = ResidualAddition(0, "input", "block", block, "position", offset=1, preserve_norm=True)
    prompts = {"a": [3, 4, 5, 6], "b": [7, 8, 9], "c": [10, 11, 12, 13, 14]}
    steering = {"a": [caa], "b": [], "c": [caa, actadd]}
    # one prefill step of every prompt, plus a decode step: prompt "a" at position 4 (after its prompt)
    prefill = {r: (t, 0) for r, t in prompts.items()}
    steps = {"prefill": prefill, "decode": {r: ([2], len(t)) for r, t in prompts.items()}}
    for chunks in steps.values():
        requests = [(r, len(t), _xargs(steering[r], len(prompts[r]))) for r, (t, _) in chunks.items()]
        together, hooks = _forward(toy, _runner(toy, requests), list(chunks.values()))
        bounds = np.cumsum([0] + [len(t) for t, _ in chunks.values()])
        for i, (rid, chunk) in enumerate(chunks.items()):
            alone, _ = _forward(toy, _runner(toy, [requests[i]]), [chunk])
            assert_as_alone(together[bounds[i] : bounds[i + 1]], alone, rid)
    steered_steps = hooks.steps
    unsteered, _ = _forward(toy, _runner(toy, [("b", 3, None)]), [(prompts["b"], 0)])
    assert hooks.steps == steered_steps  # a step without steered requests builds no plan
    steered_prefill, _ = _forward(toy, _runner(toy, [("a", 4, _xargs([caa], 4))]), [(prompts["a"], 0)])
    plain_prefill, _ = _forward(toy, _runner(toy, [("a", 4, None)]), [(prompts["a"], 0)])
    assert torch.equal(steered_prefill, plain_prefill)  # after_prompt: no prompt position is touched
    steered_decode, _ = _forward(toy, _runner(toy, [("a", 1, _xargs([caa], 4))]), [([2], 4)])
    plain_decode, _ = _forward(toy, _runner(toy, [("a", 1, None)]), [([2], 4)])
    assert not torch.allclose(steered_decode, plain_decode)  # ...and every generated one is
    assert unsteered.shape == (3, HIDDEN)


def test_output_additions_shift_the_stream_by_the_rows_without_touching_the_inputs():
    gen = torch.Generator().manual_seed(5)
    hidden, residual = torch.randn(5, HIDDEN, generator=gen), torch.randn(5, HIDDEN, generator=gen)
    rows, index = torch.randn(2, HIDDEN, generator=gen), torch.tensor([1, 3])
    with torch.inference_mode():
        h, r = hidden.clone(), residual.clone()
        out = add_rows(h, r, index, rows, preserve=False)
        kept = add_rows(h, r, index, rows, preserve=True)
    assert torch.equal(h, hidden) and torch.equal(r, residual)  # out of place
    stream, steered = hidden + residual, out + residual
    # (hidden + rows) + residual against (hidden + residual) + rows: two sums each, in another order
    assert_equal_up_to_rounding(steered[index], stream[index] + rows, terms=2, operands=(hidden, residual, rows))
    assert torch.equal(steered[[0, 2, 4]], stream[[0, 2, 4]])
    kept_stream = kept + residual
    # the whole stream's norm: three norms over HIDDEN elements, a ratio, a product and the sums around them
    assert_equal_up_to_rounding(kept_stream.norm(dim=-1), stream.norm(dim=-1), terms=3 * HIDDEN + 5)
    assert not torch.allclose(kept_stream[index], stream[index])


def test_plan_maps_block_rows_to_positions_and_skips_unsteered_and_padding():
    block = ResidualAddition(2, "input", "block", torch.arange(3 * HIDDEN).reshape(3, HIDDEN).float(), "position")
    requests = [(0, 3, None), (3, 7, _xargs([block], 4)), (7, 7, _xargs([block], 2))]
    positions = torch.tensor([0, 1, 2, 1, 2, 3, 4, 0, 0])  # request 2 is scheduled with no token; 2 pads
    plan = build_plan(requests, positions, num_layers=3)
    (steer,) = plan
    assert (steer.layer, steer.site, steer.preserve_norm) == (2, "input", False)
    assert steer.index.tolist() == [3, 4] and torch.equal(steer.rows, block.rows[[1, 2]])  # block positions 1, 2
    with pytest.raises(ValueError, match="out of range"):
        build_plan(requests, positions, num_layers=2)
    short = dict(requests[1][2], **{XARGS_START: [1, 2]})
    with pytest.raises(ValueError, match=f"{XARGS_START} has 2 entries for 1 additions"):
        build_plan([(0, 3, short)], positions, num_layers=3)
    with pytest.raises(ValueError, match="M-RoPE"):
        build_plan(requests, torch.stack([positions] * 3), num_layers=3)
    kept = [ResidualAddition(2, "input", "block", block.rows * k, "position", preserve_norm=True) for k in (1, -2)]
    plan = build_plan([(0, 3, _xargs(kept, 3))], positions, num_layers=3)
    # two norm-preserving additions at one site of one request: two entries applied in turn (an index_copy would
    # drop one of two duplicate indices)
    assert [(s.layer, s.site, s.preserve_norm, s.index.tolist()) for s in plan] == [(2, "input", True, [0, 1, 2])] * 2
    assert torch.equal(plan[0].rows, kept[0].rows) and torch.equal(plan[1].rows, kept[1].rows)


def _reference(requests, positions):
    """Per (layer, site): the dense `[tokens, hidden]` sum of what each token gets, by plain loops over requests,
    their wire additions and their tokens."""
    deltas = {}
    for begin, end, xargs in requests:
        if not xargs:
            continue
        for item, start in zip(json.loads(xargs[XARGS_KEY]), xargs[XARGS_START], strict=True):
            rows = torch.tensor(item["rows"], dtype=torch.float32)
            for token in range(begin, end):
                offset = int(positions[token]) - start
                if offset < 0 or (item["mode"] == "block" and offset >= len(rows)):
                    continue
                delta = deltas.setdefault((item["layer"], item["site"]), torch.zeros(len(positions), HIDDEN))
                delta[token] += rows[offset if item["mode"] == "block" else 0]
    return deltas


def _dense(plan, num_tokens):
    deltas = {}
    for steer in plan:
        delta = deltas.setdefault((steer.layer, steer.site), torch.zeros(num_tokens, HIDDEN))
        delta.index_add_(0, steer.index, steer.rows)
    return deltas


def _step(model, batch, steering, pad=0):
    """One engine step: `batch` = [(req_id, token ids, first position)] in persistent-batch order, `pad` padding
    tokens after the last range; returns the output, the hooks and the step's (begin, end, extra_args) ranges."""
    requests = [(rid, len(ids), steering[rid]) for rid, ids, _ in batch]
    chunks = [(ids, first) for _, ids, first in batch] + ([([0] * pad, 0)] if pad else [])
    out, hooks = _forward(model, _runner(model, requests), chunks)
    bounds = np.cumsum([0] + [n for _, n, _ in requests])
    return out, hooks, [(int(bounds[i]), int(bounds[i + 1]), x) for i, (_, _, x) in enumerate(requests)]


def _positions(batch, pad=0):
    return torch.cat([torch.arange(p, p + len(t)) for _, t, p in batch] + [torch.zeros(pad, dtype=torch.long)])


@pytest.mark.parametrize("gather_at_once", [1 << 22, 0], ids=["rows-per-step", "rows-per-layer"])
def test_requests_admitted_and_finished_mid_decode_each_get_what_they_get_alone(toy, monkeypatch, gather_at_once):
    monkeypatch.setattr(vllm_plugin, "_GATHER_AT_ONCE", gather_at_once)
    alone_model = copy.deepcopy(toy)  # unhooked copy: its hooks (and their caches) are separate
    plain_model = copy.deepcopy(toy)
    gen = torch.Generator().manual_seed(3)
    caa = ResidualAddition(1, "output", "from", torch.randn(1, HIDDEN, generator=gen), "after_prompt")
    caa_too = ResidualAddition(1, "output", "from", torch.randn(1, HIDDEN, generator=gen), "last_k", last_k=2)
    block = ResidualAddition(0, "input", "block", torch.randn(3, HIDDEN, generator=gen), "position", offset=2)
    kept = ResidualAddition(2, "output", "block", torch.randn(2, HIDDEN, generator=gen), "all", preserve_norm=True)
    prompts = {"a": 4, "b": 3, "c": 5, "d": 4}
    additions = {"a": [caa], "b": [], "c": [caa, block, caa_too], "d": [kept, caa]}
    steering = {rid: _xargs(additions[rid], prompts[rid]) for rid in prompts}

    def prefill(rid, first=0, count=None):
        return (rid, list(range(first + 1, first + 1 + (count or prompts[rid] - first))), first)

    def decode(rid, position):
        return (rid, [position % 31 + 1], position)

    steps = [
        ([prefill("a"), prefill("b")], 0),
        ([decode("a", 4), decode("b", 3), prefill("c")], 2),  # c admitted mid-decode
        ([decode("a", 5), decode("b", 4), decode("c", 5)], 0),
        ([decode("a", 6), decode("b", 5), decode("c", 6)], 3),
        ([decode("c", 7), decode("b", 6), prefill("d", 0, 2)], 0),  # a finished: c moved into its slot; d chunked
        ([decode("c", 8), decode("b", 7), prefill("d", 2)], 1),
        ([decode("c", 9), decode("d", 4)], 0),  # b finished
    ]
    steered = 0
    for batch, pad in steps:
        out, hooks, requests = _step(toy, batch, steering, pad)
        positions = _positions(batch, pad)
        reference, planned = _reference(requests, positions), _dense(hooks.plan, len(positions))
        assert reference.keys() == planned.keys()
        for key, delta in reference.items():
            assert torch.equal(planned[key], delta), key
        plain, _, _ = _step(plain_model, batch, dict.fromkeys(prompts), pad)
        assert torch.equal(out[len(out) - pad :], plain[len(out) - pad :])  # padding untouched
        for (rid, ids, first), (begin, end, _) in zip(batch, requests, strict=True):
            alone, _, _ = _step(alone_model, [(rid, ids, first)], steering)
            assert_as_alone(out[begin:end], alone, (rid, first))
            if additions[rid]:
                steered += not torch.allclose(out[begin:end], plain[begin:end])
            else:
                assert torch.equal(out[begin:end], plain[begin:end])
    assert steered == 11  # every request chunk with a position in an addition's span changed (d's 2nd chunk has none)


def test_the_batch_composition_is_reused_only_while_every_payload_and_the_batch_stay_the_same(toy):
    alone_model = copy.deepcopy(toy)  # unhooked copy: its hooks (and their caches) are separate
    gen = torch.Generator().manual_seed(4)
    first = ResidualAddition(1, "output", "from", torch.randn(1, HIDDEN, generator=gen), "after_prompt")
    second = ResidualAddition(1, "output", "from", torch.randn(1, HIDDEN, generator=gen), "after_prompt")
    steering = {"a": _xargs([first], 3), "b": None}
    _, hooks, _ = _step(toy, [("a", [1, 2, 3], 0), ("b", [4, 5], 0)], steering)
    prefill = hooks.composition
    out, _, _ = _step(toy, [("a", [6], 3), ("b", [7], 2)], steering)
    decode = hooks.composition
    assert decode is prefill  # same requests, same payloads: one composition (the token ranges changed)
    ranges = decode._ranges
    again, _, _ = _step(toy, [("a", [6], 4), ("b", [7], 3)], steering)
    assert hooks.composition is decode and decode._ranges is ranges  # a steady decode step reuses both
    assert not torch.allclose(again, out)  # (the positions moved)
    changed = dict(steering, a=_xargs([second], 3))  # a's payload changes under the same request id
    out_changed, _, _ = _step(toy, [("a", [6], 3), ("b", [7], 2)], changed)
    assert hooks.composition is not decode
    alone_first, _, _ = _step(alone_model, [("a", [6], 3)], steering)
    assert_as_alone(out[:1], alone_first)
    alone_changed, _, _ = _step(alone_model, [("a", [6], 3)], changed)
    assert_as_alone(out_changed[:1], alone_changed)
    assert not torch.allclose(out_changed[:1], out[:1])  # the new vector, not the cached old one
    assert torch.equal(out_changed[1:], out[1:])
    restarted = dict(steering, a={**steering["a"], XARGS_START: [2]})  # the same payload, another start
    assert request_spec(restarted["a"]) != request_spec(steering["a"])
    _step(toy, [("a", [6], 2), ("b", [7], 2)], steering)  # position 2 is before the start 3: unsteered
    plain_at_2 = hooks.plan
    out_restarted, _, _ = _step(toy, [("a", [6], 2), ("b", [7], 2)], restarted)
    assert hooks.composition is not decode and plain_at_2 == [] and len(hooks.plan) == 1
    alone_restarted, _, _ = _step(alone_model, [("a", [6], 2)], restarted)
    assert_as_alone(out_restarted[:1], alone_restarted)
    before = hooks.composition
    _step(toy, [("b", [7], 3)], steering)  # a finished
    assert hooks.composition is not before and not hooks.composition and hooks.plan == []
    _step(toy, [("b", [7], 4)], steering)
    assert hooks.plan == [] and not hooks.at


def test_the_plugin_is_inert_without_the_env_flag(monkeypatch):
    monkeypatch.delenv("STEER_HYDRA_VLLM_STEERING", raising=False)
    monkeypatch.setitem(__import__("sys").modules, "vllm", None)  # would raise if register() imported it
    assert vllm_plugin.register() is None


def test_a_runner_without_the_persistent_batch_is_left_alone(toy):
    runner = types.SimpleNamespace(get_model=lambda: toy)
    assert install(runner) is None
    assert not toy._forward_pre_hooks and not any(layer._forward_hooks for layer in toy.layers)


def test_the_payload_is_encoded_once_per_distinct_additions_and_follows_their_content(monkeypatch):
    from steer_hydra.backends.vllm import steering as vllm_steering

    rows = torch.arange(8, dtype=torch.float32).reshape(1, 8)
    written = []
    monkeypatch.setattr(vllm_steering, "wire", lambda a: written.append(a) or wire(a))
    first = ResidualAddition(2, "output", "from", rows, "after_prompt")
    same = ResidualAddition(2, "output", "from", rows.clone(), "after_prompt")
    fields = [steering_fields([a], 5) for a in (first, same, first)]
    assert len(written) <= 1 and fields[0] == fields[1] == fields[2]
    changed = ResidualAddition(2, "output", "from", rows + 1e-6, "after_prompt")
    other = steering_fields([changed], 5)
    assert json.loads(other["vllm_xargs"][XARGS_KEY])[0]["rows"] == (rows + 1e-6).double().tolist()
    assert other["cache_salt"] != fields[0]["cache_salt"]
    assert steering_fields([first], 6)["cache_salt"] != fields[0]["cache_salt"]  # starts salt the cache too


def test_projections_remove_the_direction_from_every_edited_stream_of_their_request_only(toy):
    r = torch.randn(HIDDEN, generator=torch.Generator().manual_seed(7))
    r = (r / r.norm())[None]
    edits = [ResidualAddition(0, "input", "project", r, "last_k", last_k=2)]
    for layer in range(3):
        edits += [ResidualAddition(layer, "attention", "project", r, "last_k", last_k=2)]
        edits += [ResidualAddition(layer, "output", "project", r, "last_k", last_k=2)]
    install(_runner(toy, []))  # the steering hooks first: the recorders below run after them
    seen = {}  # what each edited stream is, after the steering hooks
    for i, layer in enumerate(toy.layers):
        layer.register_forward_pre_hook(
            lambda m, a, k, i=i: seen.__setitem__(("input", i), a[1] + (a[2] if a[2] is not None else 0)),
            with_kwargs=True,
        )
        layer.self_attn.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("attention", i), o))
        layer.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("output", i), o[0] + o[1]))
    plain_model = copy.deepcopy(toy)
    batch = [("a", [3, 4, 5, 6, 7], 0), ("b", [8, 9, 10], 0)]
    steering = {"a": _xargs(edits, 5), "b": None}
    out, hooks, _ = _step(toy, batch, steering)
    assert {(s.layer, s.site, s.op) for s in hooks.plan} == {(e.layer, e.site, "project") for e in edits}
    for key, stream in seen.items():
        along = (stream @ r[0]).abs()
        assert along[3:5].max() < 1e-5, key  # a's last 2 prompt positions: the direction is gone
        assert along[:3].min() > 1e-4 and along[5:].min() > 1e-4, key  # a's earlier positions and b untouched
    plain, _, _ = _step(plain_model, batch, {"a": None, "b": None})
    assert torch.equal(out[5:], plain[5:]) and torch.equal(out[:3], plain[:3])
    assert not torch.allclose(out[3:5], plain[3:5])
    alone, _, _ = _step(copy.deepcopy(plain_model), batch[:1], steering)
    assert_as_alone(out[:5], alone)
    gen = torch.Generator().manual_seed(6)
    hidden, residual, index = (
        torch.randn(4, HIDDEN, generator=gen),
        torch.randn(4, HIDDEN, generator=gen),
        torch.tensor([0, 2]),
    )
    with torch.inference_mode():
        edited = vllm_plugin.project_rows(hidden, residual, index, r.expand(2, -1))
    stream = hidden + residual
    expected = stream[index] - (stream[index] @ r[0])[:, None] * r
    # a dot product over HIDDEN elements, the product and the sums on either side
    assert_equal_up_to_rounding((edited + residual)[index], expected, terms=HIDDEN + 4, operands=(stream,))
    assert torch.equal(edited[[1, 3]], hidden[[1, 3]])
