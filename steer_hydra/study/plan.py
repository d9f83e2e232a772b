"""The study's plan: the jobs a held-out study launches, as Hydra override lists with what each one evaluates.

A study runs, per concept: **dev** jobs (the baseline, and every method at every point of its grid, on the dev
suite), then, once each method's point is chosen on dev, **report** jobs (the baseline and every arm, methods and
the arms that follow them at the chosen point, on the test suite and each cost suite). Grids:

- vector methods (`vector_methods`: CAA, ActAdd and their sanity arms) sweep `strength` x `layer`, the layer as
  `model.steering_layer` (the model group's layer default, which the concept controls read); no `layers` keeps
  the model's default;
- attention methods (`attention_methods`: PASTA) sweep `alpha` (`arm.controls.pasta.alpha`);
- methods with a strength of their own (`grids`: `{arm: {axis: [values]}}`) sweep those axes: ITI's `iti_alpha`
  (`arm.controls.iti.alpha`), angular steering's `angle` (`arm.controls.angular.angle`, degrees), CAST's
  `cast_strength` (`arm.controls.cast.multiplier`), and the trained arms' learning rates `sft_lr`, `dpo_lr` and
  `reft_lr` (`arm.controls.<sft|dpo|reft>.learning_rate`: one adapter trained per point, on the training pairs);
- a point lists its axes in `AXES` order; grid order is each axis from its smallest magnitude, the first axis
  slowest, so ties in the objective go to the gentlest intervention.

Command-line overrides reach every job; `arm=a,b`, `strength=x,y`, `concept=a,b` (or `concepts=[a,b]`, or
`concepts=<file listing one concept per line>`, or a published dataset's set, `concepts=axbench:<folder or hub id>`
/ `concepts=steereval:<...>`, expanded into its concepts by `tasks/concept_sets.py`) set the study's arms, strength
grid and concepts, and `concepts_limit=N` keeps the first N usable concepts; every concept is checked before any job
launches (the unusable ones are left out with one warning; none usable is refused); any other sweep is refused (one
study per save_dir and seed). Jobs run with `plots=false` (the study draws its own plots) unless the command line
sets `plots`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from steer_hydra.tasks.concept_steering import OBJECTIVE

# axis name -> the config key a job's override sets
AXES = {
    "strength": "strength",
    "layer": "model.steering_layer",
    "alpha": "arm.controls.pasta.alpha",
    "iti_alpha": "arm.controls.iti.alpha",
    "angle": "arm.controls.angular.angle",
    "cast_strength": "arm.controls.cast.multiplier",
    "sft_lr": "arm.controls.sft.learning_rate",
    "dpo_lr": "arm.controls.dpo.learning_rate",
    "reft_lr": "arm.controls.reft.learning_rate",
}
STAGES = ("dev", "test", "cost")


@dataclass(frozen=True, slots=True)
class Point:
    """One point of a method's grid: `(axis, value)` pairs in `AXES` order (empty for an arm without a grid)."""

    values: tuple[tuple[str, float], ...] = ()

    def overrides(self) -> list[str]:
        return [f"{AXES[axis]}={value!r}" for axis, value in self.values]

    @property
    def label(self) -> str:
        """`strength=0.9 layer=12` (`-` for no grid)."""
        return " ".join(f"{axis}={value:g}" for axis, value in self.values) or "-"

    def columns(self) -> dict[str, float | None]:
        """`{axis: value or None}` for every axis of `AXES`."""
        given = dict(self.values)
        return {axis: given.get(axis) for axis in AXES}

    @classmethod
    def from_columns(cls, columns: Mapping[str, Any]) -> Point:
        """The point of a row's `AXES` columns (missing, None or NaN: not on that axis); a layer is an int."""
        values = []
        for axis in AXES:
            value = columns.get(axis)
            if value is not None and value == value:  # NaN != NaN
                values.append((axis, int(value) if axis == "layer" else float(value)))
        return cls(tuple(values))


@dataclass(frozen=True, slots=True)
class Job:
    """One launched job: its overrides and what it evaluates (stage, concept by name, arm, grid point, suite).

    `defaults` are axis values the job runs at without setting them (a vector method's layer when layers are not
    swept: the model's `steering_layer`); they are recorded in its row beside the point's, never overridden."""

    overrides: tuple[str, ...]
    stage: str
    concept: str
    arm_name: str
    point: Point
    suite: str
    defaults: tuple[tuple[str, float], ...] = ()

    @property
    def recorded_point(self) -> Point:
        """The point with its default axes, in `AXES` order: what the job's row records."""
        given = {**dict(self.defaults), **dict(self.point.values)}
        return Point(tuple((axis, given[axis]) for axis in AXES if axis in given))

    def row(self) -> dict[str, Any]:
        """The job as a row of the launched table (`overrides` joined by spaces)."""
        point = self.recorded_point
        return {
            "stage": self.stage,
            "concept": self.concept,
            "arm_name": self.arm_name,
            "point": point.label,
            **point.columns(),
            "suite": self.suite,
            "overrides": " ".join(self.overrides),
        }


@dataclass
class StudyPlan:
    """What a study evaluates; `dev_jobs` and `report_jobs` turn it into jobs (see the module docstring)."""

    arms: list[str]
    concepts: list[str] = field(default_factory=lambda: ["weddings"])
    vector_methods: list[str] = field(default_factory=list)
    attention_methods: list[str] = field(default_factory=list)
    strengths: list[float] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    alphas: list[float] = field(default_factory=list)
    grids: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    follows: dict[str, str] = field(default_factory=dict)
    baseline: str = "baseline"
    prompt_arm: str = "prompt_concept"
    objective: str = OBJECTIVE
    maximize: bool = True
    dev_suite: str = "concept_steering_dev"
    test_suite: str = "concept_steering_test"
    cost_suites: list[str] = field(default_factory=list)
    concepts_limit: int | None = None  # `concepts_limit=N`: the first N usable concepts of the command line's list
    names: dict[str, str] = field(default_factory=dict)  # concept as given (a name or a path) -> its name
    default_layer: int | None = None  # the model's steering_layer: a vector method's layer when layers are not swept

    def __post_init__(self) -> None:
        self.strengths = sorted((float(s) for s in self.strengths), key=lambda s: (abs(s), s))
        self.layers = sorted(int(layer) for layer in self.layers)
        self.alphas = sorted((float(a) for a in self.alphas), key=lambda a: (abs(a), a))
        for arm in self.vector_methods:
            if not self.strengths:
                raise ValueError(f"StudyPlan: vector method {arm!r} needs strengths. Fix: strength=a,b,c.")
        for arm in self.attention_methods:
            if not self.alphas:
                raise ValueError(f"StudyPlan: attention method {arm!r} needs alphas. Fix: hydra.sweeper.alphas=[...].")
        grids = {}
        for arm, axes in dict(self.grids).items():
            unknown = sorted(set(axes) - set(AXES))
            if unknown or not axes or any(not list(values) for values in axes.values()):
                raise ValueError(
                    f"StudyPlan: grids[{arm!r}] must map axes among {list(AXES)} to non-empty value lists; got "
                    f"{dict(axes)}. Fix: e.g. hydra.sweeper.grids.{arm}={{angle: [30, 60]}}."
                )
            grids[arm] = {
                axis: sorted((float(v) for v in axes[axis]), key=lambda v: (abs(v), v)) for axis in AXES if axis in axes
            }
        self.grids = grids
        if not self.concepts:
            raise ValueError("StudyPlan: no concept. Fix: concept=<name or file> or concepts=[a,b].")

    # ------------------------------------------------------------------------------------------ the command line
    def take_arguments(self, arguments: Sequence[str]) -> list[str]:
        """Apply the study's own overrides (`arm`, `strength`, `concept`, `concepts`, `concepts_limit`); return those
        for every job."""
        passthrough = []
        plots_given = False
        concepts: list[Any] | None = None
        for override in OverridesParser.create().parse_overrides(list(arguments)):
            key = override.get_key_element()
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
            if key == "arm":
                self.arms = [str(v) for v in values]
            elif key == "strength":
                self.strengths = sorted((float(v) for v in values), key=lambda s: (abs(s), s))
            elif key in ("concept", "concepts"):
                concepts = values
            elif key == "concepts_limit":
                self.concepts_limit = None if values[0] is None else int(values[0])
            elif override.is_sweep_override():
                raise ValueError(
                    f"StudySweeper: `{override.input_line}` sweeps {key!r}; a study sweeps only `arm`, `strength` "
                    "and `concept` (one study per save_dir). Fix: run one study command per value, e.g. per seed."
                )
            else:
                passthrough.append(override.input_line)
                plots_given = plots_given or override.key_or_group == "plots"  # plots=, ++plots=
        if not plots_given:
            passthrough.append("plots=false")  # the study draws its own; a job's plots cost about half a second
        # every concept is checked before any job launches, whether the command line or the preset names it
        self.concepts = concept_list(self.concepts if concepts is None else concepts, limit=self.concepts_limit)
        self.names = concept_names(self.concepts)
        return passthrough

    def concept_name(self, concept: str) -> str:
        """The name a concept (as given: a built-in name or a file's path) is keyed by in every study file."""
        return self.names.get(concept, concept)

    def defaults(self, method: str) -> tuple[tuple[str, float], ...]:
        """The axes `method`'s jobs run at without setting them: a vector method's layer when layers are not swept."""
        if method in self.vector_methods and not self.layers and self.default_layer is not None:
            return (("layer", int(self.default_layer)),)
        return ()

    # ------------------------------------------------------------------------------------------ grids
    def swept(self, arm: str) -> bool:
        """Whether `arm` runs at a grid point (a method, or an arm that follows one)."""
        return arm in self.vector_methods or arm in self.attention_methods or arm in self.grids or arm in self.follows

    def methods(self) -> list[str]:
        """The arms whose point is chosen on dev: swept arms in the study, and the arms they follow."""
        chosen = [a for a in self.arms if self.swept(a) and a not in self.follows]
        chosen += [self.follows[a] for a in self.arms if a in self.follows]
        return list(dict.fromkeys(chosen))

    def grid(self, method: str) -> list[Point]:
        """`method`'s points in grid order (ties in the objective go to the first)."""
        if method in self.vector_methods:
            layers: Iterable[int | None] = self.layers or [None]
            return [
                Point(tuple((axis, value) for axis, value in (("strength", s), ("layer", la)) if value is not None))
                for s, la in itertools.product(self.strengths, layers)
            ]
        if method in self.attention_methods:
            return [Point((("alpha", a),)) for a in self.alphas]
        if method in self.grids:
            axes = self.grids[method]
            return [Point(tuple(zip(axes, values, strict=True))) for values in itertools.product(*axes.values())]
        return [Point()]

    # ------------------------------------------------------------------------------------------ jobs
    def _job(self, passthrough: Sequence[str], stage: str, concept: str, arm: str, point: Point, suite: str) -> Job:
        """A job on `concept` (as given, for its override; keyed by its name) at `point` (its default axes taken out
        of the overrides and recorded beside it)."""
        defaults = self.defaults(self.follows.get(arm, arm)) if self.swept(arm) else ()
        point = Point(tuple(pair for pair in point.values if pair not in defaults))
        overrides = (*passthrough, f"concept={concept}", f"arm={arm}", *point.overrides(), f"suite={suite}")
        return Job(tuple(overrides), stage, self.concept_name(concept), arm, point, suite, defaults)

    def dev_jobs(self, passthrough: Sequence[str]) -> list[Job]:
        """Per concept: the baseline and each method at each grid point, on the dev suite."""
        methods = self.methods()
        if not methods:
            return []
        jobs = []
        for concept in self.concepts:
            jobs.append(self._job(passthrough, "dev", concept, self.baseline, Point(), self.dev_suite))
            for method in methods:
                jobs += [self._job(passthrough, "dev", concept, method, p, self.dev_suite) for p in self.grid(method)]
        return jobs

    def report_jobs(self, passthrough: Sequence[str], choices: Mapping[tuple[str, str], Point]) -> list[Job]:
        """Per concept: the baseline and every arm (swept ones at their method's chosen point, `choices[(concept,
        method)]`) on the test suite and each cost suite."""
        jobs = []
        arms = list(dict.fromkeys([self.baseline, *self.arms]))
        for concept in self.concepts:
            for stage, suite in [("test", self.test_suite), *(("cost", s) for s in self.cost_suites)]:
                for arm in arms:
                    point = self._chosen(choices, self.concept_name(concept), arm) if self.swept(arm) else Point()
                    jobs.append(self._job(passthrough, stage, concept, arm, point, suite))
        return jobs

    def fit_jobs(self, passthrough: Sequence[str]) -> list[Job]:
        """One dev-suite job per configuration whose controls may fit something, whatever dev chooses: per concept,
        every arm at each point of its method's grid, the strength axis at its gentlest value only (a strength
        scales what a control fits and never changes the fit), an arm without a grid once. The fit ahead of a
        study's jobs (`app.prefit`) builds their controls."""
        jobs = []
        for concept in self.concepts:
            for arm in dict.fromkeys([self.baseline, *self.arms, *self.methods()]):
                points: dict[tuple[tuple[str, float], ...], Point] = {}
                for point in self.grid(self.follows.get(arm, arm)) if self.swept(arm) else [Point()]:
                    points.setdefault(tuple(pair for pair in point.values if pair[0] != "strength"), point)
                jobs += [self._job(passthrough, "dev", concept, arm, p, self.dev_suite) for p in points.values()]
        return jobs

    def job_counts(self, passthrough: Sequence[str]) -> dict[str, int]:
        """`{"dev": n, "report": m}`: the jobs of each phase, known before any runs (the report jobs are concepts x
        (test and cost suites) x arms whatever points dev chooses)."""
        anywhere = {(self.concept_name(c), m): Point() for c in self.concepts for m in self.methods()}
        return {"dev": len(self.dev_jobs(passthrough)), "report": len(self.report_jobs(passthrough, anywhere))}

    def _chosen(self, choices: Mapping[tuple[str, str], Point], concept: str, arm: str) -> Point:
        method = self.follows.get(arm, arm)
        if (concept, method) not in choices:
            raise ValueError(
                f"No point was chosen for {method!r} on concept {concept!r}: its dev jobs left no scored rows. Fix: "
                "see the dev jobs' logs (inspect view), then run the same study command again (it resumes)."
            )
        return choices[(concept, method)]


def concept_list(values: Sequence[Any], limit: int | None = None) -> list[str]:
    """Concepts from `concept=`/`concepts=` values: a list, names, or one file (`.txt`: one concept per line, `#`
    comments; `.yaml`/`.yml` holding a list) that lists them; a dataset's set expanded into its concepts and every
    concept checked (`tasks.concept_sets.expand_concepts`), then the first `limit` kept."""
    from steer_hydra.tasks.concepts import expand_concepts

    return expand_concepts(_listed(values), limit=limit)


def concept_names(concepts: Sequence[str]) -> dict[str, str]:
    """`{concept as given: its name}` for checked concepts (a file's path keys to the name the file declares)."""
    from steer_hydra.tasks.concepts import concept_name

    return {concept: concept_name(concept) for concept in concepts}


def _listed(values: Sequence[Any]) -> list[str]:
    """The concepts `values` list, as given (see `concept_list`)."""
    flat: list[str] = []
    for value in values:
        flat += [str(v) for v in value] if isinstance(value, (list, tuple)) else [str(value)]
    if len(flat) == 1 and Path(flat[0]).suffix in (".txt", ".yaml", ".yml") and Path(flat[0]).is_file():
        path = Path(flat[0])
        if path.suffix == ".txt":
            return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]
        import yaml

        try:
            listed = yaml.safe_load(path.read_text())
        except yaml.YAMLError:  # a concept file with a syntax error: its checked loader names the line and the fix
            return [flat[0]]
        if isinstance(listed, list):
            return [str(item) for item in listed]
        # a single concept file (a mapping), not a list of concepts
    return list(dict.fromkeys(flat))
