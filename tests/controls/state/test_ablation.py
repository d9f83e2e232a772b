"""DirectionalAblation: h.r = 0 in every ablated stream (layer input, attention output, layer output), only at the
chosen layers and scoped positions; CAA's fit and random direction; rows independent; refill; the engine edits."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.state import CAA, DirectionalAblation, SteeringVector
from steer_hydra.core import Capability, SteeringPipeline

PROMPTS = ["the capital of france is", "hello", "count one two three four five"]
PAIRS = [
    {"prompt": "are you kind", "positive": " yes", "negative": " no"},
    {"prompt": "is the sky blue", "positive": " true", "negative": " false"},
    {"prompt": "do you love cats", "positive": " love", "negative": " hate"},
]
SEQUENCE = torch.tensor([[1, 50, 60, 70, 80, 90, 100, 110, 120]])  # a 6-token prompt + 3 "generated" tokens
TOL = 1e-5


def _direction(seed=3):
    vector = torch.randn(64, generator=torch.Generator().manual_seed(seed))
    return vector / vector.norm()


def _streams(model, record_inputs, apply_hooks, hooks=None, ids=SEQUENCE):
    """The residual stream before each layer, after each attention block, and before the final norm, by name."""
    sites = {"final": "model.norm"}
    for layer in range(2):
        sites[f"pre{layer}"] = f"model.layers.{layer}.input_layernorm"
        sites[f"mid{layer}"] = f"model.layers.{layer}.post_attention_layernorm"
    with torch.no_grad(), apply_hooks(model, hooks or {}):
        recorders = {}
        with (
            record_inputs(model.get_submodule(sites["pre0"])) as recorders["pre0"],
            record_inputs(model.get_submodule(sites["mid0"])) as recorders["mid0"],
            record_inputs(model.get_submodule(sites["pre1"])) as recorders["pre1"],
            record_inputs(model.get_submodule(sites["mid1"])) as recorders["mid1"],
            record_inputs(model.get_submodule(sites["final"])) as recorders["final"],
        ):
            model(input_ids=ids)
    return {name: recorder.inputs[0][0] for name, recorder in recorders.items()}


def _ablated(tiny, **kwargs):
    model, tokenizer = tiny
    control = DirectionalAblation(**kwargs)
    control.steer(model, tokenizer=tokenizer)
    return control


def test_every_stream_at_every_layer_loses_its_component_along_r(tiny, record_inputs, apply_hooks):
    model, _ = tiny
    r = _direction()
    control = _ablated(tiny, direction_vector=r * 5)
    torch.testing.assert_close(control.vector.tensor, r)  # the given vector's direction, unit length
    plain = _streams(model, record_inputs, apply_hooks)
    hooks = control.get_hooks(SEQUENCE[:, :6], {}, attention_mask=torch.ones(1, 6, dtype=torch.long))
    ablated = _streams(model, record_inputs, apply_hooks, hooks)
    for name in plain:
        assert float((plain[name] @ r).abs().max()) > 0.05, name  # there is a component to remove
        assert float((ablated[name] @ r).abs().max()) < TOL, name  # and it is gone, at every position
    # the first ablated stream is exactly the plain one minus its projection on r (the rest is kept)
    torch.testing.assert_close(ablated["pre0"], plain["pre0"] - (plain["pre0"] @ r)[:, None] * r)
    # the later streams differ by more than that projection: the ablation propagates
    later = plain["final"] - (plain["final"] @ r)[:, None] * r
    assert not torch.allclose(ablated["final"], later, atol=1e-3)


def test_chosen_layers_only_touch_those_layers(tiny, record_inputs, apply_hooks):
    model, _ = tiny
    r = _direction()
    plain = _streams(model, record_inputs, apply_hooks)
    prompt = SEQUENCE[:, :6]

    second = _ablated(tiny, direction_vector=r, layers=[1])
    hooks = second.get_hooks(prompt, {})
    assert [len(hooks["pre"]), len(hooks["forward"])] == [1, 2] and second.ablated_layers == (1,)
    seen = _streams(model, record_inputs, apply_hooks, hooks)
    assert torch.equal(seen["pre0"], plain["pre0"]) and torch.equal(seen["mid0"], plain["mid0"])  # layer 0 as is
    torch.testing.assert_close(seen["pre1"], plain["pre1"] - (plain["pre1"] @ r)[:, None] * r)  # its own input
    assert all(float((seen[name] @ r).abs().max()) < TOL for name in ("pre1", "mid1", "final"))

    first = _ablated(tiny, direction_vector=r, layers=[0])
    seen = _streams(model, record_inputs, apply_hooks, first.get_hooks(prompt, {}))
    assert all(float((seen[name] @ r).abs().max()) < TOL for name in ("pre0", "mid0", "pre1"))
    assert float((seen["mid1"] @ r).abs().max()) > 0.05  # layer 1's attention writes along r again, untouched


@pytest.mark.parametrize(("scope", "last_k", "first_ablated"), [("after_prompt", None, 6), ("last_k", 2, 4)])
def test_token_scope_leaves_earlier_positions_alone(tiny, record_inputs, apply_hooks, scope, last_k, first_ablated):
    model, _ = tiny
    r = _direction()
    control = _ablated(tiny, direction_vector=r, token_scope=scope, last_k=last_k)
    plain = _streams(model, record_inputs, apply_hooks)
    seen = _streams(model, record_inputs, apply_hooks, control.get_hooks(SEQUENCE[:, :6], {}))
    for name in plain:
        assert torch.equal(seen[name][:first_ablated], plain[name][:first_ablated]), name
        assert float((seen[name][first_ablated:] @ r).abs().max()) < TOL, name


def test_generation_with_a_kv_cache_ablates_the_decoded_positions_only_after_the_prompt(make_pipeline, record_inputs):
    r = _direction()
    control = DirectionalAblation(direction_vector=r, token_scope="after_prompt")
    runs = {}
    for name, pipeline in (("ablated", make_pipeline([control])), ("plain", make_pipeline([]))):
        with record_inputs(pipeline.model.get_submodule("model.norm")) as recorder:
            pipeline.generate(text=PROMPTS, max_new_tokens=4)
        runs[name] = recorder.inputs
    ablated, plain = runs["ablated"], runs["plain"]
    assert torch.equal(ablated[0], plain[0])  # the prefill: the left-padded prompts, untouched
    assert all(step.shape[1] == 1 for step in ablated[1:])  # decode steps read the KV cache
    assert float((plain[1] @ r).abs().max()) > 0.05
    assert all(float((step @ r).abs().max()) < TOL for step in ablated[1:])


def test_outputs_change_and_a_row_alone_equals_the_same_row_in_a_batch(make_pipeline):
    ablated = make_pipeline([DirectionalAblation(data=PAIRS, prompt_format="text")])
    plain = make_pipeline([])
    kwargs = {"max_new_tokens": 8, "do_sample": False}
    batched = ablated.generate(text=PROMPTS, return_output=True, **kwargs)
    unsteered = plain.generate(text=PROMPTS, return_output=True, **kwargs)
    pad = ablated.tokenizer.pad_token_id

    def ids(output):
        row = output.output_ids[0].tolist()
        while row and row[-1] == pad:
            row.pop()
        return row

    assert [ids(o) for o in batched] != [ids(o) for o in unsteered]
    for prompt, in_batch in zip(PROMPTS, batched, strict=True):
        assert ids(ablated.generate(text=prompt, return_output=True, **kwargs)) == ids(in_batch)
    assert ablated.supports_batching is True


def test_fitted_direction_is_caas_vector_at_unit_length(tiny):
    model, tokenizer = tiny
    for layer_id in (None, 0):
        control = _ablated(tiny, data=PAIRS, layer_id=layer_id, prompt_format="text", accumulate="completion")
        caa = CAA(data=PAIRS, layer_id=layer_id, prompt_format="text", accumulate="completion")
        caa.steer(model, tokenizer=tokenizer)
        torch.testing.assert_close(control.vector.tensor, caa.vector.tensor / caa.vector.tensor.norm())
        assert control.vector.layer == caa.layer == (1 if layer_id is None else 0)  # CAA's default fit layer
        assert control.vector_hash == control.vector.content_hash
    assert control.ablated_layers == (0, 1)  # fitted at one layer, ablated at every layer


def test_random_direction_is_unit_seeded_as_caas_and_differs_from_the_fitted_one(tiny):
    model, tokenizer = tiny
    fitted = _ablated(tiny, data=PAIRS, layer_id=0)
    random = _ablated(tiny, data=PAIRS, layer_id=0, direction="random", direction_seed=5)
    again = _ablated(tiny, data=PAIRS, layer_id=0, direction="random", direction_seed=5)
    other = _ablated(tiny, data=PAIRS, layer_id=0, direction="random", direction_seed=6)
    assert float(random.vector.tensor.norm()) == pytest.approx(1.0, abs=1e-6)
    assert abs(float(random.vector.tensor @ fitted.vector.tensor)) < 0.5  # |cos| of random 64-d pairs is ~0.1
    assert torch.equal(random.vector.tensor, again.vector.tensor) and random.vector_hash == again.vector_hash
    assert not torch.allclose(random.vector.tensor, other.vector.tensor)
    caa = CAA(data=PAIRS, layer_id=0, direction="random", direction_seed=5)
    caa.steer(model, tokenizer=tokenizer)
    torch.testing.assert_close(random.vector.tensor, caa.vector.tensor / caa.vector.tensor.norm())
    assert random.vector.metadata["direction"] == "random" and random.vector.metadata["direction_seed"] == 5


def test_a_saved_vector_file_loads(tiny, tmp_path):
    vector = _direction(seed=8) * 3
    path = SteeringVector(vector, layer=1, metadata={"source": "test"}).save(tmp_path / "r.safetensors")
    control = _ablated(tiny, direction_vector=str(path))
    torch.testing.assert_close(control.vector.tensor, vector / vector.norm())
    assert control.vector.layer == 1 and control.vector.metadata["source"] == "test"
    assert control.requirements() == {Capability.IN_PROCESS_TORCH}
    one_row = _ablated(tiny, direction_vector=vector[None])  # a [1, hidden] block is one direction
    torch.testing.assert_close(one_row.vector.tensor, control.vector.tensor)


def test_check_accepts_the_engines_and_refuses_a_fit_on_a_server_naming_the_fix(make_pipeline):
    given = make_pipeline([DirectionalAblation(direction_vector=_direction())], steer=False)
    fitted = make_pipeline([DirectionalAblation(data=PAIRS)], steer=False)
    for kind in ("huggingface", "vllm", "vllm_serve"):
        assert given.check(kind).ok, kind
    assert fitted.check("huggingface").ok and fitted.check("vllm").ok  # vllm fits on the Hugging Face model first
    report = fitted.check("vllm_serve")
    (message,) = report.messages()
    assert "DirectionalAblation" in message and "hidden_capture" in message and "Fix:" in message


def test_engine_edits_are_the_hooks_projections_per_stream_and_scope(tiny):
    r = _direction()
    control = _ablated(tiny, direction_vector=r, layers=[0, 1])
    edits = control.residual_edits()
    # layer 1's input is layer 0's (ablated) output: not edited twice
    assert [(e.layer, e.site, e.mode) for e in edits] == [
        (0, "input", "project"), (0, "attention", "project"), (0, "output", "project"),
        (1, "attention", "project"), (1, "output", "project"),
    ]  # fmt: skip
    for edit in edits:
        torch.testing.assert_close(edit.rows, r[None])
        assert edit.start(7) == 0
    only_one = _ablated(tiny, direction_vector=r, layers=[1], token_scope="last_k", last_k=2)
    assert [(e.layer, e.site) for e in only_one.residual_edits()] == [(1, "input"), (1, "attention"), (1, "output")]
    assert {e.start(7) for e in only_one.residual_edits()} == {5}
    after = _ablated(tiny, direction_vector=r, layers=[0], token_scope="after_prompt")
    assert {e.start(7) for e in after.residual_edits()} == {7}
    with pytest.raises(RuntimeError, match=r"residual_edits called before steer\(\)"):
        DirectionalAblation(direction_vector=r).residual_edits()


def test_hooks_live_only_during_a_call_and_release_leaves_the_model_unsteered(make_pipeline, count_hooks):
    reference = make_pipeline([])
    expected = reference.generate(text=PROMPTS, max_new_tokens=6)
    pipeline = make_pipeline([DirectionalAblation(direction_vector=_direction())])
    model, tokenizer = pipeline.model, pipeline.tokenizer
    seen = []
    handle = model.get_submodule("model.norm").register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(count_hooks(model) - 1), with_kwargs=True
    )
    try:
        ablated = pipeline.generate(text=PROMPTS, max_new_tokens=6)
    finally:
        handle.remove()
    assert seen[0] == 6  # per layer: a pre-hook, the attention output and the layer output
    assert ablated != expected and count_hooks(model) == 0
    pipeline.release()
    assert count_hooks(model) == 0
    after = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[]).steer()
    try:
        assert after.generate(text=PROMPTS, max_new_tokens=6) == expected
    finally:
        after.release()


def test_refill_matches_static_batching(make_pipeline):
    control = DirectionalAblation(direction_vector=_direction(), token_scope="after_prompt")
    pipeline = make_pipeline([control])
    prompts, limits = [*PROMPTS, "where is the city of paris"], [9, 4, 12, 6]
    chats = [[{"role": "user", "content": p}] for p in prompts]
    pad = pipeline.tokenizer.pad_token_id
    reference = []
    for output, limit in zip(
        pipeline.generate(messages=chats, return_output=True, max_new_tokens=max(limits), do_sample=False),
        limits,
        strict=True,
    ):
        row = output.output_ids[0].tolist()[:limit]
        while row and row[-1] == pad:
            row.pop()
        reference.append(row)
    engine = pipeline.open_refill(2)
    got, pending = {}, list(range(len(prompts)))

    def done(i):
        def record(output, error):
            assert error is None, error
            got[i] = output.output_ids[0].tolist()

        return record

    while pending or not engine.idle:
        while pending and engine.room:
            i = pending.pop(0)
            pipeline.admit_refill(
                engine,
                [done(i)],
                messages=[chats[i]],
                row_max_new_tokens=[limits[i]],
                max_new_tokens=max(limits),
                do_sample=False,
            )
        engine.step()
    assert [got[i] for i in range(len(prompts))] == reference
    control.enabled = False
    unsteered = pipeline.generate(messages=chats, return_output=True, max_new_tokens=max(limits), do_sample=False)
    assert [o.output_ids[0].tolist()[: len(r)] for o, r in zip(unsteered, reference, strict=True)] != reference


def test_args_errors_name_the_field(tiny):
    with pytest.raises(ValueError, match="exactly one of direction_vector= .* got both"):
        DirectionalAblation(direction_vector=_direction(), data=PAIRS)
    with pytest.raises(ValueError, match="got neither"):
        DirectionalAblation()
    with pytest.raises(ValueError, match=r"DirectionalAblation.data\[1\] needs a non-empty string 'negative'"):
        DirectionalAblation(data=[PAIRS[0], {"positive": "a"}])
    with pytest.raises(ValueError, match="layer_id=1 is the layer a direction is fitted at.*Fix: drop layer_id"):
        DirectionalAblation(direction_vector=_direction(), layer_id=1)
    for layers in ([], [-1]):
        with pytest.raises(ValueError, match="DirectionalAblation.layers must list decoder layer indices >= 0"):
            DirectionalAblation(direction_vector=_direction(), layers=layers)
    with pytest.raises(ValueError, match="lists a layer twice"):
        DirectionalAblation(direction_vector=_direction(), layers=[1, 1])
    with pytest.raises(ValueError, match="DirectionalAblation.last_k must be an int >= 1"):
        DirectionalAblation(direction_vector=_direction(), token_scope="last_k")
    with pytest.raises(ValueError, match="last_k=3 is only used with token_scope='last_k'"):
        DirectionalAblation(direction_vector=_direction(), last_k=3)
    with pytest.raises(TypeError, match="DirectionalAblation.direction must be one of"):
        DirectionalAblation(direction_vector=_direction(), direction="negated")  # the same projection as r
    with pytest.raises(ValueError, match="layer 2 is out of range; the model has 2 layers"):
        _ablated(tiny, direction_vector=_direction(), layers=[0, 2])
    with pytest.raises(ValueError, match="layer 5 is out of range"):
        _ablated(tiny, data=PAIRS, layer_id=5)
    with pytest.raises(ValueError, match="has width 32 but the model's hidden size is 64"):
        _ablated(tiny, direction_vector=torch.ones(32))
    with pytest.raises(ValueError, match=r"one direction \[hidden\]; got shape \(3, 64\)"):
        _ablated(tiny, direction_vector=torch.ones(3, 64))
    with pytest.raises(ValueError, match="zero norm"):
        _ablated(tiny, direction_vector=torch.zeros(64))
    with pytest.raises(RuntimeError, match="before steer"):
        DirectionalAblation(direction_vector=_direction()).get_hooks(SEQUENCE, {})


def test_declarations():
    assert DirectionalAblation(data=PAIRS).requirements() == {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
    assert DirectionalAblation(direction_vector=_direction()).requirements() == {Capability.IN_PROCESS_TORCH}
    assert DirectionalAblation.RUNTIME_KWARGS_SCHEMA == []
    assert DirectionalAblation.supports_batching and DirectionalAblation.supports_refill
    assert DirectionalAblation.adds_residual  # fixed projections: lowered into the vLLM engine
