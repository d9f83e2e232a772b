"""ControlSpec and Factory: search spaces, random draws, parameter resolution, validation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from steer_hydra.core import BaseArgs, InputControl
from steer_hydra.core.specs import ControlSpec, Factory


class Knob(InputControl):
    @dataclass(frozen=True)
    class Args(BaseArgs):
        alpha: float = 1.0
        layer: int = 0
        tag: str = ""

    supports_batching = True


def test_name_defaults_to_the_class_name():
    assert ControlSpec(Knob).name == "Knob"
    assert ControlSpec(Knob, name="k").name == "k"


def test_no_vars_is_one_empty_point():
    assert list(ControlSpec(Knob, params={"alpha": 2.0}).iter_points()) == [{}]


def test_grid_is_the_cartesian_product_in_order():
    spec = ControlSpec(Knob, vars={"alpha": [0.1, 0.2], "layer": [0, 1, 2]})
    points = list(spec.iter_points())
    assert len(points) == 6
    assert points[0] == {"alpha": 0.1, "layer": 0}
    assert points[1] == {"alpha": 0.1, "layer": 1}
    assert points[-1] == {"alpha": 0.2, "layer": 2}


def test_list_and_callable_search_spaces():
    assert list(ControlSpec(Knob, vars=[{"alpha": 1.0}, {"layer": 3}]).iter_points()) == [{"alpha": 1.0}, {"layer": 3}]
    seen = {}

    def space(context):
        seen.update(context)
        return [{"layer": i} for i in range(context["n"])]

    assert list(ControlSpec(Knob, vars=space).iter_points({"n": 2})) == [{"layer": 0}, {"layer": 1}]
    assert seen["n"] == 2


def test_random_draws_a_seeded_sorted_subset_of_the_grid():
    grid = {"alpha": [0.1, 0.2, 0.3, 0.4], "layer": [0, 1, 2]}
    spec = ControlSpec(Knob, vars=grid, search_strategy="random", num_samples=4, seed=3)
    points = list(spec.iter_points())
    assert len(points) == 4
    assert points == list(spec.iter_points())  # deterministic
    full = list(ControlSpec(Knob, vars=grid).iter_points())
    indices = [full.index(p) for p in points]
    assert indices == sorted(indices) and len(set(indices)) == 4
    others = [
        list(ControlSpec(Knob, vars=grid, search_strategy="random", num_samples=4, seed=s).iter_points())
        for s in range(6)
    ]
    assert any(o != points for o in others)
    capped = ControlSpec(Knob, vars={"alpha": [1.0, 2.0]}, search_strategy="random", num_samples=10)
    assert len(list(capped.iter_points())) == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"vars": {"alpha": []}}, ValueError, "alpha"),
        ({"vars": {"alpha": 0.5}}, TypeError, "list of values"),
        ({"search_strategy": "random"}, ValueError, "num_samples"),
        ({"search_strategy": "bayes"}, ValueError, "search_strategy"),
        ({"num_samples": 2}, ValueError, "random"),
        ({"params": {"alpha": 1.0}, "vars": {"alpha": [2.0]}}, ValueError, "both params and vars"),
        ({"vars": [1, 2]}, TypeError, "parameter dicts"),
        ({"name": ""}, ValueError, "name"),
    ],
)
def test_invalid_specs_raise_naming_the_field(kwargs, error, match):
    with pytest.raises(error, match=match):
        ControlSpec(Knob, **kwargs)


def test_control_cls_must_be_a_class():
    with pytest.raises(TypeError, match="control class"):
        ControlSpec(Knob(), params={})


def test_resolve_params_evaluates_factories_with_search_params_and_overlays_chosen():
    plain = len  # a plain callable passes unchanged
    spec = ControlSpec(
        Knob,
        params={"tag": Factory(lambda ctx: f"{ctx['arm']}-{ctx['search_params']['alpha']}"), "fn": plain},
        vars={"alpha": [0.5]},
    )
    resolved = spec.resolve_params({"alpha": 0.5}, {"arm": "arm"})
    assert resolved == {"tag": "arm-0.5", "fn": plain, "alpha": 0.5}


def test_recorded_params_omit_factories_and_build_makes_fresh_controls():
    spec = ControlSpec(Knob, params={"layer": 1, "tag": Factory(lambda ctx: "x")}, vars={"alpha": [0.5]})
    assert spec.recorded_params({"alpha": 0.5}) == {"layer": 1, "alpha": 0.5}
    first, second = spec.build({"alpha": 0.5}), spec.build({"alpha": 0.5})
    assert first is not second
    assert (first.alpha, first.layer, first.tag) == (0.5, 1, "x")


def test_factory_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        Factory(3)
