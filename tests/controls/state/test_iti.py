"""ITI: only the chosen heads' slices of the output projection's input move, by exactly alpha * sigma * theta; the
probes pick the head that reads the label; fitting, saving, batching, refill, the engine edits and Args errors."""

from __future__ import annotations

import contextlib

import pytest
import torch

from steer_hydra.controls.state import ITI, SteeringVector
from steer_hydra.controls.state.iti import HeadProbes, fit_head_probes
from steer_hydra.controls.state.probing import fit_probes, probe_scores
from steer_hydra.core import Capability
from steer_hydra.core.layout import resolve_layout
from steer_hydra.testing.numerics import assert_equal_up_to_rounding, decoder_roundings

PROMPTS = ["the capital of france is", "hello", "count one two three four five"]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
    {"prompt": "is fire hot", "positive": " yes always", "negative": " never"},
]
LAYERS, HEADS, DIM = 2, 4, 16  # the tiny model: hidden 64 = 4 heads x 16
SEQUENCE = torch.tensor([[1, 50, 60, 70, 80, 90, 100, 110, 120]])  # a 6-token prompt + 3 "generated" tokens


def _directions(seed=0):
    return torch.randn(LAYERS, HEADS, DIM, generator=torch.Generator().manual_seed(seed))


def _steered(tiny, **kwargs):
    model, tokenizer = tiny
    control = ITI(**kwargs)
    control.steer(model, tokenizer=tokenizer)
    return control


@contextlib.contextmanager
def _around_hooks(model, hooks):
    """Record every layer's output-projection input just before and just after the control's hooks."""
    before, after, handles = {}, {}, []
    for layer in range(LAYERS):
        o_proj = model.get_submodule(f"model.layers.{layer}.self_attn.o_proj")
        handles.append(
            o_proj.register_forward_pre_hook(lambda m, a, layer=layer: before.setdefault(layer, a[0].clone()))
        )
    with contextlib.ExitStack() as stack:
        for spec in hooks.get("pre", ()):
            handle = model.get_submodule(spec["module"]).register_forward_pre_hook(spec["hook_func"], with_kwargs=True)
            stack.callback(handle.remove)
        for layer in range(LAYERS):
            o_proj = model.get_submodule(f"model.layers.{layer}.self_attn.o_proj")
            handles.append(
                o_proj.register_forward_pre_hook(lambda m, a, layer=layer: after.setdefault(layer, a[0].clone()))
            )
        try:
            yield before, after
        finally:
            for handle in handles:
                handle.remove()


@pytest.mark.parametrize(("scope", "first"), [("all", 0), ("last_k", 5), ("after_prompt", 6)])
def test_only_the_chosen_heads_slices_move_and_by_exactly_their_shift(tiny, scope, first):
    model, _ = tiny
    directions = _directions()
    chosen = [[0, 1], [1, 3], [1, 0]]
    control = _steered(
        tiny, directions=directions, heads=chosen, alpha=2.5, strength_unit="absolute", token_scope=scope
    )
    hooks = control.get_hooks(SEQUENCE[:, :6], {}, attention_mask=torch.ones(1, 6, dtype=torch.long))
    with torch.no_grad(), _around_hooks(model, hooks) as (before, after):
        model(input_ids=SEQUENCE)
    rows = {edit.layer: edit.rows[0] for edit in control.residual_edits()}
    for layer in range(LAYERS):
        x, y = before[layer][0], after[layer][0]  # [positions, heads * dim]
        for head in range(HEADS):
            cols = slice(head * DIM, (head + 1) * DIM)
            if [layer, head] in chosen:
                unit = directions[layer, head] / directions[layer, head].norm()
                # the shift is alpha * theta (the unit vector from a norm over DIM terms, then one product)
                assert_equal_up_to_rounding(rows[layer][cols], 2.5 * unit, terms=DIM + 2)
                assert torch.equal(y[:first, cols], x[:first, cols])  # outside the token scope: untouched
                assert torch.equal(y[first:, cols], x[first:, cols] + rows[layer][cols])  # inside: exactly x + shift
                assert not torch.equal(y[first:, cols], x[first:, cols])
            else:
                assert torch.equal(y[:, cols], x[:, cols]), (layer, head)  # other heads: bit for bit unsteered
    assert any(not torch.equal(before[layer], after[layer]) for layer in range(LAYERS))


def test_a_head_at_layer_one_leaves_layer_zero_as_unsteered_in_a_generation(make_pipeline, record_inputs):
    directions = _directions(1)
    control = ITI(directions=directions, heads=[[1, 2]], alpha=4.0, strength_unit="absolute", token_scope="all")
    runs = {}
    for name, pipeline in (("steered", make_pipeline([control])), ("plain", make_pipeline([]))):
        with (
            record_inputs(pipeline.model.get_submodule("model.layers.0.self_attn.o_proj")) as zero,
            record_inputs(pipeline.model.get_submodule("model.layers.1.self_attn.o_proj")) as one,
            record_inputs(pipeline.model.get_submodule("model.norm")) as final,
        ):
            pipeline.generate(text=PROMPTS, max_new_tokens=1)
        runs[name] = (zero.inputs[0], one.inputs[0], final.inputs[0])
    assert torch.equal(runs["steered"][0], runs["plain"][0])  # layer 0: nothing changed
    # the recorder sees layer 1's input before the hook: it is the unsteered one too (nothing upstream changed)
    assert torch.equal(runs["steered"][1], runs["plain"][1])
    assert not torch.allclose(runs["steered"][2], runs["plain"][2])  # and the shift reaches the stream


def test_the_probes_rank_the_head_that_reads_the_label_first():
    generator = torch.Generator().manual_seed(0)
    samples, probes, dim = 40, 6, 5
    labels = (torch.arange(samples) % 2).float()
    features = torch.randn(samples, probes, dim, generator=generator)
    features[:, 2, 0] += 3.0 * (2 * labels - 1)  # probe 2 reads the label on its first dimension
    weights, bias = fit_probes(features[:30], labels[:30], l2=1e-2, steps=100)
    accuracy, likelihood = probe_scores(features[30:], labels[30:], weights, bias)
    assert float(accuracy[2]) == 1.0 and int(torch.argmax(likelihood)) == 2
    assert float(accuracy.mean()) < 0.9  # the noise probes do not (values that can fail: a broken fit reads all)
    assert abs(float(weights[2, 0])) > 2 * float(weights[2, 1:].abs().max())  # it reads the label's dimension


def test_a_fit_on_the_tiny_model_gives_unit_directions_sigmas_and_top_k_heads_by_accuracy(tiny):
    model, tokenizer = tiny
    layout = resolve_layout(model)
    control = _steered(tiny, data=PAIRS, top_k=3, alpha=2.0, prompt_format="text", accumulate="completion")
    probes = control.probes
    norms = probes.directions.norm(dim=-1)
    assert_equal_up_to_rounding(norms, torch.ones_like(norms), terms=2 * DIM)  # a division and a norm over DIM
    assert (probes.sigma > 0).all() and ((probes.accuracy >= 0) & (probes.accuracy <= 1)).all()
    ranked = sorted(
        ((layer, head) for layer in range(LAYERS) for head in range(HEADS)),
        key=lambda c: (-float(probes.accuracy[c]), -float(probes.likelihood[c]), c),
    )
    assert list(control.chosen_heads) == ranked[:3]
    # mass mean shift and sigma, recomputed from the activations the fit read
    again = fit_head_probes(
        model, tokenizer, layout, PAIRS, layers=(0, 1), direction_method="mass_mean_shift", prompt_format="text",
        accumulate="completion", batch_size=2, validation_fraction=0.25, seed=0, l2=1e-2, steps=100,
    )  # fmt: skip
    # batching does not matter: other padding changes the order of the decoder's sums, not the unit directions
    assert_equal_up_to_rounding(again.directions, probes.directions, terms=decoder_roundings(model.config, 8))
    rows = {e.layer: e.rows[0] for e in control.residual_edits()}
    for layer, head in control.chosen_heads:
        piece = rows[layer][head * DIM : (head + 1) * DIM]
        expected = 2.0 * probes.sigma[layer, head] * probes.directions[layer, head]
        assert_equal_up_to_rounding(piece, expected, terms=3)  # alpha * sigma in double, then cast: one product
    for layer, row in rows.items():
        kept = [h for h in range(HEADS) if (layer, h) not in control.chosen_heads]
        assert all(torch.equal(row[h * DIM : (h + 1) * DIM], torch.zeros(DIM)) for h in kept)


def test_the_fit_saves_and_loads_as_one_vector(tiny, tmp_path):
    fitted = _steered(tiny, data=PAIRS, top_k=2, prompt_format="text")
    path = fitted.fitted_vector.save(tmp_path / "iti.safetensors")
    loaded = _steered(tiny, directions=str(path), top_k=2)
    assert loaded.chosen_heads == fitted.chosen_heads
    assert [torch.equal(a.rows, b.rows) for a, b in zip(loaded.residual_edits(), fitted.residual_edits(), strict=True)]
    assert loaded.vector_hash == fitted.vector_hash == fitted.fitted_vector.content_hash
    engine = ITI(data=PAIRS, top_k=2, prompt_format="text")  # what an engine backend does with a cached fit
    engine.steer(tiny[0], tokenizer=tiny[1], fitted_vector=fitted.load_vector(path))
    assert [e.rows.tolist() for e in engine.residual_edits()] == [e.rows.tolist() for e in fitted.residual_edits()]
    probe = HeadProbes.from_vector(fitted.fitted_vector, "ITI")
    assert probe.accuracy is not None and torch.equal(probe.sigma, fitted.probes.sigma)
    with pytest.raises(ValueError, match="not a saved ITI fit"):
        HeadProbes.from_vector(SteeringVector(torch.ones(64)), "ITI")


def test_outputs_change_and_a_row_alone_equals_the_same_row_in_a_batch(make_pipeline):
    pipeline = make_pipeline([ITI(data=PAIRS, top_k=4, alpha=8.0, prompt_format="text")])
    plain = make_pipeline([])
    kwargs = {"max_new_tokens": 8, "do_sample": False}
    batched = pipeline.generate(text=PROMPTS, **kwargs)
    assert batched != plain.generate(text=PROMPTS, **kwargs)
    assert [pipeline.generate(text=p, **kwargs) for p in PROMPTS] == batched


def test_refill_matches_static_batching(make_pipeline):
    pipeline = make_pipeline([ITI(directions=_directions(2), alpha=6.0, strength_unit="absolute")])
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    reference = pipeline.generate(messages=chats, return_output=True, max_new_tokens=6, min_new_tokens=6)
    engine = pipeline.open_refill(2)
    got, pending = {}, list(range(len(chats)))
    while pending or not engine.idle:
        while pending and engine.room:
            i = pending.pop(0)
            pipeline.admit_refill(
                engine,
                [lambda out, err, i=i: got.__setitem__(i, (out, err))],
                messages=[chats[i]],
                max_new_tokens=6,
                min_new_tokens=6,
            )
        engine.step()
    assert all(err is None for _, err in got.values())
    assert [got[i][0].output_ids[0].tolist() for i in range(3)] == [o.output_ids[0].tolist() for o in reference]


def test_check_accepts_the_engines_and_refuses_a_fit_on_a_server_naming_the_fix(make_pipeline):
    given = make_pipeline([ITI(directions=_directions(), strength_unit="absolute")], steer=False)
    fitted = make_pipeline([ITI(data=PAIRS)], steer=False)
    for kind in ("huggingface", "vllm", "vllm_serve"):
        assert given.check(kind).ok, kind
    assert fitted.check("huggingface").ok and fitted.check("vllm").ok  # vllm fits on the Hugging Face model first
    (message,) = fitted.check("vllm_serve").messages()
    assert "ITI" in message and "hidden_capture" in message and "Fix:" in message


def test_engine_edits_are_one_head_slice_addition_per_layer(tiny):
    directions = _directions(3)
    control = _steered(
        tiny, directions=directions, heads=[[1, 1], [0, 2], [1, 3]], alpha=-1.5, strength_unit="absolute"
    )
    edits = control.residual_edits()
    assert [(e.layer, e.site, e.mode, e.scope, e.last_k) for e in edits] == [
        (0, "heads", "from", "last_k", 1),
        (1, "heads", "from", "last_k", 1),
    ]
    assert edits[1].rows.shape == (1, HEADS * DIM) and edits[0].start(7) == 6  # the prompt's last token and after
    expected = torch.zeros(HEADS * DIM)
    for head in (1, 3):
        expected[head * DIM : (head + 1) * DIM] = -1.5 * directions[1, head] / directions[1, head].norm()
    assert_equal_up_to_rounding(edits[1].rows[0], expected, terms=DIM + 2)
    assert _steered(tiny, directions=directions, alpha=0.0, strength_unit="absolute").residual_edits() == ()
    with pytest.raises(RuntimeError, match=r"residual_edits called before steer\(\)"):
        ITI(directions=directions).residual_edits()


def test_args_errors_name_the_field_and_the_fix(tiny):
    with pytest.raises(ValueError, match="ITI needs exactly one of data= .* got both"):
        ITI(data=PAIRS, directions=_directions())
    with pytest.raises(ValueError, match="got neither"):
        ITI()
    with pytest.raises(ValueError, match=r"ITI.data\[1\] needs a non-empty string 'negative'"):
        ITI(data=[PAIRS[0], {"positive": "a"}])
    with pytest.raises(ValueError, match="ITI.heads must list \\[layer, head\\] pairs"):
        ITI(directions=_directions(), heads=[[0]])
    with pytest.raises(ValueError, match="lists a head twice"):
        ITI(directions=_directions(), heads=[[0, 1], [0, 1]])
    with pytest.raises(ValueError, match="ITI.layers chooses the layers probed from data=.*Fix"):
        ITI(directions=_directions(), layers=[0])
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        ITI(data=PAIRS, validation_fraction=1.0)
    with pytest.raises(TypeError, match="ITI.strength_unit must be one of"):
        ITI(data=PAIRS, strength_unit="sigma")
    with pytest.raises(ValueError, match="strength_unit='std' .* Fix: strength_unit='absolute'"):
        _steered(tiny, directions=_directions())
    with pytest.raises(ValueError, match=r"has shape \(2, 4, 8\) .* \(2, 4, 16\)"):
        _steered(tiny, directions=torch.ones(2, 4, 8), strength_unit="absolute")
    with pytest.raises(ValueError, match="head 4 of layer 0; the model has 4 heads"):
        _steered(tiny, directions=_directions(), heads=[[0, 4]], strength_unit="absolute")
    with pytest.raises(ValueError, match="layer 2 is out of range"):
        _steered(tiny, data=PAIRS, layers=[2])
    with pytest.raises(ValueError, match="needs at least 2 contrastive pairs"):
        _steered(tiny, data=PAIRS[:1])
    zero = _directions()
    zero[0, 1] = 0
    with pytest.raises(ValueError, match=r"heads names head\(s\) \[\[0, 1\]\] without a direction"):
        _steered(tiny, directions=zero, heads=[[0, 1]], strength_unit="absolute")


def test_declarations():
    assert ITI(data=PAIRS).requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert ITI(directions=_directions()).requirements() == {Capability.IN_PROCESS_TORCH}
    assert ITI.RUNTIME_KWARGS_SCHEMA == [] and ITI.supports_batching and ITI.supports_refill and ITI.adds_residual


@pytest.mark.parametrize("model_type", ["qwen2", "gemma3_text"])
def test_grouped_query_attention_families_shift_only_the_chosen_query_heads_slices(model_type):
    from steer_hydra.models.tiny import build_family_model

    model = build_family_model(model_type, head_dim=24)  # 4 query heads x 24 = 96 wide: not the hidden size
    layout = resolve_layout(model)
    assert layout.num_key_value_heads < layout.num_heads and layout.num_heads * layout.head_dim != layout.hidden_size
    directions = torch.randn(
        layout.num_layers, layout.num_heads, layout.head_dim, generator=torch.Generator().manual_seed(0)
    )
    control = ITI(directions=directions, heads=[[0, 3]], alpha=2.0, strength_unit="absolute", token_scope="all")
    control.steer(model)
    ids = torch.tensor([[3, 5, 7, 9]])
    hooks = control.get_hooks(ids, {})
    seen = {}
    o_proj = model.get_submodule(f"{layout.attention_path(0)}.o_proj")
    o_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("before", a[0].clone()))
    with contextlib.ExitStack() as stack:
        for spec in hooks["pre"]:
            handle = model.get_submodule(spec["module"]).register_forward_pre_hook(spec["hook_func"], with_kwargs=True)
            stack.callback(handle.remove)
        o_proj.register_forward_pre_hook(lambda m, a: seen.setdefault("after", a[0].clone()))
        with torch.no_grad():
            model(input_ids=ids)
    dim = layout.head_dim
    x, y = seen["before"][0], seen["after"][0]
    assert torch.equal(y[:, : 3 * dim], x[:, : 3 * dim])
    assert torch.equal(y[:, 3 * dim :], x[:, 3 * dim :] + control.residual_edits()[0].rows[0, 3 * dim :])
    assert not torch.equal(y, x)
