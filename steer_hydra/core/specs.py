"""`ControlSpec` and `Factory`: one control class plus fixed parameters and a search space to sweep.

A spec is pure data: it yields parameter dicts (`iter_points`) and resolves the constructor kwargs of one point
(`resolve_params`), evaluating `Factory` values from the point's context. Building the control is `build()`.
Invariants: iteration order is deterministic (grid order, or sorted sampled indices of the grid under
`search_strategy="random"` with `random.Random(seed)`); a spec never loads a model.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

SEARCH_STRATEGIES = ("grid", "random")


@dataclass(frozen=True, slots=True)
class Factory:
    """A parameter value computed from a configuration point's context when the control is built.

    `function(context)` receives a mapping with `arm`, `base_model_name_or_path`, `combo_id` and
    `search_params` (the values chosen for this point). Plain callables in `params` are passed unchanged;
    wrap a callable in `Factory` to have it evaluated.
    """

    function: Callable[[Mapping[str, Any]], Any]

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise TypeError(f"Factory.function must be callable (context -> value); got {self.function!r}.")

    def __call__(self, context: Mapping[str, Any]) -> Any:
        return self.function(context)


SearchSpace = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]] | Callable[[Mapping[str, Any]], Iterable[Any]]


@dataclass(frozen=True, slots=True)
class ControlSpec:
    """A control class with fixed `params` and an optional search space `vars`.

    Args:
        control_cls: the control class to build.
        params: fixed constructor kwargs; `Factory` values are computed per point.
        vars: the search space: a mapping `{arg: [values...]}` (cartesian grid; every dimension non-empty), a list
            of parameter dicts, or a callable `context -> iterable of dicts`. None: one point with no chosen values.
        name: the spec's name in `params` records and frames (default: the class name).
        search_strategy: "grid" (every point) or "random" (`num_samples` points drawn without replacement).
        num_samples: how many points "random" draws (required there).
        seed: seed of the random draw.
    """

    control_cls: type
    params: Mapping[str, Any] = field(default_factory=dict)
    vars: SearchSpace | None = None
    name: str | None = None
    search_strategy: Literal["grid", "random"] = "grid"
    num_samples: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.control_cls, type):
            raise TypeError(f"ControlSpec.control_cls must be a control class; got {self.control_cls!r}.")
        if not isinstance(self.params, Mapping):
            raise TypeError(f"ControlSpec.params must be a mapping of constructor kwargs; got {self.params!r}.")
        object.__setattr__(self, "params", dict(self.params))
        if self.name is None:
            object.__setattr__(self, "name", self.control_cls.__name__)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"ControlSpec.name must be a non-empty string; got {self.name!r}.")
        if self.search_strategy not in SEARCH_STRATEGIES:
            raise ValueError(
                f"ControlSpec.search_strategy must be one of {SEARCH_STRATEGIES}; got {self.search_strategy!r}."
            )
        if self.search_strategy == "random" and (self.num_samples is None or self.num_samples < 1):
            raise ValueError(
                f"ControlSpec({self.name}): search_strategy='random' needs num_samples >= 1; got {self.num_samples!r}."
            )
        if self.num_samples is not None and self.search_strategy != "random":
            raise ValueError(f"ControlSpec({self.name}): num_samples is only used with search_strategy='random'.")
        space = self.vars
        if isinstance(space, Mapping):
            space = {k: list(v) if isinstance(v, (list, tuple, range)) else v for k, v in space.items()}
            for key, values in space.items():
                if not isinstance(values, list):
                    raise TypeError(
                        f"ControlSpec({self.name}).vars[{key!r}] must be a list of values to sweep; got {values!r}."
                    )
                if not values:
                    raise ValueError(f"ControlSpec({self.name}).vars[{key!r}] is empty; give at least one value.")
            object.__setattr__(self, "vars", space)
        elif isinstance(space, (list, tuple)):
            for item in space:
                if not isinstance(item, Mapping):
                    raise TypeError(f"ControlSpec({self.name}).vars as a list must hold parameter dicts; got {item!r}.")
            object.__setattr__(self, "vars", [dict(item) for item in space])
        elif space is not None and not callable(space):
            raise TypeError(
                f"ControlSpec({self.name}).vars must be a mapping of lists, a list of dicts, a callable or None; "
                f"got {space!r}."
            )
        overlap = sorted(set(self.params) & self._var_names())
        if overlap:
            raise ValueError(f"ControlSpec({self.name}): {overlap} appear in both params and vars; keep one.")

    def _var_names(self) -> set[str]:
        if isinstance(self.vars, Mapping):
            return set(self.vars)
        if isinstance(self.vars, list):
            return {k for item in self.vars for k in item}
        return set()

    def _all_points(self, context: Mapping[str, Any]) -> list[dict[str, Any]]:
        if self.vars is None:
            return [{}]
        if isinstance(self.vars, Mapping):
            keys = list(self.vars)
            return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.vars[k] for k in keys))]
        if isinstance(self.vars, list):
            return [dict(item) for item in self.vars]
        points = []
        for item in self.vars(context):
            if not isinstance(item, Mapping):
                raise TypeError(f"ControlSpec({self.name}).vars callable must yield dicts; got {item!r}.")
            points.append(dict(item))
        return points

    def iter_points(self, context: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Yield the chosen parameter dicts of this spec (one per point of the search)."""
        points = self._all_points(dict(context or {}))
        if not points:
            raise ValueError(f"ControlSpec({self.name}) has an empty search space; give at least one point.")
        if self.search_strategy == "random":
            count = min(int(self.num_samples or 1), len(points))
            indices = sorted(random.Random(self.seed).sample(range(len(points)), count))
            points = [points[i] for i in indices]
        yield from points

    def resolve_params(self, chosen: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Constructor kwargs for one point: fixed params (factories evaluated) overlaid with the chosen values."""
        ctx = {**dict(context or {}), "search_params": dict(chosen)}
        resolved = {k: v(ctx) if isinstance(v, Factory) else v for k, v in self.params.items()}
        resolved.update(chosen)
        return resolved

    def recorded_params(self, chosen: Mapping[str, Any]) -> dict[str, Any]:
        """What a run record shows for one point: plain fixed params plus the chosen values (factories omitted)."""
        recorded = {k: v for k, v in self.params.items() if not isinstance(v, Factory)}
        recorded.update(chosen)
        return recorded

    def descriptor(self, chosen: Mapping[str, Any]) -> dict[str, Any]:
        """Identity of one point for configuration digests (factories by function name), with the content digests
        of files its plain args name (`content_digests` of the control class)."""
        args = {**self.params, **chosen}
        plain = {k: v for k, v in args.items() if not isinstance(v, Factory)}
        digests = getattr(self.control_cls, "content_digests", None)
        return {
            "control": f"{self.control_cls.__module__}.{self.control_cls.__qualname__}",
            "spec": self.name,
            "args": args,
            **(digests(plain) if digests is not None else {}),
        }

    def build(self, chosen: Mapping[str, Any], context: Mapping[str, Any] | None = None) -> Any:
        """A fresh control instance for one point."""
        return self.control_cls(**self.resolve_params(chosen, context))
