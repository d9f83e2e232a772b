"""LoadCheckpoint on Hugging Face: the checkpoint's weights are the ones in use (from a folder or a reference), the
base comes back bit for bit at release, a refused checkpoint leaves the base untouched, the folder's content is in
the configuration's identity, and vLLM is refused naming the fix."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.structural import LoadCheckpoint
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.capabilities import UnsupportedPipelineError
from steer_hydra.core.identity import config_digest
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.models import TinySpec, build_tiny_model

PROMPTS = ["hello there cat and dog", "what is the capital of france"]


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """The tiny model of another seed, saved: a checkpoint of the same architecture."""
    folder = tmp_path_factory.mktemp("ckpt") / "seed1"
    model, tokenizer = build_tiny_model(TinySpec(seed=1))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _greedy(pipeline) -> list[str]:
    return pipeline.generate(text=PROMPTS, max_new_tokens=8, do_sample=False)


def test_the_checkpoint_weights_are_used_and_the_base_is_restored_exactly(other):
    model, tokenizer = build_tiny_model()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    wanted, _ = build_tiny_model(TinySpec(seed=1))
    expected = _greedy(SteeringPipeline(model=wanted, tokenizer=tokenizer).steer())
    plain = _greedy(SteeringPipeline(model=build_tiny_model()[0], tokenizer=tokenizer).steer())
    control = LoadCheckpoint(checkpoint=str(other))
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    assert pipeline.model is model  # swapped in place
    assert all(torch.equal(model.state_dict()[k], v) for k, v in wanted.state_dict().items())
    assert _greedy(pipeline) == expected != plain
    assert control.vector_hash is not None and len(control.vector_hash) == 64
    pipeline.release()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base.items())
    control.cleanup()  # idempotent


def test_a_reference_loads_through_the_backend_like_the_folder(other):
    model, tokenizer = build_tiny_model()
    by_folder = _greedy(
        SteeringPipeline(model=model, tokenizer=tokenizer, controls=[LoadCheckpoint(str(other))]).steer()
    )
    model, tokenizer = build_tiny_model()
    control = LoadCheckpoint(checkpoint="steer_hydra:tiny?seed=1")
    assert _greedy(SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()) == by_folder


@pytest.mark.parametrize(
    ("spec", "match"),
    [(TinySpec(seed=1, hidden_size=32), "shape"), (TinySpec(seed=1, num_hidden_layers=3), "lacks")],
    ids=["other-width", "more-layers"],
)
def test_a_checkpoint_of_another_shape_is_refused_and_the_base_left_untouched(tmp_path, spec, match):
    wrong, _ = build_tiny_model(spec)
    wrong.save_pretrained(tmp_path / "wrong")
    model, tokenizer = build_tiny_model()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[LoadCheckpoint(str(tmp_path / "wrong"))])
    with pytest.raises(ValueError, match=match):
        pipeline.steer()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base.items())


def test_a_missing_parameter_and_another_architecture_setting_are_refused(tmp_path, other):
    import json

    from safetensors.torch import load_file, save_file

    partial = tmp_path / "partial"
    partial.mkdir()
    tensors = load_file(other / "model.safetensors")
    del tensors["model.norm.weight"]
    save_file(tensors, partial / "model.safetensors")
    model, tokenizer = build_tiny_model()
    with pytest.raises(ValueError, match=r"lacks 1 of the model's parameters.*model\.norm\.weight"):
        SteeringPipeline(model=model, tokenizer=tokenizer, controls=[LoadCheckpoint(str(partial))]).steer()
    eps = tmp_path / "eps"
    eps.mkdir()
    save_file(load_file(other / "model.safetensors"), eps / "model.safetensors")
    config = json.loads((other / "config.json").read_text())
    (eps / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.1}))
    with pytest.raises(ValueError, match="rms_norm_eps"):
        SteeringPipeline(model=model, tokenizer=tokenizer, controls=[LoadCheckpoint(str(eps))]).steer()


def test_the_folder_content_is_in_the_config_id(tmp_path):
    model, _ = build_tiny_model(TinySpec(seed=1))
    model.save_pretrained(tmp_path / "ckpt")
    first = config_digest(config_descriptor_from_controls([LoadCheckpoint(str(tmp_path / "ckpt"))]))
    assert config_digest(config_descriptor_from_controls([LoadCheckpoint(str(tmp_path / "ckpt"))])) == first
    with torch.no_grad():
        model.model.norm.weight[0] += 1
    model.save_pretrained(tmp_path / "ckpt")
    assert config_digest(config_descriptor_from_controls([LoadCheckpoint(str(tmp_path / "ckpt"))])) != first


def test_vllm_is_refused_naming_the_model_option(other):
    pipeline = SteeringPipeline("steer_hydra:tiny", controls=[LoadCheckpoint(str(other))], backend="vllm")
    report = pipeline.check()
    assert not report.ok and any("model.model_name_or_path" in m for m in report.messages())
    with pytest.raises(UnsupportedPipelineError):
        pipeline.steer()
    with pytest.raises(ValueError, match="checkpoint"):
        LoadCheckpoint(checkpoint=" ")


def test_a_shared_base_is_used_and_left_unchanged(other):
    from steer_hydra.core.sweeps import PipelineFactory

    factory = PipelineFactory("steer_hydra:tiny")
    control = LoadCheckpoint(checkpoint=str(other))
    assert factory.uses_shared_base([control])
    with factory.steered([]) as pipeline:
        base = pipeline.model
        plain = _greedy(pipeline)
    fingerprint = factory.shared_base_fingerprint
    with factory.steered([control]) as pipeline:
        assert pipeline.model is base and _greedy(pipeline) != plain
    with factory.steered([]) as pipeline:  # the tripwire kept the base: it came back bit for bit
        assert pipeline.model is base and _greedy(pipeline) == plain
    assert factory.shared_base_fingerprint == fingerprint
    factory.release()
