"""SteeringVector: safetensors round trip, content hash over the canonical bytes, refusal of foreign files."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from steer_hydra.controls.state import SteeringVector
from steer_hydra.core import canonical_value


def _tensor(seed=0, shape=(16,)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_round_trip_keeps_tensor_layer_metadata_and_hash(tmp_path):
    vector = SteeringVector(
        _tensor(shape=(3, 16)).to(torch.bfloat16), layer=7, metadata={"method": "mean_diff", "n": 4}
    )
    path = vector.save(tmp_path / "nested" / "v.safetensors")
    loaded = SteeringVector.load(path)
    assert torch.equal(loaded.tensor, vector.tensor) and loaded.tensor.dtype == torch.bfloat16
    assert (loaded.layer, loaded.metadata) == (7, {"method": "mean_diff", "n": 4})
    assert loaded.content_hash == vector.content_hash
    assert SteeringVector.load(SteeringVector(_tensor()).save(tmp_path / "none.safetensors")).layer is None


def test_content_hash_tracks_data_layer_and_dtype_not_metadata():
    base = SteeringVector(_tensor(), layer=2)
    assert len(base.content_hash) == 64
    assert SteeringVector(_tensor(), layer=2, metadata={"note": "x"}).content_hash == base.content_hash
    changed = _tensor()
    changed[3] += 1e-3
    assert SteeringVector(changed, layer=2).content_hash != base.content_hash
    assert SteeringVector(_tensor(), layer=3).content_hash != base.content_hash
    assert SteeringVector(_tensor().double(), layer=2).content_hash != base.content_hash
    assert canonical_value(base) != canonical_value(SteeringVector(changed, layer=2))


def test_load_refuses_foreign_or_corrupt_files(tmp_path):
    foreign = tmp_path / "weights.safetensors"
    save_file({"weight": torch.ones(2)}, str(foreign))
    with pytest.raises(ValueError, match="is not a steer_hydra steering vector"):
        SteeringVector.load(foreign)
    good = SteeringVector(_tensor(), layer=1)
    corrupt = tmp_path / "corrupt.safetensors"
    save_file(
        {"vector": _tensor(seed=1)},
        str(corrupt),
        metadata={
            "format": "steer_hydra.steering_vector/1",
            "layer": "1",
            "metadata": "{}",
            "content_hash": good.content_hash,
        },
    )
    with pytest.raises(ValueError, match="is corrupt"):
        SteeringVector.load(corrupt)
    with pytest.raises(FileNotFoundError, match="No steering vector file"):
        SteeringVector.load(tmp_path / "missing.safetensors")


def test_construction_errors_name_the_field():
    with pytest.raises(ValueError, match="SteeringVector.tensor must be 1-D .* got shape \\(1, 2, 3\\)"):
        SteeringVector(torch.ones(1, 2, 3))
    with pytest.raises(ValueError, match="finite floating-point"):
        SteeringVector(torch.tensor([1.0, float("nan")]))
    with pytest.raises(TypeError, match="SteeringVector.layer must be an int"):
        SteeringVector(torch.ones(2), layer="3")
    with pytest.raises(TypeError, match="SteeringVector.metadata must be JSON-serialisable"):
        SteeringVector(torch.ones(2), metadata={"t": torch.ones(1)})
    with pytest.raises(TypeError, match="CAA.steering_vector must be a SteeringVector, a torch.Tensor or a path"):
        SteeringVector.coerce(3, field_name="CAA.steering_vector")
