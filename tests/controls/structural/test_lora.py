"""LoRAAdapter on Hugging Face: the adapter acts, merged = unmerged, rows independent of batching, refill, an exact
restore of a preloaded base at release, content identity, Args errors, mismatch refusals, and check() verdicts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from steer_hydra.controls.structural import LoRAAdapter, adapter_digest
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import UnsupportedPipelineError
from steer_hydra.core.identity import config_digest
from steer_hydra.core.specs import ControlSpec
from steer_hydra.core.sweeps import config_descriptor_from_controls, config_descriptor_from_specs
from steer_hydra.models import TINY_REF, TinySpec, build_tiny_model

PROMPTS = ["hello there cat and dog", "a", "what is the capital of france"]
GREEDY = {"max_new_tokens": 8, "do_sample": False}


def save_adapter(folder, *, seed: int = 0, spec: TinySpec = TinySpec(), **config) -> str:
    """A random rank-4 LoRA on q_proj and v_proj of the tiny model (nothing trained), saved to `folder`."""
    from peft import LoraConfig, get_peft_model

    model, _ = build_tiny_model(spec)
    settings = {"r": 4, "target_modules": ["q_proj", "v_proj"], "init_lora_weights": False, **config}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, LoraConfig(**settings))
    peft_model.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory) -> str:
    return save_adapter(tmp_path_factory.mktemp("lora") / "adapter")


def _ids(output, pad: int) -> list[int]:
    row = output.output_ids[0].tolist()
    while row and row[-1] == pad:
        row.pop()
    return row


def _rows(pipeline, prompts=PROMPTS) -> list[list[int]]:
    pad = pipeline.tokenizer.pad_token_id
    return [_ids(o, pad) for o in pipeline.generate(text=prompts, return_output=True, **GREEDY)]


def test_adapter_changes_greedy_outputs_and_merged_equals_unmerged(make_pipeline, adapter):
    plain = _rows(make_pipeline([]))
    merged = _rows(make_pipeline([LoRAAdapter(adapter=adapter, merge=True)]))
    unmerged = _rows(make_pipeline([LoRAAdapter(adapter=adapter, merge=False)]))
    assert merged != plain and sum(a != b for a, b in zip(merged, plain, strict=True)) >= 2
    assert merged == unmerged


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_a_row_alone_equals_the_same_row_in_a_padded_batch(make_pipeline, adapter, merge):
    pipeline = make_pipeline([LoRAAdapter(adapter=adapter, merge=merge)])
    pad = pipeline.tokenizer.pad_token_id
    batched = pipeline.generate(text=PROMPTS, return_output=True, **GREEDY)
    assert (pipeline.tokenizer(PROMPTS, padding=True, return_tensors="pt")["attention_mask"] == 0).any()
    for prompt, in_batch in zip(PROMPTS, batched, strict=True):
        assert _ids(pipeline.generate(text=prompt, return_output=True, **GREEDY), pad) == _ids(in_batch, pad)
    assert pipeline.supports_batching is True


def _logits(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).logits


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_release_restores_a_preloaded_base_exactly(adapter, merge):
    model, tokenizer = build_tiny_model()
    model.lm_head.weight.requires_grad_(False)  # a caller's trainable flags come back too (peft freezes them)
    before = _logits(model, tokenizer)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modules = {name: type(m) for name, m in model.named_modules()}
    attributes, flags = set(model.__dict__), {n: p.requires_grad for n, p in model.named_parameters()}
    control = LoRAAdapter(adapter=adapter, merge=merge)
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    assert pipeline.model is model  # adapted in place: module paths (hooks) and the refill engine see it
    assert not torch.equal(_logits(model, tokenizer), before)
    pipeline.release()
    assert torch.equal(_logits(model, tokenizer), before)
    after = model.state_dict()
    assert list(after) == list(state) and all(torch.equal(after[k], v) for k, v in state.items())
    assert {name: type(m) for name, m in model.named_modules()} == modules
    assert set(model.__dict__) == attributes, set(model.__dict__) ^ attributes
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags
    control.cleanup()  # idempotent
    again = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()  # steers again
    assert not torch.equal(_logits(model, tokenizer), before)
    again.release()
    assert torch.equal(_logits(model, tokenizer), before)


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "unmerged"])
def test_refill_decodes_as_static_batching(make_pipeline, adapter, merge):
    pipeline = make_pipeline([LoRAAdapter(adapter=adapter, merge=merge)])
    prompts, limits = [*PROMPTS, "where is the city of paris"], [9, 4, 12, 6]
    chats = [[{"role": "user", "content": p}] for p in prompts]
    pad = pipeline.tokenizer.pad_token_id
    static = pipeline.generate(messages=chats, return_output=True, max_new_tokens=max(limits), do_sample=False)
    reference = []
    for output, limit in zip(static, limits, strict=True):
        row = output.output_ids[0].tolist()[:limit]
        while row and row[-1] == pad:
            row.pop()
        reference.append(row)
    assert pipeline.refill_blockers() == []
    engine, got, pending = pipeline.open_refill(2), {}, list(range(len(prompts)))

    def done(i):
        def record(output, error):
            assert error is None, error
            got[i] = output.output_ids[0].tolist()

        return record

    while pending or not engine.idle:
        while pending and engine.room:
            i = pending.pop(0)
            pipeline.admit_refill(
                engine, [done(i)], messages=[chats[i]], row_max_new_tokens=[limits[i]], max_new_tokens=max(limits)
            )
        engine.step()
    assert [got[i] for i in range(len(prompts))] == reference
    plain = make_pipeline([]).generate(messages=chats, return_output=True, max_new_tokens=max(limits))
    assert [_ids(o, pad)[: len(r)] for o, r in zip(plain, reference, strict=True)] != reference


def test_identity_follows_the_adapter_content(tmp_path, adapter):
    folder = shutil.copytree(adapter, tmp_path / "copy")
    control = LoRAAdapter(adapter=str(folder))
    digest = control.adapter_sha256
    assert digest == adapter_digest(adapter) and len(digest) == 64  # the same files, another folder: same content
    assert control.vector_hash == digest and control.adapter_name == f"lora-{digest[:12]}"
    assert control.descriptor()["adapter_sha256"] == digest
    config_id = config_digest(config_descriptor_from_controls([control]))
    save_adapter(folder, seed=1)  # new weights in the same folder
    changed = LoRAAdapter(adapter=str(folder))
    assert changed.adapter_sha256 != digest and control.adapter_sha256 == changed.adapter_sha256
    assert config_digest(config_descriptor_from_controls([changed])) != config_id
    # a ControlSpec sweep names the folder before building any control: its id follows the content too
    spec = [ControlSpec(LoRAAdapter, params={"adapter": str(folder)})]
    spec_id = config_digest(config_descriptor_from_specs(spec, [{}]))
    save_adapter(folder, seed=2)
    assert config_digest(config_descriptor_from_specs(spec, [{}])) != spec_id
    save_adapter(folder, seed=1)
    assert config_digest(config_descriptor_from_specs(spec, [{}])) == spec_id
    assert LoRAAdapter(adapter=str(folder), name="mine").adapter_name == "mine"
    artifact = changed.export_lora()
    assert (artifact.name, artifact.path, artifact.rank, artifact.use_dora) == (
        changed.adapter_name,
        str(folder.resolve()),
        4,
        False,
    )
    assert artifact.int_id > 0


def _edited(tmp_path, adapter, **changes) -> str:
    folder = shutil.copytree(adapter, tmp_path / "edited")
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    return str(folder)


@pytest.mark.parametrize(
    ("make_kwargs", "error", "match"),
    [
        (lambda t, a: {"adapter": str(t / "nowhere")}, ValueError, r"LoRAAdapter.adapter must be an existing folder"),
        (lambda t, a: {"adapter": ""}, ValueError, r"LoRAAdapter.adapter must be an existing folder.*Fix:"),
        (lambda t, a: {"adapter": str(t)}, ValueError, r"holds no adapter_config.json\. Fix: point adapter"),
        (
            lambda t, a: {"adapter": _edited(t, a, peft_type="IA3")},
            ValueError,
            r"is a 'IA3' adapter, not LoRA\. Fix:",
        ),
        (
            lambda t, a: {"adapter": _edited(t, a, modules_to_save=["lm_head"])},
            ValueError,
            r"modules_to_save.*Fix:",
        ),
        (lambda t, a: {"adapter": a, "name": "a=b"}, ValueError, r"LoRAAdapter.name must be .*Fix:"),
        (lambda t, a: {"adapter": a, "merge": "yes"}, TypeError, r"LoRAAdapter.merge must be bool"),
        (lambda t, a: {"adapter": 3}, TypeError, r"LoRAAdapter.adapter must be"),
    ],
)
def test_invalid_args_are_refused_naming_the_field(tmp_path, adapter, make_kwargs, error, match):
    with pytest.raises(error, match=match):
        LoRAAdapter(**make_kwargs(tmp_path, adapter))


def test_missing_weights_are_refused(tmp_path, adapter):
    folder = shutil.copytree(adapter, tmp_path / "no_weights")
    (folder / "adapter_model.safetensors").unlink()
    with pytest.raises(ValueError, match=r"holds no adapter_model.safetensors\. Fix:"):
        LoRAAdapter(adapter=str(folder))


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (TinySpec(hidden_size=32), r"lora_A weight for 'model.layers.0.self_attn.q_proj' has shape \[4, 64\].*32\]"),
        (TinySpec(num_hidden_layers=1), r"adapts module 'model.layers.1.self_attn.(q|v)_proj', which this model"),
    ],
    ids=["shapes", "modules"],
)
def test_an_adapter_for_another_model_is_refused_and_leaves_the_model_untouched(adapter, spec, match):
    model, tokenizer = build_tiny_model(spec)
    before = _logits(model, tokenizer)
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[LoRAAdapter(adapter=adapter)])
    with pytest.raises(ValueError, match=match + r".*Fix: use the adapter's base model"):
        pipeline.steer()
    assert not pipeline.is_steered
    assert not any(hasattr(m, "lora_A") for m in model.modules())
    assert torch.equal(_logits(model, tokenizer), before)


def test_two_adapters_in_one_pipeline_are_refused(adapter):
    model, tokenizer = build_tiny_model()
    before = _logits(model, tokenizer)
    controls = [LoRAAdapter(adapter=adapter), LoRAAdapter(adapter=adapter, merge=False)]
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=controls)
    with pytest.raises(ValueError, match=r"already carries LoRA layers.*Fix: one LoRAAdapter per arm"):
        pipeline.steer()
    controls[0].cleanup()  # a failed steer() runs no cleanup; the applied adapter undoes itself here
    assert torch.equal(_logits(model, tokenizer), before)


def test_steer_needs_the_live_model(adapter):
    with pytest.raises(RuntimeError, match="LoRAAdapter needs the live model"):
        LoRAAdapter(adapter=adapter).steer(None)


def test_check_accepts_every_backend_and_refuses_dora_on_vllm(tmp_path, adapter):
    for backend in ("huggingface", "vllm", "vllm_serve"):
        pipeline = SteeringPipeline(TINY_REF, controls=[LoRAAdapter(adapter=adapter)], backend=backend)
        assert pipeline.check().ok, pipeline.check()
    dora = LoRAAdapter(adapter=save_adapter(tmp_path / "dora", use_dora=True))
    assert SteeringPipeline(TINY_REF, controls=[dora]).check().ok
    pipeline = SteeringPipeline(TINY_REF, controls=[dora], backend="vllm")
    (failure,) = pipeline.check().failures
    assert failure.control == "LoRAAdapter" and "DoRA" in failure.message
    assert "Fix: use backend=huggingface" in failure.message
    with pytest.raises(UnsupportedPipelineError, match="DoRA"):
        pipeline.steer()


def test_a_dora_adapter_runs_on_hugging_face_and_restores(tmp_path):
    model, tokenizer = build_tiny_model()
    before = _logits(model, tokenizer)
    control = LoRAAdapter(adapter=save_adapter(tmp_path / "dora", use_dora=True))
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    assert not torch.equal(_logits(model, tokenizer), before)
    pipeline.release()
    assert torch.equal(_logits(model, tokenizer), before)
