"""Control base classes for the four categories, Args validation, runtime-kwarg declarations and their merge.

A control is one steering method. Its constructor arguments are a frozen `Args` dataclass (validated at
construction: types, then `Args.validate()` for ranges), mirrored onto the instance. Categories:

- `InputControl`: rewrites the prompt (`adapt_messages` before the chat template, `adapt` on token ids).
- `StateControl`: returns hooks for one call (`get_hooks`); the backend registers them for that call only.
- `OutputControl`: logits processors and stopping criteria per call, or generation params lowered into the
  call (`export_generation_params`); `DecodingDriver` owns the whole decode loop (at most one per pipeline).
- `StructuralControl`: replaces the model at `steer()` (weights, adapters).

Controls never register hooks themselves and never call `generate`. What a subclass declares, on these base
classes (the defaults are the conservative answer), is all that the pipeline, the backends and the evaluation
layer read about it:
- `requirements()`: the capability atoms a backend must offer (checked by `SteeringPipeline.check()`), and
  `constraint_failures()` for further verdicts on a configuration;
- `supports_batching`: rows of different prompts may share one call (else the provider sends one at a time);
- `supports_refill`: its hooks stay right when built on a refill engine's layout prompt (see
  `steer_hydra.backends.refill`), so slot refill may run it;
- `RUNTIME_KWARGS_SCHEMA`: the per-call or per-row arguments it reads;
- `vector_hash`: the content hash of a steering vector it uses beyond its Args (None when none), and
  `provenance()`: what it chose or built at `steer()` (e.g. an optimized instruction), as JSON values;
- `references(args)`: every second model, adapter or file its arguments name that `steer()` loads or reads (a
  `Reference` per argument: an amateur or expert model, a reward model or classifier, a LoRA folder, a checkpoint,
  a concept file), so the app resolves and checks each one before the main model loads;
- state controls only: `adds_residual` with `residual_edits()` (or `residual_addition()` for one), when the
  control's whole effect is fixed edits of decoder layers' residual streams (additions, projections, rotations,
  head-slice additions, per-row gates), so a backend that runs no hooks (vLLM) can apply them itself.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import logging
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypedDict

import torch

from steer_hydra.core.capabilities import Capability

logger = logging.getLogger(__name__)

SCOPES = ("row", "call")


class HookSpec(TypedDict):
    """One hook: the dotted path of a module in the model and the function to register on it."""

    module: str
    hook_func: Callable[..., Any]


class HookSet(TypedDict, total=False):
    """What a state control wants active during one call.

    `pre` hooks are registered with `register_forward_pre_hook(with_kwargs=True)` (they receive
    `(module, args, kwargs)` and may return `(args, kwargs)`), `forward` hooks with
    `register_forward_hook(with_kwargs=True)` (`(module, args, kwargs, output)`), `backward` hooks as full
    backward hooks, and each `context` factory is entered for the call (e.g. to publish per-call data in a
    ContextVar read by a custom attention function).
    """

    pre: list[HookSpec]
    forward: list[HookSpec]
    backward: list[HookSpec]
    context: list[Callable[[], AbstractContextManager[Any]]]


@dataclass(frozen=True)
class BaseArgs:
    """Base of every control's `Args`: field types are checked at construction, then `validate()` runs."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            hint = hints.get(f.name, Any)
            if not _matches(value, hint):
                raise TypeError(
                    f"{_owner(self)}.{f.name} must be {_describe(hint)}; got {value!r} ({type(value).__name__})."
                )
        self.validate()

    def validate(self) -> None:
        """Check value ranges; raise ValueError naming the field and the fix."""


def _owner(args: BaseArgs) -> str:
    qual = type(args).__qualname__
    return qual.rsplit(".", 1)[0] if qual.endswith(".Args") else qual


def _matches(value: Any, hint: Any) -> bool:
    """Shallow structural check of `value` against a type hint (unknown hints accept anything)."""
    if hint is Any or hint is object:
        return True
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is Literal:
        return value in args
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is collections.abc.Callable or hint is collections.abc.Callable:
        return callable(value)
    if origin in (list, tuple, collections.abc.Sequence):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            return False
        inner = [a for a in args if a is not Ellipsis]
        return len(inner) != 1 or all(_matches(v, inner[0]) for v in value)
    if origin in (dict, collections.abc.Mapping):
        return isinstance(value, Mapping)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return f"one of {typing.get_args(hint)}"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


ReferenceKind = Literal["model", "classifier", "adapter", "concept", "file"]


@dataclass(frozen=True, slots=True)
class Reference:
    """A model or file a control's argument names, which its `steer()` loads or reads.

    Attributes:
        value: the reference as given (a Hub id, a local folder or file, a built-in `steer_hydra:` reference, a
            concept name).
        kind: `model` (a causal LM: an amateur, an expert, a checkpoint, a merge input), `classifier` (a sequence
            classifier: a reward or value model, whose head must have been trained), `adapter` (a PEFT LoRA folder),
            `concept` (a built-in concept or a concept file) or `file` (any other file that must exist).
    """

    value: str
    kind: ReferenceKind = "model"


class BaseControl:
    """Shared behaviour of every control: Args mirroring, `enabled`, declarations and lifecycle hooks.

    Class attributes a subclass declares: `Args`, `RUNTIME_KWARGS_SCHEMA`, `supports_batching` and
    `supports_refill` (see the module docstring).
    """

    Args: ClassVar[type[BaseArgs] | None] = None
    RUNTIME_KWARGS_SCHEMA: ClassVar[list[dict[str, Any]]] = []
    supports_batching: ClassVar[bool] = False
    supports_refill: ClassVar[bool] = False
    category: ClassVar[str] = "base"

    def __init__(self, *args: Any, enabled: bool = True, **kwargs: Any) -> None:
        if self.Args is None:
            if args or kwargs:
                raise TypeError(f"{type(self).__name__} takes no arguments; got {args or ''}{kwargs or ''}.")
            self.args = None
        else:
            names = [f.name for f in dataclasses.fields(self.Args)]
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise TypeError(f"{type(self).__name__} got unknown argument(s) {unknown}; valid arguments: {names}.")
            try:
                self.args = self.Args(*args, **kwargs)
            except TypeError as error:
                if "missing" in str(error):
                    raise TypeError(f"{type(self).__name__}: {error}; valid arguments: {names}.") from error
                raise
            for name in names:
                if not isinstance(getattr(type(self), name, None), property):
                    setattr(self, name, getattr(self.args, name))
        self.enabled = bool(enabled)
        self.tokenizer = getattr(self, "tokenizer", None)
        self._configure()

    def _configure(self) -> None:
        """Map Args onto generic fields (presets override this)."""

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module | None:
        """Prepare the control (fit vectors, register attention functions...); return a model to replace it."""
        return None

    def cleanup(self) -> None:
        """Undo anything `steer()` installed (called when the pipeline is released)."""

    def requirements(self) -> frozenset[Capability]:
        """Capabilities the backend must offer for this control to run at generate time."""
        return frozenset({Capability.IN_PROCESS_TORCH})

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        """Further verdicts on a configuration (e.g. an attention implementation); each names the fix."""
        return []

    @property
    def vector_hash(self) -> str | None:
        """The content hash of a steering vector this control uses beyond its Args (given or fitted at `steer()`),
        recorded in provenance; None when it uses none (or before `steer()`)."""
        return None

    def provenance(self) -> dict[str, Any]:
        """What this control chose or built at `steer()` beyond its Args (an optimized instruction, a trained adapter's
        cache entry and training record), as JSON values for a job's provenance; {} by default and before
        `steer()`."""
        return {}

    def arg_values(self) -> dict[str, Any]:
        """The Args fields by name (not copied: a scorer or a model in an argument stays one object)."""
        return {f.name: getattr(self.args, f.name) for f in dataclasses.fields(self.args)} if self.args else {}

    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """Digests of the files these constructor arguments name whose content belongs to the configuration's
        identity (e.g. an adapter's weights), so a changed file gives a new configuration id; {} by default."""
        return {}

    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The second models and files these constructor arguments name that `steer()` loads or reads, keyed by the
        argument (`"amateur"`, `"models[1]"`), so they are resolved and checked before any model loads; {} by default.
        Read from the arguments as given (the control is not built), and only what they name: a missing or
        malformed argument is left to `Args` validation."""
        return {}

    def descriptor(self) -> dict[str, Any]:
        """The control's identity for configuration digests: class, canonical args, enabled (and the content digests
        of files its args name)."""
        return {
            "control": f"{type(self).__module__}.{type(self).__qualname__}",
            "args": self.arg_values(),
            "enabled": self.enabled,
            **type(self).content_digests(self.arg_values()),
        }

    def canonical_form(self) -> dict[str, Any]:
        """The identity of a control held in another control's arguments (e.g. a route of a router): its
        descriptor."""
        return self.descriptor()

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.arg_values().items())
        suffix = "" if self.enabled else ", enabled=False"
        return f"{type(self).__name__}({args}{suffix})"


class InputControl(BaseControl):
    """Rewrites the prompt. Runs on every backend (the tokenizer is client-side)."""

    category = "input"

    def adapt_messages(
        self, messages_batch: list[list[dict[str, str]]], runtime_kwargs: Mapping[str, Any]
    ) -> list[list[dict[str, str]]] | None:
        """Rewrite a batch of chats before the template; return None to be handled by `adapt` instead."""
        return None

    def adapt(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any]) -> torch.Tensor | list[list[int]]:
        """Rewrite token ids (`[batch, seq]`, left-padded) when the message phase did not handle this control."""
        raise NotImplementedError(f"{type(self).__name__} must implement adapt().")

    def requirements(self) -> frozenset[Capability]:
        return frozenset()


@dataclass(frozen=True, slots=True)
class ResidualAddition:
    """A fixed edit of one decoder layer's residual stream (or of its attention heads' outputs), the same on every
    call and every prompt row: an addition, the projection of one direction out of it, a rotation in a plane, or
    the reading of a condition that gates other edits per prompt row.

    Attributes:
        layer: decoder layer index.
        site: `output` (after the layer), `input` (before it), `attention` (the attention block's output, before
            it joins the stream) or `heads` (the attention heads' concatenated outputs, the input of the
            attention's output projection: `[heads * head_dim]` wide, one slice per head).
        mode: `from` (row 0 added at every position >= the start), `block` (row t added at position start + t),
            `project` (row 0 is a unit direction r; `h <- h - (h.r) r` at every position >= the start),
            `rotate` (rows 0 and 1 are an orthonormal basis of a plane; the stream's component in it is rotated
            by `angle`, from row 0 toward row 1, at every position >= the start; the norm is kept), `rotate_to`
            (the same plane component set to the angle `angle` from row 0, its length kept), or `condition`
            (row 0 is a unit direction c; nothing is edited: the mean of the stream over the prompt's positions,
            those before the start, decides the gate named `gate` for that prompt row, open when
            `|m.c| / |m|` (the cosine of m with its projection on c) compares to `threshold` as `comparison` says).
        rows: `[R, width]` float32 on the CPU, at strength (any multiplier, normalisation or unit applied).
        scope: how the start follows from a prompt's length: `after_prompt` (the first generated token), `all`,
            `last_k` (the prompt's last `last_k` tokens and after) or `position` (`offset` tokens after the first
            prompt token).
        preserve_norm: rescale each steered state back to its norm before the addition.
        angle: the rotation (`rotate`) or target angle (`rotate_to`), in radians.
        gate: for a `condition`, the name of the gate it decides; for any other edit, the gate that must be open for
            it to apply to a row (None: ungated). A gated edit's scope is `after_prompt`, so every gate is decided on
            the prompt before the edits it gates act.
        threshold, comparison: a `condition`'s decision rule.
    """

    layer: int
    site: Literal["output", "input", "attention", "heads"]
    mode: Literal["from", "block", "project", "rotate", "rotate_to", "condition"]
    rows: torch.Tensor
    scope: Literal["after_prompt", "all", "last_k", "position"]
    last_k: int = 0
    offset: int = 0
    preserve_norm: bool = False
    angle: float = 0.0
    gate: str | None = None
    threshold: float = 0.0
    comparison: Literal[">", "<"] = ">"

    def start(self, prompt_length: int) -> int:
        """The first steered position of a prompt row with `prompt_length` real tokens."""
        if self.scope == "after_prompt":
            return prompt_length
        if self.scope == "last_k":
            return max(prompt_length - self.last_k, 0)
        if self.scope == "all":
            return 0
        return self.offset


class StateControl(BaseControl):
    """Changes the model's internal state during a call through hooks the backend registers and removes.

    A control whose whole effect is fixed `ResidualAddition` edits sets `adds_residual` and implements
    `residual_addition()` (one addition: CAA, ActAdd) or `residual_edits()` (several, e.g. DirectionalAblation's
    projections): a backend without a live model applies those edits itself instead of the hooks.
    """

    category = "state"
    adds_residual: ClassVar[bool] = False

    def get_hooks(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> HookSet:
        """Hooks for one call on the left-packed `input_ids` (kwargs: attention_mask, model, gen params)."""
        raise NotImplementedError(f"{type(self).__name__} must implement get_hooks().")

    def residual_addition(self) -> ResidualAddition | None:
        """The addition this control makes on every call once steered, exactly as its hooks make it (None when it
        adds nothing, e.g. at multiplier 0). Implemented by controls that declare `adds_residual`."""
        raise NotImplementedError(
            f"{type(self).__name__} does not declare adds_residual: its effect is not one fixed residual-stream "
            "addition. Fix: run it on backend=huggingface (hooks)."
        )

    def residual_edits(self) -> tuple[ResidualAddition, ...]:
        """Every edit this control makes on every call once steered, in application order (default: its one
        `residual_addition()`, none when that is None)."""
        addition = self.residual_addition()
        return () if addition is None else (addition,)


class OutputControl(BaseControl):
    """Acts on decoding: per-step processors and criteria, or parameters lowered into the call."""

    category = "output"
    include_in_scoring: ClassVar[bool] = True

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        """Fresh `LogitsProcessor`s for one call."""
        return []

    def get_stopping_criteria(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        """Fresh `StoppingCriteria` for one call."""
        return []

    def export_generation_params(self, runtime_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Parameters to merge into the call (stops, budgets); when non-empty, live processors are skipped."""
        return {}


@dataclass(frozen=True, slots=True)
class RequestFields:
    """Per-row request fields an output control hands an engine backend in place of a live logits processor.

    `OutputControl.get_logits_processors` may return one among its processors on an engine backend (vLLM): the
    backend takes it out of the processor list and merges `rows[i]` into the request of prompt row i (every
    candidate of that row's `n` shares it). An empty mapping leaves a row's request as it is.
    """

    rows: tuple[Mapping[str, Any], ...]

    def for_prompts(self, count: int) -> list[Mapping[str, Any]]:
        """The fields of `count` prompt rows: one per row, or each row's fields repeated for the `count / rows`
        consecutive prompt rows a decoding driver's rollout makes of it (a single row serves any count)."""
        rows = len(self.rows)
        if rows == count:
            return list(self.rows)
        if rows == 1 or (rows and count % rows == 0):
            repeat = count // rows
            return [self.rows[i // repeat] for i in range(count)]
        raise ValueError(
            f"RequestFields holds {rows} rows but the engine call has {count} prompt rows; a control must hand one "
            "mapping per prompt row of the call it was built for."
        )


@dataclass(slots=True)
class DriverResult:
    """What a decoding driver returns: prompt plus continuation rows (left-packed prompt, right-padded)."""

    sequences: torch.Tensor


class DecodingDriver(OutputControl):
    """Owns the decode loop. At most one enabled per pipeline.

    `decode` must roll out only through `rollout(input_ids, attention_mask, **gen_kwargs) -> sequences`
    (prompt plus continuation, like `model.generate`), which applies every other control's hooks, processors
    and criteria on each forward and counts the tokens rolled out; `stop_strings=` adds the driver's own stop
    strings (e.g. a closing tag) to the call's, and `logits_processors=` / `stopping_criteria=` the driver's own
    processors and criteria (after the call's).
    """

    def decode(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        rollout: Callable[..., torch.Tensor],
        runtime_kwargs: Mapping[str, Any],
        tokenizer: Any,
        max_new_tokens: int,
        **gen_kwargs: Any,
    ) -> DriverResult:
        raise NotImplementedError(f"{type(self).__name__} must implement decode().")

    def max_rollouts_per_query(self) -> int | None:
        """A static bound on full-sequence rollouts per prompt, when one exists."""
        return None


class StructuralControl(BaseControl):
    """Replaces the model at `steer()` (merged weights, adapters); batch-safe by default."""

    category = "structural"
    supports_batching = True
    # True for a control that edits the model it is given in place and restores it exactly at release (a LoRA
    # adapter): it runs on a shared or resident base instead of loading a model of its own
    restores_base = False

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must implement steer() and return the model.")


CATEGORY_ORDER = ("structural", "input", "state", "output")
_CATEGORY_BASES: dict[str, type[BaseControl]] = {
    "structural": StructuralControl,
    "input": InputControl,
    "state": StateControl,
    "output": OutputControl,
}


@dataclass(slots=True)
class ControlSet:
    """Controls sorted by category, list order kept within each."""

    structural: list[StructuralControl] = field(default_factory=list)
    input: list[InputControl] = field(default_factory=list)
    state: list[StateControl] = field(default_factory=list)
    output: list[OutputControl] = field(default_factory=list)

    def all(self) -> list[BaseControl]:
        """Every control, in category order."""
        return [*self.structural, *self.input, *self.state, *self.output]

    def enabled(self) -> list[BaseControl]:
        """Enabled controls, in category order."""
        return [c for c in self.all() if c.enabled]

    def drivers(self) -> list[DecodingDriver]:
        """Enabled decoding drivers (a valid pipeline has at most one)."""
        return [c for c in self.output if c.enabled and isinstance(c, DecodingDriver)]


def merge_controls(controls: Iterable[BaseControl]) -> ControlSet:
    """Sort controls into categories; reject non-controls and the same instance twice."""
    merged = ControlSet()
    seen: set[int] = set()
    for control in controls:
        if not isinstance(control, BaseControl):
            raise TypeError(
                f"controls must be steer_hydra controls (subclasses of InputControl, StateControl, OutputControl "
                f"or StructuralControl); got {control!r} ({type(control).__name__})."
            )
        if id(control) in seen:
            raise ValueError(f"The same {type(control).__name__} instance appears twice in controls; build two.")
        seen.add(id(control))
        for name in CATEGORY_ORDER:
            if isinstance(control, _CATEGORY_BASES[name]):
                getattr(merged, name).append(control)
                break
        else:
            raise TypeError(f"{type(control).__name__} derives from BaseControl but from no category base.")
    return merged


def runtime_kwargs_schema(controls: Iterable[BaseControl]) -> dict[str, dict[str, Any]]:
    """Merge the enabled controls' `RUNTIME_KWARGS_SCHEMA` entries by name (a missing scope means `call`).

    Raises ValueError on an invalid scope, and when two controls declare one name with a different scope or type.
    """
    merged: dict[str, dict[str, Any]] = {}
    owners: dict[str, str] = {}
    for control in controls:
        if not getattr(control, "enabled", True):
            continue
        for raw in getattr(control, "RUNTIME_KWARGS_SCHEMA", None) or ():
            entry = {"scope": "call", **raw}
            name, scope = entry["name"], entry["scope"]
            owner = type(control).__name__
            if scope not in SCOPES:
                raise ValueError(f"{owner} declares runtime kwarg {name!r} with scope {scope!r}; use 'row' or 'call'.")
            if name in merged:
                previous = merged[name]
                for key in ("scope", "type"):
                    if previous.get(key) != entry.get(key):
                        raise ValueError(
                            f"Runtime kwarg {name!r} is declared with {key} {previous.get(key)!r} by {owners[name]} "
                            f"and {entry.get(key)!r} by {owner}; controls sharing a name must agree. Rename one."
                        )
                continue
            merged[name] = entry
            owners[name] = owner
    return merged


def declared_scopes(controls: Iterable[BaseControl]) -> dict[str, str]:
    """`{name: scope}` of every runtime kwarg the enabled controls declare."""
    return {name: entry["scope"] for name, entry in runtime_kwargs_schema(controls).items()}


def row_values(value: Any, batch_size: int) -> Sequence[Any] | None:
    """The per-row list of a row-scoped value when it is one, else None (a broadcast value)."""
    if isinstance(value, (list, tuple)) and len(value) == batch_size:
        return value
    return None
