"""Canonical values, digests and seeds are stable and sensitive to what they identify."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pytest
import torch

from steer_hydra.core.identity import (
    canonical_value,
    config_digest,
    derive_item_seed,
    derive_trial_seed,
    model_fingerprint,
)
from steer_hydra.models import TinySpec, build_tiny_model


@dataclass
class Point:
    x: int
    y: float


def test_canonical_value_forms():
    t = torch.arange(4, dtype=torch.float32)
    assert canonical_value(t) == canonical_value(t.clone())
    assert canonical_value(t) != canonical_value(t.to(torch.float64))
    assert canonical_value({"b": 1, "a": (1, 2)}) == {"a": [1, 2], "b": 1}
    assert canonical_value(Point(1, 2.0))["__class__"].endswith("Point")
    assert canonical_value(len) == {"__callable__": "builtins.len"}
    assert canonical_value(torch.float16) == "torch.float16"


def test_config_digest():
    assert config_digest([]) == "baseline"
    a = config_digest([{"control": "X", "args": {"alpha": 1}}])
    assert len(a) == 12 and a == config_digest([{"args": {"alpha": 1}, "control": "X"}])
    assert a != config_digest([{"control": "X", "args": {"alpha": 2}}])


def test_trial_seed_is_first_four_bytes_of_sha256():
    expected = int.from_bytes(hashlib.sha256(b"7:baseline:1").digest()[:4], "big")
    assert derive_trial_seed(seed=7, config_id="baseline", trial_id=1) == expected
    seeds = {derive_trial_seed(7, c, t) for c in ("baseline", "abc") for t in (0, 1)}
    assert len(seeds) == 4


def test_item_seed_is_63_bits():
    seed = derive_item_seed(5, "generate", 3)
    assert 0 <= seed < 2**63
    assert seed == int.from_bytes(hashlib.sha256(b"5:generate:3").digest()[:8], "big") & (2**63 - 1)
    assert derive_item_seed(request_seed=5, op="generate", index=3) == seed


def test_model_fingerprint_tracks_weights():
    a, _ = build_tiny_model(TinySpec(seed=0))
    b, _ = build_tiny_model(TinySpec(seed=0))
    c, _ = build_tiny_model(TinySpec(seed=1))
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    assert model_fingerprint(a, hash_params_below=0) == model_fingerprint(c, hash_params_below=0)
    assert model_fingerprint(None) is None


def test_numpy_scalars_and_arrays_canonicalize_by_content():
    import numpy as np

    assert canonical_value(np.int64(3)) == 3 and canonical_value(np.bool_(True)) is True
    assert canonical_value(np.float64(0.5)) == 0.5 == canonical_value(np.float32(0.5))
    assert canonical_value({"k": np.int64(3)}) == canonical_value({"k": 3})
    assert canonical_value(np.int64(3)) != canonical_value(np.int64(4))
    a = np.arange(4)
    assert canonical_value(a) == canonical_value(a.copy()) != canonical_value(a + 1)
    assert canonical_value(a) != canonical_value(a.astype(np.float64))  # dtype changes meaning
    assert canonical_value(a) != canonical_value(a.reshape(2, 2))
    assert canonical_value(np.array(["x", 1], dtype=object)) != canonical_value(np.array(["x", 2], dtype=object))


def test_configurations_differing_only_in_numpy_tensor_or_nested_values_get_distinct_ids():
    import numpy as np

    def descriptor(value):
        return [{"control": "FewShot", "args": {"pool": [{"q": "a", "n": value}]}, "enabled": True}]

    assert (
        config_digest(descriptor(np.int64(1))) == config_digest(descriptor(np.int64(1))) == config_digest(descriptor(1))
    )
    assert config_digest(descriptor(np.int64(1))) != config_digest(descriptor(np.int64(2)))
    assert config_digest(descriptor(np.array([1, 2]))) != config_digest(descriptor(np.array([1, 3])))
    assert config_digest(descriptor(torch.tensor([1.0]))) != config_digest(descriptor(torch.tensor([2.0])))
    assert config_digest(descriptor(torch.tensor([1.0]))) == config_digest(descriptor(torch.tensor([1.0])))
    assert config_digest(descriptor({"deep": [np.float32(0.25)]})) != config_digest(descriptor({"deep": [0.5]}))


def test_lambdas_partials_and_methods_canonicalize_by_what_they_compute():
    import functools

    def make(k):
        return lambda x: x + k

    assert canonical_value(make(1)) == canonical_value(make(1)) != canonical_value(make(2))
    assert canonical_value(lambda x: x * 2) != canonical_value(lambda x: x * 3)
    assert canonical_value(functools.partial(max, 1)) != canonical_value(functools.partial(max, 2))
    assert canonical_value(Point(1, 2.0).__eq__) != canonical_value(Point(2, 2.0).__eq__)


def test_a_value_without_content_form_raises_naming_its_path_and_the_fix():
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"value\[0\]\['args'\]\['scorer'\].*Opaque.*Fix: "):
        canonical_value([{"args": {"scorer": Opaque()}}])
    with pytest.raises(TypeError, match="meta tensor"):
        canonical_value(torch.empty(2, device="meta"))
