"""The backend seam: where generation runs (`BackendSpec`, the `Backend` base, and the kind registry).

A backend loads (or adopts) the model and tokenizer, generates continuations for a left-packed batch under
`GenerationParams`, applies a state control's hooks for the duration of a call when it runs in process, offers
rollouts to decoding drivers, and releases its memory. Backends live in `steer_hydra.backends` and are found
by kind here without importing them until needed (vLLM is an optional extra; a backend module imports it only
inside the functions that boot an engine, so importing a backend class stays cheap).

A kind has one spelling everywhere, the name of its config option: `huggingface`, `vllm`, `vllm_serve`. The older
inputs `hf` and `vllm-serve` are accepted and normalized to it.
"""

from __future__ import annotations

import contextlib
import importlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import HookSet
from steer_hydra.core.identity import canonical_json
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.source import ModelSource
from steer_hydra.core.tensors import eos_ids

BACKENDS: dict[str, str] = {
    "huggingface": "steer_hydra.backends.huggingface:HFBackend",
    "vllm": "steer_hydra.backends.vllm.offline:VLLMBackend",
    "vllm_serve": "steer_hydra.backends.vllm.serve:VLLMServeBackend",
}
# The kinds whose backend class checks its options before anything loads (`Backend.check_options`). Pre-flight
# imports no other backend module (the Hugging Face one imports transformers); a test pins this set to the classes
# that override the check.
CHECKS_OPTIONS = frozenset({"vllm", "vllm_serve"})
_ALIASES: dict[str, str] = {"hf": "huggingface", "vllm-serve": "vllm_serve"}  # older inputs, normalized on entry


def canonical_kind(kind: str) -> str:
    """Normalize a backend kind (`vllm-serve` -> `vllm_serve`, `hf` -> `huggingface`), naming the valid kinds
    on a typo."""
    canonical = _ALIASES.get(kind, kind)
    if canonical not in BACKENDS:
        raise ValueError(f"Unknown backend kind {kind!r}. Fix: use one of {list(BACKENDS)}.")
    return canonical


@dataclass(frozen=True, slots=True)
class BackendSpec:
    """A backend kind plus its options (engine kwargs, server URL...); `digest()` is its identity."""

    kind: str = "huggingface"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", canonical_kind(self.kind))
        object.__setattr__(self, "options", dict(self.options))

    @classmethod
    def coerce(cls, value: BackendSpec | str | Mapping[str, Any] | None) -> BackendSpec:
        """Accept a spec, a kind string, a `{kind, options}` mapping, or None (Hugging Face)."""
        if value is None:
            return cls()
        if isinstance(value, BackendSpec):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        if isinstance(value, Mapping):
            return cls(kind=value.get("kind", "huggingface"), options=value.get("options") or {})
        raise TypeError(f"backend must be a BackendSpec, a kind string or a mapping; got {value!r}.")

    def digest(self) -> str:
        return canonical_json({"kind": self.kind, "options": self.options})

    def check_options(self) -> list[str]:
        """Problems with the options found without loading anything (`Backend.check_options`), one line each;
        a kind outside `CHECKS_OPTIONS` has none, and its module is not imported."""
        if self.kind not in CHECKS_OPTIONS:
            return []
        return backend_class(self.kind).check_options(self.options)

    def protocol_options(self) -> dict[str, Any]:
        """The options that bear on what is generated, as the backend class declares (`Backend.protocol_options`):
        what a save_dir protocol records, so a changed server address or timeout does not count as a new protocol."""
        return backend_class(self.kind).protocol_options(self.options)

    def keeps_resident(self) -> bool:
        """Whether the backend keeps what it loads resident itself (`Backend.keeps_resident`)."""
        return backend_class(self.kind).keeps_resident


def backend_class(kind: str) -> type[Backend]:
    """Import and return the backend class registered for `kind` (no heavy imports happen here)."""
    module_name, _, attr = BACKENDS[canonical_kind(kind)].partition(":")
    return getattr(importlib.import_module(module_name), attr)


class Backend(ABC):
    """Base of every backend. Subclasses set `kind` and implement `load` and `generate`.

    What a subclass declares (class attributes, read by the pipeline and `check()`; the defaults say "no"):
        kind: its registry name (`BACKENDS`).
        capabilities: the `Capability` atoms it offers to controls (`check()` compares them with each control's
            `requirements()`, through `requirements_of`).
        native_n: it produces `n` candidates per prompt itself (else the pipeline repeats rows).
        batches_distinct_seeds: rows with different seeds can share one call (else the pipeline decodes them
            serially).
        supports_refill: it implements `refill_engine` (slot refill between decode steps).
        streams: concurrent `generate` calls from several threads are safe and its engine batches them itself
            (continuous batching across calls), so the provider may hand it each request as it arrives.
        keeps_resident: it keeps what it loads resident for the next job itself (`core.resident`: `take` of its
            own key, which frees any other base first, and `keep` when it closes), so a sweep must not drop the
            resident base before it loads.
    And what it overrides when the default does not fit: `protocol_options` (which options bear on generation),
    `rollout` (decoding drivers), `requirements_of`, `steer_control`, `state_hooks` and `applied` (how state
    controls run on it), `ready` (start an engine once the controls are prepared), `fit_ahead` (that preparation
    done for many jobs at once, before any engine starts), `identity`, `release`.
    """

    kind: ClassVar[str]
    capabilities: ClassVar[frozenset[Capability]] = frozenset()
    native_n: ClassVar[bool] = False
    batches_distinct_seeds: ClassVar[bool] = False
    supports_refill: ClassVar[bool] = False
    streams: ClassVar[bool] = False
    keeps_resident: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        self.options = dict(options or {})
        self.model: torch.nn.Module | None = None
        self.tokenizer: Any = None

    @abstractmethod
    def load(self, source: ModelSource, *, model: Any = None, tokenizer: Any = None) -> None:
        """Load `source`, or adopt the preloaded `model`/`tokenizer` (sets `self.model`, possibly None, and
        `self.tokenizer`)."""

    @abstractmethod
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        params: GenerationParams,
        *,
        seeds: Sequence[int | None],
        logits_processors: Sequence[Any] = (),
        stopping_criteria: Sequence[Any] = (),
    ) -> torch.Tensor:
        """Continuations `[rows * n, new]` for a left-packed batch, right-padded with the pad id.

        `seeds` has one entry per row; they are all equal unless `batches_distinct_seeds`.
        """

    def rollout(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        logits_processors: Sequence[Any] = (),
        stopping_criteria: Sequence[Any] = (),
        stop_strings: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        **gen_kwargs: Any,
    ) -> torch.Tensor:
        """Prompt plus continuation rows, `model.generate`-style, for decoding drivers."""
        raise NotImplementedError(f"Backend {self.kind!r} offers no rollouts to decoding drivers.")

    def refill_engine(self, max_rows: int, build_hooks: Any) -> Any:
        """An engine whose decode slots are refilled between steps (see `steer_hydra.backends.refill`); only
        backends that declare `supports_refill` implement it."""
        raise NotImplementedError(
            f"Backend {self.kind!r} has no refill engine (supports_refill is False). Fix: use static batching "
            "(ProviderOptions.batching='static' or 'auto'), or backend=huggingface."
        )

    # "resident" when load() took what an earlier job of this process left (`core.resident`), "loaded" when it
    # loaded or booted its own, None for a backend that does neither (it was given its model, or it is a server)
    residency: str | None = None

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """Problems with this backend's `backend.options` found before anything loads (they validate, the backend's
        extra is installed, a server answers within a bound), each one line naming the key, the value and the fix;
        the app's pre-flight reports them with every other config problem. Default: none."""
        return []

    @classmethod
    def protocol_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """The options that bear on what is generated, for a save_dir protocol (default: all of them). A backend
        whose options include transport settings (an address, timeouts, concurrency) leaves those out."""
        return dict(options)

    @classmethod
    def fits_vectors_with(cls, options: Mapping[str, Any] | None) -> bool:
        """Whether a job of this backend with these options fits a layer-vector control's vector on a Hugging Face
        load of its own before its engine starts (so `fit_ahead` has work). Default: no."""
        return False

    @classmethod
    def fit_ahead(cls, controls: Sequence[Any], source: ModelSource, options: Mapping[str, Any]) -> list[Path]:
        """Fit now, on one model load, what jobs of this backend with `options` on `source` would fit from
        `controls` before their engine starts, into the cache those jobs read; returns the files written. Default:
        nothing (a backend that fits in the job's own model, as Hugging Face does, has nothing to fit ahead)."""
        return []

    @classmethod
    def requirements_of(cls, control: Any, options: Mapping[str, Any] | None = None) -> frozenset[Capability]:
        """What `control` needs on this backend with these `options`: its own `requirements()` unless the backend
        lowers it itself."""
        return control.requirements()

    def steer_control(self, control: Any, tokenizer: Any, **steer_kwargs: Any) -> Any:
        """Prepare one enabled control after `load()` (default: the control's `steer()` on the live model, with
        `load_model`, this backend's `load_auxiliary_model`, for a control that needs a second model)."""
        return control.steer(
            self.model, tokenizer=tokenizer, backend=self.kind, load_model=self.load_auxiliary_model, **steer_kwargs
        )

    def load_auxiliary_model(
        self, reference: str, *, head: str = "causal_lm", with_tokenizer: bool = False
    ) -> torch.nn.Module | tuple[torch.nn.Module, Any]:
        """A second model loaded beside the model, in this process, with the model's device and dtype: a causal LM
        (`head="causal_lm"`, e.g. a contrastive decoding amateur) or a sequence classifier
        (`head="sequence_classification"`, e.g. a reward model). `with_tokenizer=True` returns `(model, tokenizer)`
        with the reference's own tokenizer. Backends without an in-process model refuse."""
        raise RuntimeError(
            f"Backend {self.kind!r} cannot load a second model ({reference!r}) in this process. "
            "Fix: use backend=huggingface."
        )

    def ready(self) -> None:
        """Called once every control is prepared, before any generation: a backend that starts its engine only
        then (so that preparing controls, e.g. fitting a vector on another model, never shares the device with
        it) starts it here. Default: nothing."""
        return None

    def state_hooks(
        self, control: Any, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any
    ) -> HookSet:
        """A state control's hook set for one call (default: the control's own `get_hooks`)."""
        return control.get_hooks(input_ids, runtime_kwargs, **kwargs)

    @contextlib.contextmanager
    def applied(self, hooks: Sequence[HookSet]) -> Iterator[None]:
        """Keep `hooks` active for the body; backends without a live model accept only empty hook sets."""
        if any(any(h.get(k) for k in ("pre", "forward", "backward", "context")) for h in hooks):
            raise RuntimeError(f"Backend {self.kind!r} cannot apply in-process hooks; use backend=huggingface.")
        yield

    @contextlib.contextmanager
    def seeded(self, seed: int | None) -> Iterator[None]:
        """Seed torch's RNG for the body and restore the global state afterwards (no-op for None)."""
        if seed is None:
            yield
            return
        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed)
            yield

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokenizer's eos id plus the model generation config's."""
        config = getattr(self.model, "generation_config", None)
        return eos_ids(getattr(self.tokenizer, "eos_token_id", None), getattr(config, "eos_token_id", None))

    @property
    def device(self) -> torch.device:
        """Where input tensors go."""
        if self.model is not None:
            return self.model.get_input_embeddings().weight.device
        return torch.device("cpu")

    def release(self) -> None:
        """Free the model and any engine; safe to call twice."""
        self.model = None

    def identity(self) -> dict[str, Any] | None:
        """What a save_dir protocol records about the loaded backend beyond its options (e.g. the model a server
        serves), or None when the options say it all."""
        return None
