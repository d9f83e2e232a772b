"""ModelMerge (mergekit) on Hugging Face: linear equals the hand computation, SLERP and TIES meet their boundary cases,
a merge is built once per content digest and reused, an interrupted build leaves no cache entry, the inputs'
content is in the configuration's identity, and the base is restored exactly at release."""

from __future__ import annotations

import pytest
import torch

from steer_hydra.controls.structural import ModelMerge
from steer_hydra.controls.structural.artifacts import cache_root
from steer_hydra.core import SteeringPipeline
from steer_hydra.core.identity import config_digest
from steer_hydra.core.sweeps import config_descriptor_from_controls
from steer_hydra.models import TinySpec, build_tiny_model

pytest.importorskip("mergekit")
pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning:mergekit.*"),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Three tiny checkpoints of one architecture (seeds 0, 1, 2), saved with their tokenizer."""
    root = tmp_path_factory.mktemp("merge_inputs")
    out = {}
    for seed in (0, 1, 2):
        model, tokenizer = build_tiny_model(TinySpec(seed=seed))
        model.save_pretrained(root / f"s{seed}")
        tokenizer.save_pretrained(root / f"s{seed}")
        out[seed] = root / f"s{seed}"
    return out


def _state(seed: int) -> dict[str, torch.Tensor]:
    return build_tiny_model(TinySpec(seed=seed))[0].state_dict()


def _steered(control, cache):
    model, tokenizer = build_tiny_model()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[control]).steer()
    return pipeline, model, base


def test_linear_merge_equals_the_hand_computation_and_is_reused(folders, tmp_path):
    merge = ModelMerge(
        method="linear",
        models=[{"model": str(folders[0]), "weight": 0.7}, {"model": str(folders[1]), "weight": 0.3}],
        cache_dir=str(tmp_path),
    )
    pipeline, model, base = _steered(merge, tmp_path)
    a, b = _state(0), _state(1)
    merged = model.state_dict()
    for name, tensor in a.items():
        expected = (0.7 * tensor + 0.3 * b[name]) / (0.7 + 0.3)
        # float32 arithmetic in two orders: a few ulps of the largest magnitude
        tol = 4 * torch.finfo(torch.float32).eps * float(expected.abs().max())
        assert torch.allclose(merged[name], expected, rtol=0, atol=tol), name
    assert merge.built and merge.merged_path.parent == cache_root(str(tmp_path)) / "merges"
    pipeline.release()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in base.items())  # bit-exact restore
    again = ModelMerge(**merge.arg_values())
    pipeline, _, _ = _steered(again, tmp_path)
    assert not again.built and again.merged_path == merge.merged_path and again.vector_hash == merge.vector_hash
    pipeline.release()


def test_slerp_at_t_zero_is_the_base_and_ties_of_one_full_task_vector_is_that_model(folders, tmp_path):
    slerp = ModelMerge(
        method="slerp",
        base_model=str(folders[0]),
        models=[{"model": str(folders[0])}, {"model": str(folders[1])}],
        parameters={"t": 0.0},
        cache_dir=str(tmp_path),
    )
    pipeline, model, _ = _steered(slerp, tmp_path)
    for name, tensor in _state(0).items():
        assert torch.allclose(model.state_dict()[name], tensor, rtol=0, atol=1e-6), name
    pipeline.release()
    ties = ModelMerge(
        method="ties",
        base_model=str(folders[0]),
        models=[{"model": str(folders[2]), "weight": 1.0, "density": 1.0}],
        cache_dir=str(tmp_path),
    )
    pipeline, model, _ = _steered(ties, tmp_path)
    target = _state(2)
    for name, tensor in target.items():  # base + (model - base): rounding of one add and one subtract
        tol = 4 * torch.finfo(torch.float32).eps * float(tensor.abs().max() + _state(0)[name].abs().max())
        assert torch.allclose(model.state_dict()[name], tensor, rtol=0, atol=tol), name
    pipeline.release()
    half = ModelMerge(
        method="ties",
        base_model=str(folders[0]),
        models=[
            {"model": str(folders[1]), "weight": 0.5, "density": 0.5},
            {"model": str(folders[2]), "weight": 0.5, "density": 0.5},
        ],
        cache_dir=str(tmp_path),
    )
    pipeline, model, _ = _steered(half, tmp_path)
    merged = model.state_dict()["model.layers.0.mlp.up_proj.weight"]
    assert not any(torch.equal(merged, _state(s)["model.layers.0.mlp.up_proj.weight"]) for s in (0, 1, 2))
    pipeline.release()


def test_an_interrupted_merge_leaves_no_cache_entry(folders, tmp_path, monkeypatch):
    import mergekit.merge

    def dies(config, out_path, options, **kwargs):
        (tmp_path / "marker").write_text("started")
        with open(f"{out_path}/model.safetensors", "wb") as handle:
            handle.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(mergekit.merge, "run_merge", dies)
    merge = ModelMerge(
        method="linear",
        models=[{"model": str(folders[0]), "weight": 1.0}, {"model": str(folders[1]), "weight": 1.0}],
        cache_dir=str(tmp_path),
    )
    model, tokenizer = build_tiny_model()
    with pytest.raises(KeyboardInterrupt):
        SteeringPipeline(model=model, tokenizer=tokenizer, controls=[merge]).steer()
    assert (tmp_path / "marker").is_file()
    assert [p.name for p in (tmp_path / "merges").iterdir() if not p.name.startswith(".")] == []
    monkeypatch.undo()
    pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=[ModelMerge(**merge.arg_values())]).steer()
    assert pipeline.controls[0].built
    pipeline.release()


def test_inputs_content_is_in_the_config_id_and_args_are_checked(folders, tmp_path):
    model, _ = build_tiny_model(TinySpec(seed=1))
    model.save_pretrained(tmp_path / "b")

    def config_id() -> str:
        merge = ModelMerge(
            method="linear",
            models=[{"model": str(folders[0]), "weight": 1}, {"model": str(tmp_path / "b"), "weight": 1}],
        )
        return config_digest(config_descriptor_from_controls([merge]))

    first = config_id()
    assert config_id() == first
    with torch.no_grad():
        model.model.norm.weight[0] += 1
    model.save_pretrained(tmp_path / "b")
    assert config_id() != first
    with pytest.raises(ValueError, match="base_model"):
        ModelMerge(method="ties", models=[{"model": "a"}])
    with pytest.raises(ValueError, match="weight"):
        ModelMerge(method="linear", models=[{"model": "a"}, {"model": "b"}])
    with pytest.raises(ValueError, match="t in"):
        ModelMerge(method="slerp", base_model="a", models=[{"model": "a"}, {"model": "b"}], parameters={"t": 2})
    assert (
        not SteeringPipeline(
            "steer_hydra:tiny",
            backend="vllm",
            controls=[ModelMerge(method="linear", models=[{"model": "a", "weight": 1}, {"model": "b", "weight": 1}])],
        )
        .check()
        .ok
    )
