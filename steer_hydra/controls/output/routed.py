"""RoutedDecoding: each row's decoding plan chosen from its prompt by a router (a classifier on the prompt's text) or a
linear probe on the model's state of the prompt (steer or not, which decoding to use).

How it runs: a decoding driver holding named routes, each a list of output controls (logits processors, stopping
criteria and at most one decoding driver; an empty list decodes as the arm's other controls do). At `steer()` every
route's controls are prepared like the pipeline's own (same model, tokenizer and second-model loader), and a probe
is fitted from `probe_data` (closed-form LDA on the last prompt token's final hidden state, `probes.py`). At
`decode()` each row gets its route: the row-scoped `route` runtime kwarg when given, else the router's answer on
the prompt's text (decoded without special tokens), else the probe's class of its prompt state, else
`default_route`. The rows of one route decode together (a slice of the call's left-packed batch, its all-pad
columns dropped): the route's processors and criteria are built on those rows and join the pipeline's composed
stacks in the rollout (`rollout(logits_processors=...)`); a route's driver decodes them through that rollout
(one row at a time when it does not batch). So a row decodes as it would alone under its route, whatever the
other rows of the batch are routed to. Row-scoped runtime kwargs reach a route's controls sliced to its rows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from steer_hydra.controls.output.phased import roll_rows
from steer_hydra.controls.output.probes import (
    LinearProbe,
    fit_linear_probe,
    last_token_states,
    prompt_rows,
    states_of_rows,
)
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import (
    BaseArgs,
    BaseControl,
    DecodingDriver,
    DriverResult,
    OutputControl,
    declared_scopes,
    row_values,
    runtime_kwargs_schema,
)
from steer_hydra.core.params import DEFAULT_MAX_NEW_TOKENS
from steer_hydra.core.tensors import pad_right, strip_trailing, trim_left

logger = logging.getLogger(__name__)

ROUTE = "route"
_OWNED_KWARGS = ("max_new_tokens", "num_return_sequences", "num_beams", "n")


class KeywordRouter:
    """A router on the prompt's text: the first route (in the given order) one of whose keywords occurs in it
    (case-insensitive; a keyword starting or ending with a letter or digit matches only at a word boundary there),
    else `default` (None: the control's `default_route`)."""

    def __init__(self, routes: Mapping[str, Sequence[str]], default: str | None = None) -> None:
        if not routes or not all(isinstance(k, str) and k for words in routes.values() for k in words):
            raise ValueError(
                f"KeywordRouter.routes must map route names to lists of non-empty keywords; got {routes!r}. "
                "Fix: e.g. routes={'math': ['how many', 'sum']}."
            )
        self.routes = {str(name): [str(k) for k in words] for name, words in routes.items()}
        self.default = default
        self._patterns = {name: [_keyword_pattern(k) for k in words] for name, words in self.routes.items()}

    def __call__(self, prompt: str) -> str | None:
        for name, patterns in self._patterns.items():
            if any(p.search(prompt) for p in patterns):
                return name
        return self.default

    def canonical_form(self) -> dict[str, Any]:
        return {"__class__": f"{__name__}.KeywordRouter", "routes": self.routes, "default": self.default}

    def __repr__(self) -> str:
        return f"KeywordRouter({self.routes!r}, default={self.default!r})"


def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    start = r"\b" if keyword[0].isalnum() else ""
    end = r"\b" if keyword[-1].isalnum() else ""
    return re.compile(start + re.escape(keyword) + end, re.IGNORECASE)


def check_routes(routes: Any, owner: str = "RoutedDecoding") -> None:
    """Routes map non-empty names to lists of output controls: at most one decoding driver each, no nested router,
    no control that lowers its effect into the call's parameters, no instance twice."""
    if not isinstance(routes, Mapping) or not routes:
        raise ValueError(
            f"{owner}.routes must map route names to lists of output controls; got {routes!r}. "
            "Fix: e.g. routes={'plain': [], 'guided': [<an output control>]}."
        )
    seen: set[int] = set()
    for name, controls in routes.items():
        where = f"{owner}.routes[{name!r}]"
        if not isinstance(name, str) or not name:
            raise ValueError(f"{owner}.routes has the route name {name!r}. Fix: name each route with a string.")
        if not isinstance(controls, (list, tuple)):
            raise ValueError(f"{where} must be a list of output controls; got {controls!r}. Fix: [] or [control].")
        drivers = 0
        for control in controls:
            if not isinstance(control, OutputControl):
                raise ValueError(
                    f"{where} holds {control!r}, which is not an output control: a route chooses how a row decodes. "
                    "Fix: put input, state and structural controls in the arm itself."
                )
            if isinstance(control, RoutedDecoding):
                raise ValueError(f"{where} holds another RoutedDecoding. Fix: give the routes of both one router.")
            if control.export_generation_params({}):
                raise ValueError(
                    f"{where} holds {type(control).__name__}, which lowers its effect into the whole call's "
                    "parameters (stops, budgets), not one row's. Fix: put it in the arm itself."
                )
            if id(control) in seen:
                raise ValueError(
                    f"{where}: the same {type(control).__name__} instance is in two routes. Fix: build two."
                )
            seen.add(id(control))
            drivers += isinstance(control, DecodingDriver)
        if drivers > 1:
            raise ValueError(f"{where} holds {drivers} decoding drivers. Fix: keep one driver per route.")


class RoutedDecoding(DecodingDriver):
    """Routed decoding: a per-row plan, chosen by a classifier or a probe on the prompt, among named routes.

    Conditional steering decides per input whether and how to steer: CAST (Lee et al., ICLR 2025, arXiv 2409.05907)
    steers only prompts whose hidden state a condition vector flags; router-based systems send each query to the
    decoding (or model) that suits it. Here the router reads the prompt and each route is a decoding plan made of
    output controls: e.g. `{plain: [], guided: [ValueGuidance(...)]}` steers only flagged prompts, `{short:
    [ConstrainedDecoding(regex=...)], long: [ThinkingBudget(...)]}` picks the decoding by question type.

    Args:
        routes: route name -> list of output controls (processors, criteria and at most one decoding driver; `[]`
            decodes with the arm's other controls only). Controls that lower into the call's parameters
            (StoppingRules) belong in the arm itself.
        router: a callable `(prompt_text) -> route name or None` (e.g. `KeywordRouter`, or any classifier).
        probe_data: `[{prompt, route}, ...]`: fit a linear probe at `steer()` on the final hidden state of each
            prompt's last token (as the pipeline renders a one-turn chat), and route each row to its class
            (Hugging Face only); at least two routes with two prompts each.
        default_route: the route of rows no other rule routes.
        probe_shrinkage: how far the probe's pooled covariance is shrunk toward a multiple of the identity.

    Runtime kwarg `route` (row scope): a route name per row (or one for every row), which wins over the router.
    Its routes' own runtime kwargs are declared too and reach them sliced to their rows.

    A decoding driver (at most one per pipeline); rows batch whatever the routes' controls are (a route whose
    controls do not batch decodes its rows one at a time); no slot refill. Runs wherever its routes' controls run,
    plus rollouts; the probe needs the live model (Hugging Face).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        routes: dict[str, list]
        router: Callable[..., Any] | None = None
        probe_data: list[dict] | None = None
        default_route: str | None = None
        probe_shrinkage: float = 0.05

        def validate(self) -> None:
            check_routes(self.routes)
            names = sorted(self.routes)
            if self.router is not None and self.probe_data is not None:
                raise ValueError(
                    "RoutedDecoding takes a router or probe_data, not both. Fix: keep the one that decides the route."
                )
            if self.default_route is not None and self.default_route not in self.routes:
                raise ValueError(
                    f"RoutedDecoding.default_route={self.default_route!r} is not a route ({names}). Fix: name a route."
                )
            for i, example in enumerate(self.probe_data or ()):
                if not isinstance(example, Mapping) or not {"prompt", "route"} <= set(example):
                    raise ValueError(
                        f"RoutedDecoding.probe_data[{i}] must be {{prompt, route}}; got {example!r}. "
                        "Fix: label each prompt with its route."
                    )
                if example["route"] not in self.routes:
                    raise ValueError(
                        f"RoutedDecoding.probe_data[{i}].route={example['route']!r} is not a route ({names}). "
                        "Fix: label prompts with the routes' names."
                    )
            if not 0 <= self.probe_shrinkage < 1:
                raise ValueError(
                    f"RoutedDecoding.probe_shrinkage must be in [0, 1); got {self.probe_shrinkage}. Fix: e.g. 0.05."
                )

    supports_batching = True
    supports_refill = False

    routes: dict[str, list]
    router: Callable[..., Any] | None
    probe_data: list[dict] | None
    default_route: str | None
    probe_shrinkage: float

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.last_routes: tuple[str, ...] = ()
        super().__init__(*args, **kwargs)

    def _configure(self) -> None:
        self._model: torch.nn.Module | None = None
        self._probe: LinearProbe | None = None
        nested = runtime_kwargs_schema(self.members())
        if ROUTE in nested:
            raise ValueError(f"A control of RoutedDecoding's routes declares the runtime kwarg {ROUTE!r}. Fix: rename.")
        own = {
            "name": ROUTE,
            "type": "str",
            "required": False,
            "scope": "row",
            "help": f"The route of each row (one of {sorted(self.routes)}); wins over the router.",
        }
        self.RUNTIME_KWARGS_SCHEMA = [own, *nested.values()]

    def members(self, route: str | None = None) -> list[OutputControl]:
        """The enabled controls of one route, or of every route."""
        names = self.routes if route is None else [route]
        return [c for name in names for c in self.routes[name] if c.enabled]

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        needs: set[Capability] = {Capability.SAMPLED_ROLLOUTS}
        for control in self.members():
            needs |= control.requirements()
        if self.probe_data is not None:
            needs |= {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE}
        return frozenset(needs)

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        return [
            f"route {name!r}: {type(c).__name__} {message}"
            for name in self.routes
            for c in self.members(name)
            for message in c.constraint_failures(backend_kind, hf_model_kwargs)
        ]

    def max_rollouts_per_query(self) -> int | None:
        """The most rollouts of any route (one for a route without a driver)."""
        bounds = []
        for name in self.routes:
            driver = _driver_of(self.members(name))
            bounds.append(1 if driver is None else driver.max_rollouts_per_query())
        return None if any(b is None for b in bounds) else max(bounds)

    # ------------------------------------------------------------------ steer
    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> None:
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        self.tokenizer = tokenizer
        prepared: list[BaseControl] = []
        try:
            for control in self.members():
                if getattr(control, "tokenizer", None) is None:
                    control.tokenizer = tokenizer
                control.steer(model, tokenizer=tokenizer, **kwargs)
                prepared.append(control)
            if self.probe_data is not None:
                if model is None:
                    raise RuntimeError(
                        "RoutedDecoding's probe reads the model's hidden states (probe_data). "
                        "Fix: use backend=huggingface, or route with a router= or the route runtime kwarg."
                    )
                rows = prompt_rows(tokenizer, [str(e["prompt"]) for e in self.probe_data])
                states = states_of_rows(model, rows, tokenizer.pad_token_id)
                labels = [str(e["route"]) for e in self.probe_data]
                self._probe = fit_linear_probe(states, labels, shrinkage=self.probe_shrinkage, owner="RoutedDecoding")
                self._model = model
        except BaseException:
            for control in prepared:
                control.cleanup()
            raise
        return None

    def cleanup(self) -> None:
        for control in self.members():
            control.cleanup()
        self._model, self._probe = None, None

    # ------------------------------------------------------------------ routing
    def choose(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, runtime_kwargs: Mapping[str, Any], tokenizer: Any
    ) -> list[str]:
        """The route of each row (see the class docstring for the order of the rules)."""
        batch = input_ids.shape[0]
        given = _given_routes(runtime_kwargs.get(ROUTE), batch)
        routes: list[str | None] = list(given)
        if self.router is not None and any(r is None for r in routes):
            texts = tokenizer.batch_decode(
                [row[mask.bool()] for row, mask in zip(input_ids.cpu(), attention_mask.cpu(), strict=True)],
                skip_special_tokens=True,
            )
            routes = [r if r is not None else self.router(text) for r, text in zip(routes, texts, strict=True)]
        if self._probe is not None and any(r is None for r in routes):
            predicted = self._probe.predict(last_token_states(self._model, input_ids, attention_mask))
            routes = [r if r is not None else p for r, p in zip(routes, predicted, strict=True)]
        chosen = []
        for i, route in enumerate(routes):
            route = self.default_route if route is None else route
            if route is None:
                raise ValueError(
                    f"RoutedDecoding could not route row {i}: no route runtime kwarg, and no router, probe or "
                    "default_route decided. Fix: set default_route, a router, probe_data, or the route runtime kwarg."
                )
            if route not in self.routes:
                raise ValueError(
                    f"RoutedDecoding: row {i} was routed to {route!r}, which is not a route ({sorted(self.routes)}). "
                    "Fix: return (or pass) one of the routes' names."
                )
            chosen.append(route)
        return chosen

    # ------------------------------------------------------------------ decode
    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        max_new_tokens: int | None = None,
        **gen_kwargs: Any,
    ) -> DriverResult:
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if tokenizer is None:
            raise ValueError("RoutedDecoding needs the model's tokenizer; pass tokenizer=.")
        budget = DEFAULT_MAX_NEW_TOKENS if max_new_tokens is None else int(max_new_tokens)
        owned = sorted(set(_OWNED_KWARGS) & set(gen_kwargs))
        if owned:
            raise ValueError(f"RoutedDecoding sets {owned} itself. Fix: remove them from the generate() call.")
        batch, pad = input_ids.shape[0], tokenizer.pad_token_id
        routes = self.choose(input_ids, attention_mask, runtime_kwargs, tokenizer)
        self.last_routes = tuple(routes)
        row_scoped = {n for n, scope in declared_scopes(self.members()).items() if scope == "row"}
        continuations: list[list[int]] = [[] for _ in range(batch)]
        for name in dict.fromkeys(routes):
            rows = [i for i, r in enumerate(routes) if r == name]
            controls = self.members(name)
            groups = [rows] if all(c.supports_batching for c in controls) else [[i] for i in rows]
            for group in groups:
                ids, mask = trim_left(input_ids[group], attention_mask[group])
                kwargs = _sliced(runtime_kwargs, batch, group, row_scoped)
                new = self._decode_route(controls, ids, mask, rollout, kwargs, tokenizer, budget, gen_kwargs)
                for row, tokens in zip(group, new, strict=True):
                    continuations[row] = tokens
            logger.debug("RoutedDecoding route %r: rows %s", name, rows)
        continuation = pad_right([torch.tensor([c], dtype=torch.long) for c in continuations], pad).to(input_ids)
        return DriverResult(torch.cat([input_ids, continuation], dim=1))

    def _decode_route(
        self,
        controls: Sequence[OutputControl],
        ids: torch.Tensor,
        mask: torch.Tensor,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        budget: int,
        gen_kwargs: Mapping[str, Any],
    ) -> list[list[int]]:
        """The continuations of one route's rows (without trailing pads)."""
        driver = _driver_of(controls)
        processors: list = []
        criteria: list = []
        for control in controls:
            if control is driver:
                continue
            processors += control.get_logits_processors(ids, runtime_kwargs, attention_mask=mask)
            criteria += control.get_stopping_criteria(ids, runtime_kwargs, attention_mask=mask)
        pad = tokenizer.pad_token_id
        if driver is None:
            passthrough = dict(gen_kwargs)
            passthrough.setdefault("do_sample", passthrough.get("temperature") not in (None, 0, 0.0))
            rows = [row[m.bool()].tolist() for row, m in zip(ids, mask, strict=True)]
            return roll_rows(
                rollout,
                rows,
                [budget] * len(rows),
                (),
                passthrough,
                pad,
                ids,
                mask,
                logits_processors=processors,
                stopping_criteria=criteria,
            )

        def route_rollout(
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            *,
            logits_processors: Iterable[Any] = (),
            stopping_criteria: Iterable[Any] = (),
            **kwargs: Any,
        ) -> torch.Tensor:
            return rollout(
                input_ids,
                attention_mask,
                logits_processors=[*processors, *logits_processors],
                stopping_criteria=[*criteria, *stopping_criteria],
                **kwargs,
            )

        result = driver.decode(
            ids,
            mask,
            rollout=route_rollout,
            runtime_kwargs=runtime_kwargs,
            tokenizer=tokenizer,
            max_new_tokens=budget,
            **gen_kwargs,
        )
        new = result.sequences[:, ids.shape[1] :].tolist()
        return [strip_trailing(row, pad)[0] for row in new]


def _driver_of(controls: Sequence[OutputControl]) -> DecodingDriver | None:
    return next((c for c in controls if isinstance(c, DecodingDriver)), None)


def _given_routes(value: Any, batch: int) -> list[str | None]:
    """The `route` runtime kwarg as one route name (or None) per row."""
    if value is None:
        return [None] * batch
    if isinstance(value, str):
        return [value] * batch
    values = row_values(value, batch)
    if values is None and isinstance(value, (list, tuple)) and len(value) == 1:
        values = list(value) * batch
    if values is None or not all(v is None or isinstance(v, str) for v in values):
        raise TypeError(
            f"RoutedDecoding: runtime kwarg {ROUTE!r} must be a route name, or one per row ({batch} rows); got "
            f"{value!r}. Fix: pass a string (or None) per row."
        )
    return list(values)


def _sliced(runtime_kwargs: Mapping[str, Any], batch: int, rows: Sequence[int], row_scoped: set[str]) -> dict:
    """The call's runtime kwargs for a subset of its rows: row-scoped per-row lists sliced, the rest as given."""
    out = dict(runtime_kwargs)
    out.pop(ROUTE, None)
    for name in row_scoped & set(out):
        values = row_values(out[name], batch)
        if values is not None:
            out[name] = [values[i] for i in rows]
    return out
