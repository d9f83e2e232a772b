"""Control base classes: Args checking, mirroring, enabled, categories and runtime-kwarg declarations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
import torch

from steer_hydra.core import (
    BaseArgs,
    InputControl,
    OutputControl,
    StateControl,
    SteeringPipeline,
    merge_controls,
    runtime_kwargs_schema,
)
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import ResidualAddition
from steer_hydra.models import TINY_REF


class Knob(StateControl):
    @dataclass(frozen=True)
    class Args(BaseArgs):
        alpha: float = 1.0
        layers: list[int] = field(default_factory=lambda: [0])
        mode: Literal["a", "b"] = "a"
        name: str | None = None

        def validate(self) -> None:
            if self.alpha <= 0:
                raise ValueError(f"Knob.alpha must be > 0; got {self.alpha}.")

    RUNTIME_KWARGS_SCHEMA = [{"name": "spans", "type": "list[str]", "scope": "row"}]


class Reader(InputControl):
    RUNTIME_KWARGS_SCHEMA = [{"name": "spans", "type": "list[str]", "scope": "call"}]


class Agreeing(OutputControl):
    RUNTIME_KWARGS_SCHEMA = [{"name": "spans", "type": "list[str]", "scope": "row"}, {"name": "extra"}]


def test_args_are_checked_and_mirrored():
    knob = Knob(alpha=2, layers=[0, 1], mode="b")
    assert (knob.alpha, knob.layers, knob.mode, knob.name) == (2, [0, 1], "b", None)
    assert knob.enabled and knob.args.alpha == 2
    assert Knob(enabled=False).enabled is False
    with pytest.raises(TypeError, match=r"Knob.alpha must be float; got 'x'"):
        Knob(alpha="x")
    with pytest.raises(TypeError, match="Knob.layers must be list"):
        Knob(layers=[0, "1"])
    with pytest.raises(TypeError, match="Knob.alpha must be float; got True"):
        Knob(alpha=True)
    with pytest.raises(ValueError, match="Knob.alpha must be > 0"):
        Knob(alpha=-1)
    with pytest.raises(TypeError, match=r"unknown argument\(s\) \['alhpa'\]; valid arguments: \['alpha'"):
        Knob(alhpa=1)


def test_descriptor_and_repr():
    knob = Knob(alpha=0.5)
    descriptor = knob.descriptor()
    assert descriptor["control"].endswith("Knob") and descriptor["args"]["alpha"] == 0.5 and descriptor["enabled"]
    assert "alpha=0.5" in repr(knob)


def test_categories_and_default_requirements():
    knob, reader, agreeing = Knob(), Reader(), Agreeing()
    sets = merge_controls([agreeing, knob, reader])
    assert sets.all() == [reader, knob, agreeing]
    assert knob.requirements() == frozenset({Capability.IN_PROCESS_TORCH})
    assert reader.requirements() == frozenset()
    assert not knob.supports_batching


def test_capabilities_are_declared_on_the_base_classes_with_conservative_defaults():
    knob, reader = Knob(), Reader()
    assert (knob.supports_refill, reader.supports_refill, knob.adds_residual) == (False, False, False)
    assert knob.vector_hash is None and reader.vector_hash is None
    with pytest.raises(NotImplementedError, match=r"Knob does not declare adds_residual.*Fix: .*backend=huggingface"):
        knob.residual_addition()


def test_residual_addition_starts_per_scope():
    rows = torch.ones(1, 4)
    assert ResidualAddition(0, "output", "from", rows, "after_prompt").start(7) == 7
    assert ResidualAddition(0, "output", "from", rows, "last_k", last_k=3).start(7) == 4
    assert ResidualAddition(0, "output", "from", rows, "last_k", last_k=9).start(7) == 0
    assert ResidualAddition(0, "output", "from", rows, "all").start(7) == 0
    assert ResidualAddition(0, "input", "block", rows, "position", offset=2).start(7) == 2


def test_schema_merge_conflicts_name_the_kwarg_and_both_controls():
    with pytest.raises(ValueError, match=r"'spans' is declared with scope 'row' by Knob and 'call' by Reader"):
        runtime_kwargs_schema([Knob(), Reader()])
    with pytest.raises(ValueError, match="'spans'"):
        SteeringPipeline(TINY_REF, controls=[Knob(), Reader()])
    merged = runtime_kwargs_schema([Knob(), Agreeing()])
    assert merged["spans"]["scope"] == "row" and merged["extra"]["scope"] == "call"
    assert runtime_kwargs_schema([Knob(), Reader(enabled=False)])["spans"]["scope"] == "row"


def test_invalid_scope_raises():
    class Bad(InputControl):
        RUNTIME_KWARGS_SCHEMA = [{"name": "x", "scope": "sample"}]

    with pytest.raises(ValueError, match="scope 'sample'; use 'row' or 'call'"):
        runtime_kwargs_schema([Bad()])
