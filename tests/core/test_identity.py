"""Canonical values, digests and seeds are stable and sensitive to what they identify."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

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
    assert derive_trial_seed(7, "baseline", 1) == expected
    seeds = {derive_trial_seed(7, c, t) for c in ("baseline", "abc") for t in (0, 1)}
    assert len(seeds) == 4


def test_item_seed_is_63_bits():
    seed = derive_item_seed(5, "generate", 3)
    assert 0 <= seed < 2**63
    assert seed == int.from_bytes(hashlib.sha256(b"5:generate:3").digest()[:8], "big") & (2**63 - 1)


def test_model_fingerprint_tracks_weights():
    a, _ = build_tiny_model(TinySpec(seed=0))
    b, _ = build_tiny_model(TinySpec(seed=0))
    c, _ = build_tiny_model(TinySpec(seed=1))
    assert model_fingerprint(a) == model_fingerprint(b) != model_fingerprint(c)
    assert model_fingerprint(a, hash_params_below=0) == model_fingerprint(c, hash_params_below=0)
    assert model_fingerprint(None) is None
