"""`SteeringPipeline`: a base model plus controls, steered once, generating from text, chats or token ids.

Invariants:
- construction does no I/O; `steer()` loads, checks and prepares every control once;
- prompts are left-packed before any hook is built, so every row's continuation follows its last real token
  and prompt-relative positions share one anchor (the padded prompt length);
- hooks exist only for the duration of one call (or one serial row, or one driver decode);
- seeded sampling runs under a forked RNG: the caller's global RNG state is unchanged.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from steer_hydra.core.backend import Backend, BackendSpec, backend_class
from steer_hydra.core.capabilities import SupportFailure, SupportReport, UnsupportedPipelineError
from steer_hydra.core.controls import (
    BaseControl,
    ControlSet,
    DecodingDriver,
    HookSet,
    OutputControl,
    declared_scopes,
    merge_controls,
    row_values,
    runtime_kwargs_schema,
)
from steer_hydra.core.identity import derive_item_seed
from steer_hydra.core.output import Output, infer_finish_reasons, truncate_at_stop_strings
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.rendering import encode_lock, has_chat_template
from steer_hydra.core.source import ModelSource
from steer_hydra.core.tensors import left_pack, pad_left, pad_right, strip_trailing, trim_left

logger = logging.getLogger(__name__)

RESERVED_TEMPLATE_KWARGS = frozenset({"add_generation_prompt", "tokenize", "return_dict", "return_tensors", "padding"})
_SEED_OP = "generate"


@dataclass(slots=True)
class _Prompt:
    """A tokenized, adapted, left-packed batch and how the caller gave it."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    source: str
    single: bool


@dataclass(slots=True)
class SteeringPipeline:
    """A base model plus input, state, output and structural controls.

    Args:
        source: where the model and tokenizer come from and how they load: a `ModelSource`, or a model
            reference string (Hugging Face id, local path or `steer_hydra:tiny`), loaded in `steer()`.
        controls: any number per category; list order is composition order within a category.
        backend: a `BackendSpec`, a kind string ("huggingface", "vllm", "vllm_serve") or None (Hugging Face).
        model, tokenizer: preloaded objects reused by `steer()` (the tokenizer gets a pad token and left padding).
    """

    source: ModelSource | str | None = None
    controls: Sequence[BaseControl] = ()
    backend: BackendSpec | str | None = None
    model: Any = None
    tokenizer: Any = None
    _sets: ControlSet = field(init=False, repr=False)
    _backend: Backend | None = field(init=False, default=None, repr=False)
    _is_steered: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        self.source = ModelSource.coerce(self.source)
        self.controls = list(self.controls)
        self._sets = merge_controls(self.controls)
        self.backend = BackendSpec.coerce(self.backend)
        runtime_kwargs_schema(self.controls)  # surfaces declaration conflicts at construction
        if (
            self.backend.kind == "huggingface"
            and self.model is None
            and self.source.model_name_or_path is None
            and not self._sets.structural
        ):
            raise ValueError(
                "SteeringPipeline needs a model. Fix: pass a model reference (or ModelSource) as source=, "
                "or a preloaded model=."
            )
        if self.tokenizer is not None:
            self._inject_tokenizer()

    # ------------------------------------------------------------------ properties
    @property
    def is_steered(self) -> bool:
        """Whether `steer()` has run (generation is allowed)."""
        return self._is_steered

    @property
    def state_controls(self) -> list:
        return list(self._sets.state)

    @property
    def output_controls(self) -> list:
        return list(self._sets.output)

    @property
    def supports_batching(self) -> bool:
        """True when every enabled control declares `supports_batching` (an empty pipeline batches)."""
        return all(c.supports_batching for c in self._sets.enabled())

    @property
    def backend_kind(self) -> str:
        return self.backend.kind

    def backend_identity(self) -> dict[str, Any] | None:
        """The loaded backend's `identity()` (e.g. the served model of `vllm_serve`); None before `steer()`."""
        return self._backend.identity() if self._backend is not None else None

    # ------------------------------------------------------------------ check and steer
    def check(self, backend: BackendSpec | str | None = None) -> SupportReport:
        """Evaluate every enabled control against the backend; pure (no I/O, nothing loaded)."""
        spec = BackendSpec.coerce(backend) if backend is not None else self.backend
        backend_cls = backend_class(spec.kind)
        capabilities = backend_cls.capabilities
        failures: list[SupportFailure] = []
        drivers = self._sets.drivers()
        if len(drivers) > 1:
            names = ", ".join(type(d).__name__ for d in drivers)
            for driver in drivers[1:]:
                failures.append(
                    SupportFailure(
                        type(driver).__name__,
                        "generate",
                        f"only one DecodingDriver may be enabled per pipeline; found {names}. "
                        "Fix: keep one driver (pass enabled=False to the others) or evaluate them as separate arms.",
                    )
                )
        for control in self._sets.enabled():
            name = type(control).__name__
            missing = backend_cls.requirements_of(control, spec.options) - capabilities
            if missing:
                atoms = ", ".join(sorted(m.value for m in missing))
                failures.append(
                    SupportFailure(
                        name,
                        "generate",
                        f"needs {atoms}, which backend {spec.kind!r} does not offer. "
                        f"Fix: use backend=huggingface, or remove {name} from this arm.",
                    )
                )
            for message in control.constraint_failures(spec.kind, self.source.hf_model_kwargs):
                failures.append(SupportFailure(name, "generate", message))
        return SupportReport(backend=spec.kind, failures=tuple(failures))

    def steer(self, **steer_kwargs: Any) -> SteeringPipeline:
        """Load the model, check support, and prepare each enabled control (structural, input, state, output).

        A second call is a no-op. Raises `UnsupportedPipelineError` when `check()` reports failures.
        """
        if self._is_steered:
            return self
        schema = runtime_kwargs_schema(self.controls)
        shared = [
            name
            for name in schema
            if sum(any(e.get("name") == name for e in c.RUNTIME_KWARGS_SCHEMA) for c in self._sets.enabled()) > 1
        ]
        for name in shared:
            warnings.warn(f"Runtime kwarg {name!r} is read by several controls of this pipeline.", stacklevel=2)
        report = self.check()
        if not report.ok:
            raise UnsupportedPipelineError(report)
        backend = backend_class(self.backend.kind)(self.backend.options)
        given_model, given_tokenizer = self.model, self.tokenizer
        try:
            backend.load(self.source, model=self.model, tokenizer=self.tokenizer)
            self.model, self.tokenizer = backend.model, backend.tokenizer
            self._inject_tokenizer()
            for control in self._sets.enabled():
                replaced = backend.steer_control(control, self.tokenizer, **steer_kwargs)
                if isinstance(replaced, torch.nn.Module):
                    backend.model = self.model = replaced
            backend.ready()
        except BaseException:
            backend.release()
            self.model, self.tokenizer = given_model, given_tokenizer  # a failed steer keeps no loaded model
            raise
        self._backend = backend
        self._is_steered = True
        return self

    def _inject_tokenizer(self) -> None:
        for control in self.controls:
            if getattr(control, "tokenizer", None) is None:
                control.tokenizer = self.tokenizer

    # ------------------------------------------------------------------ release
    @property
    def residency(self) -> str | None:
        """Whether the steered backend took a resident model or engine ("resident") or loaded its own ("loaded")."""
        return self._backend.residency if self._backend is not None else None

    def release(self) -> None:
        """Run each control's cleanup, free the backend (model memory); the pipeline can be steered again."""
        if self._backend is not None:
            for control in self._sets.enabled():
                control.cleanup()
            self._backend.release()
            self._backend = None
        self.model = None
        self._is_steered = False

    def __enter__(self) -> SteeringPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        inputs: Any = None,
        attention_mask: Any = None,
        runtime_kwargs: Mapping[str, Any] | None = None,
        return_output: bool = False,
        *,
        text: str | Sequence[str] | None = None,
        messages: Any = None,
        input_ids: Any = None,
        **gen_kwargs: Any,
    ) -> Any:
        """Generate from exactly one of `text=`, `messages=` (one chat or a batch) or `input_ids=`.

        Returns `str`/`list[str]` for text and messages, the continuation ids `[rows * n, new]` for token
        input, and `Output` (one prompt) or `list[Output]` (one per returned row) with `return_output=True`.
        Reserved kwargs: `chat_template_kwargs` (messages only), `return_full_sequence` (prompt plus
        continuation for token returns). Generation kwargs: see `GenerationParams`.
        """
        if not self._is_steered:
            raise RuntimeError("Call steer() before generate(): it loads the model and prepares the controls.")
        if inputs is not None:
            if text is not None or messages is not None or input_ids is not None:
                raise TypeError("Pass the prompt once: positional inputs or one of text=, messages=, input_ids=.")
            if isinstance(inputs, str) or (isinstance(inputs, (list, tuple)) and inputs and isinstance(inputs[0], str)):
                text = inputs
            else:
                input_ids = inputs
        sources = [n for n, v in (("text", text), ("messages", messages), ("input_ids", input_ids)) if v is not None]
        if len(sources) != 1:
            raise TypeError(
                f"generate() takes exactly one prompt source (text=, messages= or input_ids=); got {sources or 'none'}."
            )
        source = sources[0]
        if attention_mask is not None and source != "input_ids":
            raise TypeError("attention_mask is only valid with input_ids=; text and messages build their own mask.")
        template_kwargs = gen_kwargs.pop("chat_template_kwargs", None)
        if template_kwargs is not None and source != "messages":
            raise TypeError(f"chat_template_kwargs is only valid with messages=; got it with {source}=.")
        full_sequence = bool(gen_kwargs.pop("return_full_sequence", False))
        params = GenerationParams.from_kwargs(**gen_kwargs)
        if params.n > 1 and source != "input_ids" and not return_output:
            raise ValueError(f"n={params.n} needs return_output=True (a text return holds one string per prompt).")
        runtime_kwargs = dict(runtime_kwargs or {})

        if source == "text":
            prompt = self._from_text(text, runtime_kwargs)
        elif source == "messages":
            prompt = self._from_messages(messages, runtime_kwargs, template_kwargs)
        else:
            prompt = self._from_ids(input_ids, attention_mask, runtime_kwargs)

        params = self._lowered(params, runtime_kwargs)
        drivers = self._sets.drivers()
        if drivers:
            continuations, generated = self._drive(drivers[0], prompt, params, runtime_kwargs)
        else:
            continuations, generated = self._decode(prompt, params, runtime_kwargs), None
        reasons = infer_finish_reasons(
            continuations,
            self.tokenizer,
            max_new_tokens=params.max_new_tokens,
            stop_strings=params.stop_strings,
            stop_token_ids=params.stop_token_ids,
            eos_token_ids=self._backend.eos_token_ids,
        )
        return self._package(prompt, continuations, reasons, generated, params, return_output, full_sequence)

    # ------------------------------------------------------------------ prompt phase
    def _from_text(self, text: str | Sequence[str], runtime_kwargs: dict[str, Any]) -> _Prompt:
        single = isinstance(text, str)
        batch = [text] if single else list(text)
        if not batch or not all(isinstance(t, str) for t in batch):
            raise TypeError("text= must be a str or a non-empty list of str.")
        with encode_lock(self.tokenizer):
            encoded = self.tokenizer(batch, padding=True, return_tensors="pt")
        return self._adapted(encoded["input_ids"], encoded["attention_mask"], runtime_kwargs, "text", single, set())

    def _from_messages(
        self, messages: Any, runtime_kwargs: dict[str, Any], template_kwargs: Mapping[str, Any] | None
    ) -> _Prompt:
        if not has_chat_template(self.tokenizer):
            raise ValueError("This tokenizer has no chat template; pass text= (or set tokenizer.chat_template).")
        single = bool(messages) and isinstance(messages[0], Mapping)
        batch = [list(messages)] if single else [list(chat) for chat in messages]
        if not batch or not all(batch) or not all(isinstance(m, Mapping) for chat in batch for m in chat):
            raise TypeError("messages= must be one chat (a list of {'role', 'content'} dicts) or a list of chats.")
        template_kwargs = dict(template_kwargs or {})
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & set(template_kwargs))
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {reserved}; the pipeline owns them.")
        handled: set[int] = set()
        for control in self._enabled(self._sets.input):
            adapted = control.adapt_messages(batch, runtime_kwargs)
            if adapted is not None:
                if len(adapted) != len(batch):
                    raise ValueError(
                        f"{type(control).__name__}.adapt_messages returned {len(adapted)} chats for {len(batch)}."
                    )
                batch = adapted
                handled.add(id(control))
        with encode_lock(self.tokenizer):
            encoded = self.tokenizer.apply_chat_template(
                batch,
                add_generation_prompt=True,
                padding=True,
                return_dict=True,
                return_tensors="pt",
                **template_kwargs,
            )
        return self._adapted(
            encoded["input_ids"], encoded["attention_mask"], runtime_kwargs, "messages", single, handled
        )

    def _from_ids(self, input_ids: Any, attention_mask: Any, runtime_kwargs: dict[str, Any]) -> _Prompt:
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        single = ids.dim() == 1
        if single:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2 or ids.shape[1] == 0:
            raise ValueError(f"input_ids must be 1-D or 2-D (rectangular) and non-empty; got shape {tuple(ids.shape)}.")
        if attention_mask is not None:
            mask = torch.as_tensor(attention_mask, dtype=torch.long).reshape(ids.shape)
        else:
            mask = torch.ones_like(ids)
        return self._adapted(ids, mask, runtime_kwargs, "input_ids", single, set())

    def _adapted(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        runtime_kwargs: Mapping[str, Any],
        source: str,
        single: bool,
        handled: set[int],
    ) -> _Prompt:
        """Run token-level input controls not handled in the message phase, then left-pack onto the device."""
        pad = self.tokenizer.pad_token_id
        ids, mask = left_pack(ids, mask, pad)
        for control in self._enabled(self._sets.input):
            if id(control) in handled:
                continue
            adapted = control.adapt(ids, runtime_kwargs)
            if isinstance(adapted, torch.Tensor) and adapted.shape == ids.shape:
                ids = adapted
            else:
                rows = adapted.tolist() if isinstance(adapted, torch.Tensor) else [list(r) for r in adapted]
                ids, mask = pad_left(rows, pad)
            ids, mask = left_pack(ids, mask, pad)
        device = self._backend.device
        return _Prompt(ids.to(device), mask.to(device), source, single)

    def _lowered(self, params: GenerationParams, runtime_kwargs: Mapping[str, Any]) -> GenerationParams:
        for control in self._enabled(self._sets.output):
            params = params.merge_lowered(control.export_generation_params(runtime_kwargs))
        return params

    # ------------------------------------------------------------------ decode phase
    def _decode(self, prompt: _Prompt, params: GenerationParams, runtime_kwargs: dict[str, Any]) -> torch.Tensor:
        """Default path: one backend call per group of rows sharing hooks and seed."""
        backend = self._backend
        ids, mask = prompt.input_ids, prompt.attention_mask
        batch = ids.shape[0]
        seeds = self._row_seeds(params, batch)
        repeat = 1
        if params.n > 1 and not backend.native_n:
            repeat = params.n
            ids, mask = ids.repeat_interleave(repeat, 0), mask.repeat_interleave(repeat, 0)
            runtime_kwargs = self._repeat_rows(runtime_kwargs, batch, repeat)
            seeds = [s for s in seeds for _ in range(repeat)]
            params = params.replace(n=1)
        if len(set(seeds)) <= 1 or backend.batches_distinct_seeds:
            return self._call(ids, mask, params, seeds, runtime_kwargs)
        pieces = []
        for i in range(batch):
            rows = slice(i * repeat, (i + 1) * repeat)
            row_ids, row_mask = trim_left(ids[rows], mask[rows])
            row_kwargs = self._slice_rows(runtime_kwargs, ids.shape[0], rows)
            pieces.append(self._call(row_ids, row_mask, params, seeds[rows], row_kwargs))
        return pad_right(pieces, self.tokenizer.pad_token_id)

    def _call(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        params: GenerationParams,
        seeds: Sequence[int | None],
        runtime_kwargs: Mapping[str, Any],
    ) -> torch.Tensor:
        hooks = self._hooks(ids, mask, params, runtime_kwargs)
        processors, criteria = self._step_controls(ids, mask, params, runtime_kwargs)
        with self._backend.applied(hooks):
            return self._backend.generate(
                ids, mask, params, seeds=list(seeds), logits_processors=processors, stopping_criteria=criteria
            )

    def _drive(
        self, driver: DecodingDriver, prompt: _Prompt, params: GenerationParams, runtime_kwargs: dict[str, Any]
    ) -> tuple[torch.Tensor, int]:
        """Driver path: the driver owns the loop; hooks stay registered for its whole decode."""
        if params.n > 1:
            raise ValueError(
                f"n={params.n} is not supported with a decoding driver ({type(driver).__name__}); "
                "the driver already selects among its own candidates."
            )
        ids, mask = prompt.input_ids, prompt.attention_mask
        backend, pad = self._backend, self.tokenizer.pad_token_id
        hooks = self._hooks(ids, mask, params, runtime_kwargs)
        processors, criteria = self._step_controls(ids, mask, params, runtime_kwargs)
        rolled = 0

        def rollout(
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            *,
            stop_strings: Sequence[str] = (),
            logits_processors: Sequence[Any] = (),
            stopping_criteria: Sequence[Any] = (),
            **kwargs: Any,
        ) -> torch.Tensor:
            # a driver's own stop strings (e.g. a closing tag), processors and criteria join the call's
            nonlocal rolled
            sequences = backend.rollout(
                input_ids,
                attention_mask,
                logits_processors=[*processors, *logits_processors],
                stopping_criteria=[*criteria, *stopping_criteria],
                stop_strings=params.stop_strings + tuple(s for s in stop_strings if s not in params.stop_strings),
                stop_token_ids=params.stop_token_ids,
                **kwargs,
            )
            rolled += sum(len(strip_trailing(row, pad)[0]) for row in sequences[:, input_ids.shape[1] :].tolist())
            return sequences

        names = ("min_new_tokens", "repetition_penalty") + (() if params.greedy else ("temperature", "top_p", "top_k"))
        sampling = {name: getattr(params, name) for name in names if getattr(params, name) is not None}
        # drivers sample by design, so a given seed applies even when the call itself is greedy
        seed = None if params.seed is None else derive_item_seed(params.seed, _SEED_OP, 0)
        with backend.applied(hooks), backend.seeded(seed):
            result = driver.decode(
                ids,
                mask,
                rollout=rollout,
                runtime_kwargs=runtime_kwargs,
                tokenizer=self.tokenizer,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=list(backend.eos_token_ids),
                **sampling,
                **dict(params.extra),
            )
        sequences = result.sequences
        if sequences.shape[0] != ids.shape[0] or not torch.equal(sequences[:, : ids.shape[1]], ids):
            raise RuntimeError(
                f"{type(driver).__name__}.decode must return the prompt rows followed by the continuation."
            )
        return sequences[:, ids.shape[1] :], rolled

    def _hooks(
        self, ids: torch.Tensor, mask: torch.Tensor, params: GenerationParams, runtime_kwargs: Mapping[str, Any]
    ) -> list[HookSet]:
        return [
            self._backend.state_hooks(
                control, ids, runtime_kwargs, attention_mask=mask, model=self._backend.model, params=params
            )
            for control in self._enabled(self._sets.state)
        ]

    def _step_controls(
        self, ids: torch.Tensor, mask: torch.Tensor, params: GenerationParams, runtime_kwargs: Mapping[str, Any]
    ) -> tuple[list, list]:
        processors: list = []
        criteria: list = []
        for control in self._enabled(self._sets.output):
            if control.export_generation_params(runtime_kwargs):
                continue  # lowered into params; the backend enforces it
            processors += control.get_logits_processors(ids, runtime_kwargs, attention_mask=mask, params=params)
            criteria += control.get_stopping_criteria(ids, runtime_kwargs, attention_mask=mask, params=params)
        return processors, criteria

    def _row_seeds(self, params: GenerationParams, batch: int) -> list[int | None]:
        """Per-row seeds: none for greedy or unseeded calls; one shared (`dispatch`) or one per row (`item`).

        On backends that batch distinct seeds (engines) every row gets its own seed and `seed_scope` is inert.
        """
        if params.greedy or params.seed is None:
            return [None] * batch
        if params.seed_scope == "item" or self._backend.batches_distinct_seeds:
            return [derive_item_seed(params.seed, _SEED_OP, i) for i in range(batch)]
        return [derive_item_seed(params.seed, _SEED_OP, 0)] * batch

    def _row_scoped(self) -> set[str]:
        return {name for name, scope in declared_scopes(self.controls).items() if scope == "row"}

    def _repeat_rows(self, runtime_kwargs: dict[str, Any], batch: int, repeat: int) -> dict[str, Any]:
        """Repeat each row's value of row-scoped kwargs `repeat` times (rows are repeated for n candidates)."""
        out = dict(runtime_kwargs)
        schema = runtime_kwargs_schema(self.controls)
        for name in self._row_scoped() & set(out):
            value = out[name]
            if batch == 1 and _is_flat_row_value(value, schema[name]):
                out[name] = [list(value) for _ in range(repeat)]  # one row's flat list, e.g. substrings=["x"]
                continue
            values = row_values(value, batch)
            if values is not None:
                out[name] = [v for v in values for _ in range(repeat)]
        return out

    def _slice_rows(self, runtime_kwargs: dict[str, Any], batch: int, rows: slice) -> dict[str, Any]:
        out = dict(runtime_kwargs)
        for name in self._row_scoped() & set(out):
            values = row_values(out[name], batch)
            if values is not None:
                out[name] = list(values[rows])
        return out

    @staticmethod
    def _enabled(controls: Sequence[BaseControl]) -> list:
        return [c for c in controls if c.enabled]

    # ------------------------------------------------------------------ refill (continuous batching)
    def refill_blockers(self) -> list[str]:
        """Why this pipeline cannot decode with slot refill (`open_refill`); empty when it can."""
        if not self._is_steered:
            return ["the pipeline is not steered"]
        blockers = []
        if not self._backend.supports_refill:
            blockers.append(f"backend {self.backend.kind!r} has no refill engine")
        if self._sets.drivers():
            blockers.append("a decoding driver owns the decode loop")
        for control in self._enabled(self._sets.state):
            if not control.supports_refill:
                blockers.append(f"{type(control).__name__} does not declare supports_refill")
        for control in self._enabled(self._sets.output):
            live = any(
                getattr(type(control), name) is not getattr(OutputControl, name)
                for name in ("get_logits_processors", "get_stopping_criteria")
            )
            if live and not control.export_generation_params({}):
                blockers.append(f"{type(control).__name__} runs live logits processors or stopping criteria")
        return blockers

    def stream_blockers(self) -> list[str]:
        """Why the provider cannot hand this pipeline each request on its own, concurrently (empty when it can):
        the backend must batch concurrent calls itself (`Backend.streams`), and no decoding driver may run (a
        driver's seeded rollouts keep per-call state on the backend)."""
        if not self._is_steered:
            return ["the pipeline is not steered"]
        blockers = []
        if not self._backend.streams:
            blockers.append(f"backend {self.backend.kind!r} does not batch concurrent calls itself")
        if self._sets.drivers():
            blockers.append("a decoding driver owns the decode loop")
        return blockers

    def open_refill(self, max_rows: int) -> Any:
        """A refill engine (Hugging Face backend) whose rows are admitted with `admit_refill`; see backends.refill."""
        blockers = self.refill_blockers()
        if blockers:
            raise ValueError(f"This pipeline cannot refill: {'; '.join(blockers)}. Fix: use static batching.")
        return self._backend.refill_engine(max_rows, self._refill_hooks)

    def admit_refill(
        self,
        engine: Any,
        on_done: Sequence[Any],
        *,
        runtime_kwargs: Mapping[str, Any] | None = None,
        row_max_new_tokens: Sequence[int] | None = None,
        row_seeds: Sequence[int | None] | None = None,
        messages: Any = None,
        text: Sequence[str] | None = None,
        **gen_kwargs: Any,
    ) -> None:
        """Run the prompt phase for a batch of chats (or texts) and admit its rows into `engine`.

        `on_done[i](output, error)` receives row i's `Output` (or the error that ended it) on the engine thread.
        Rows get the seeds, runtime kwargs and lowered parameters a static call gives them (`item` seeds per row:
        each row samples from its own generator); `row_max_new_tokens` caps rows individually. `row_seeds` gives
        each row the seed of its own request instead of the call's `seed`: a row then samples as a one-row call
        with that seed would.
        Raises ValueError (nothing admitted) for calls refill cannot run: `n > 1`, extra `model.generate`
        kwargs, live logits processors or stopping criteria.
        """
        if (messages is None) == (text is None):
            raise TypeError("admit_refill takes exactly one of messages= or text= (a batch).")
        template_kwargs = gen_kwargs.pop("chat_template_kwargs", None)
        params = GenerationParams.from_kwargs(**gen_kwargs)
        runtime_kwargs = dict(runtime_kwargs or {})
        if messages is not None:
            prompt = self._from_messages(list(messages), runtime_kwargs, template_kwargs)
        else:
            prompt = self._from_text(list(text), runtime_kwargs)
        params = self._lowered(params, runtime_kwargs)
        if params.n != 1 or params.extra:
            raise ValueError(
                f"refill decodes n=1 without extra generate kwargs; got n={params.n}, {dict(params.extra)}."
            )
        ids, mask = prompt.input_ids, prompt.attention_mask
        processors, criteria = self._step_controls(ids, mask, params, runtime_kwargs)
        if processors or criteria:
            raise ValueError("refill cannot run live logits processors or stopping criteria; use static batching.")
        batch = ids.shape[0]
        if len(on_done) != batch or (row_seeds is not None and len(row_seeds) != batch):
            raise ValueError(f"admit_refill needs one callback (and row seed, if any) per prompt; got {batch} prompts.")
        limits = list(row_max_new_tokens) if row_max_new_tokens is not None else [params.max_new_tokens] * batch
        if row_seeds is None:
            seeds = self._row_seeds(params.replace(seed_scope="item"), batch)
        else:
            seeds = [self._row_seeds(params.replace(seed=seed), 1)[0] for seed in row_seeds]
        eos = self._backend.eos_token_ids
        rows = []
        for i in range(batch):
            row_params = params.replace(max_new_tokens=int(limits[i]))
            prompt_ids = ids[i, mask[i].bool()].tolist()
            rows.append(
                _RefillRow(
                    prompt_ids=prompt_ids,
                    params=row_params,
                    seed=seeds[i],
                    runtime_kwargs=self._slice_rows(runtime_kwargs, batch, slice(i, i + 1)),
                    on_done=functools.partial(self._refill_done, on_done[i], prompt_ids, row_params, eos),
                )
            )
        engine.admit(rows, ids, mask)

    def _refill_done(
        self, callback: Any, prompt_ids: list[int], params: GenerationParams, eos: list[int], ids: Any, error: Any
    ) -> None:
        if error is not None:
            callback(None, error)
            return
        continuation = torch.tensor([ids], dtype=torch.long)
        reasons = infer_finish_reasons(
            continuation,
            self.tokenizer,
            max_new_tokens=params.max_new_tokens,
            stop_strings=params.stop_strings,
            stop_token_ids=params.stop_token_ids,
            eos_token_ids=eos,
        )
        callback(Output(continuation, torch.tensor([prompt_ids], dtype=torch.long), reasons, None), None)

    def _refill_hooks(self, ids: torch.Tensor, mask: torch.Tensor, rows: Sequence[Mapping[str, Any]]) -> list[HookSet]:
        """Hooks for one refill batch composition: per-row runtime kwargs merged back into one call's form."""
        return self._hooks(ids, mask, GenerationParams(), merge_row_kwargs(rows, self._row_scoped()))

    # ------------------------------------------------------------------ return phase
    def _package(
        self,
        prompt: _Prompt,
        continuations: torch.Tensor,
        reasons: list,
        generated: int | None,
        params: GenerationParams,
        return_output: bool,
        full_sequence: bool,
    ) -> Any:
        continuations = continuations.cpu()
        prompts = prompt.input_ids.cpu()
        per_prompt = continuations.shape[0] // prompts.shape[0]
        if return_output:
            if prompt.single:
                return Output(continuations, prompts, reasons, generated)
            shares = split_evenly(generated, continuations.shape[0])
            return [
                Output(
                    continuations[r : r + 1], prompts[r // per_prompt : r // per_prompt + 1], [reasons[r]], shares[r]
                )
                for r in range(continuations.shape[0])
            ]
        if prompt.source == "input_ids":
            if full_sequence:
                return torch.cat([prompts.repeat_interleave(per_prompt, 0), continuations], dim=1)
            return continuations
        texts = [
            truncate_at_stop_strings(t, params.stop_strings)
            for t in self.tokenizer.batch_decode(continuations, skip_special_tokens=True)
        ]
        return texts[0] if prompt.single else texts


@dataclass(slots=True)
class _RefillRow:
    """One row handed to a refill engine (the fields `backends.refill.RefillEngine.admit` reads)."""

    prompt_ids: list[int]
    params: GenerationParams
    seed: int | None
    runtime_kwargs: dict[str, Any]
    on_done: Any


def merge_row_kwargs(rows: Sequence[Mapping[str, Any]], row_scoped: set[str]) -> dict[str, Any]:
    """One call's runtime kwargs from single-row slices: row-scoped `[value]` lists are concatenated in row order,
    other values (call-scoped, or a broadcast form) must agree across rows."""
    merged: dict[str, Any] = {}
    names = set().union(*(r.keys() for r in rows)) if rows else set()
    for name in sorted(names):
        values = [r.get(name) for r in rows]
        if any(name not in r for r in rows):
            raise ValueError(f"Runtime kwarg {name!r} is set on some refill rows but not on others.")
        if name in row_scoped and all(isinstance(v, list) and len(v) == 1 for v in values):
            merged[name] = [v[0] for v in values]
        elif all(v == values[0] for v in values):
            merged[name] = values[0]
        else:
            raise ValueError(f"Runtime kwarg {name!r} differs across refill rows but is not in per-row form.")
    return merged


def _is_flat_row_value(value: Any, entry: Mapping[str, Any]) -> bool:
    """Whether `value` is one row's value of a list-typed kwarg (a flat list) rather than a per-row list."""
    declared_list = str(entry.get("type", "")).startswith("list")
    return (
        declared_list and isinstance(value, (list, tuple)) and bool(value) and not isinstance(value[0], (list, tuple))
    )


# ---------------------------------------------------------------------- row helpers
def split_evenly(total: int | None, parts: int) -> list[int | None]:
    """Split a token total over rows, the remainder on the first row (None stays None)."""
    if total is None:
        return [None] * parts
    share, rest = divmod(total, parts)
    return [share + (rest if i == 0 else 0) for i in range(parts)]
