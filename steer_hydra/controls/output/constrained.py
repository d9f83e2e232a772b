"""ConstrainedDecoding: outputs restricted to a regex, a choice list or a JSON schema, per row, on every backend.

How it runs: on Hugging Face, each call gets a `GrammarLogitsProcessor` holding one llguidance matcher per
constrained row (copied from the control's cache of compiled constraints, one compile per distinct constraint);
at each step it advances each row's matcher by the tokens generated since the last step (the columns after the
call's left-padded prompt), fills every row's allowed-token bitmask in one parallel llguidance call, and sets
every disallowed token's score to -inf, the eos ids included until the row's grammar accepts. On vLLM (`vllm`,
`vllm_serve`) it hands the engine each row's constraint as request fields (`RequestFields`), which the backend
turns into vLLM's structured outputs for that row's request.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, OutputControl, RequestFields
from steer_hydra.core.tensors import eos_ids

logger = logging.getLogger(__name__)

REGEX_KWARG = "constrain_regex"
CHOICES_KWARG = "constrain_choices"
JSON_SCHEMA_KWARG = "constrain_json_schema"
KIND_OF_KWARG = {REGEX_KWARG: "regex", CHOICES_KWARG: "choices", JSON_SCHEMA_KWARG: "json_schema"}
INSTALL_HINT = "pip install 'llguidance>=1.7,<2' (a steer_hydra dependency)"
ENGINE_KINDS = ("vllm", "vllm_serve")
CACHE_SIZE = 4096  # compiled constraints kept per control (a multiple-choice eval brings one per sample)
ConstraintKind = Literal["regex", "choices", "json_schema"]


@dataclass(frozen=True, slots=True)
class Constraint:
    """One output constraint in canonical form: `text` is the regex, or the JSON text of the choice list or of
    the schema (also the key of the compile cache)."""

    kind: ConstraintKind
    text: str

    @classmethod
    def parse(cls, kind: ConstraintKind, value: Any, where: str) -> Constraint:
        """Validate `value` as a `kind` constraint; errors name `where` (an Args field or a runtime kwarg)."""
        if kind == "regex":
            if not isinstance(value, str) or not value:
                raise ValueError(
                    f"{where} must be a non-empty regular expression string; got {value!r}. "
                    r"Fix: e.g. '[A-D]' or '\d{1,3}' (the whole output must match it)."
                )
            return cls("regex", value)
        if kind == "choices":
            if (
                isinstance(value, (str, bytes))
                or not isinstance(value, Sequence)
                or not value
                or not all(isinstance(c, str) and c for c in value)
            ):
                raise ValueError(
                    f"{where} must be a non-empty list of non-empty strings; got {value!r}. "
                    "Fix: e.g. ['A', 'B', 'C', 'D'] (the output is exactly one of them)."
                )
            return cls("choices", json.dumps(list(value)))
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"{where} is a string but not JSON ({error}). Fix: pass the schema as a dict."
                ) from None
        if not isinstance(schema, Mapping):
            raise ValueError(
                f"{where} must be a JSON schema object (a dict, or its JSON text); got {value!r}. "
                "Fix: e.g. {'type': 'object', 'properties': {'answer': {'type': 'string'}}, 'required': ['answer']}."
            )
        try:
            text = json.dumps(schema)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where} is not JSON-serialisable ({error}). Fix: use JSON values only.") from None
        return cls("json_schema", text)

    @property
    def value(self) -> str | list[str] | dict[str, Any]:
        """The constraint as given: the regex, the choice list or the schema dict."""
        return self.text if self.kind == "regex" else json.loads(self.text)

    def grammar(self, compact_json: bool = False) -> str:
        """The llguidance grammar of this constraint (not yet checked: see `check_grammar`); `compact_json` allows
        no whitespace between JSON tokens (else any, as vLLM's default)."""
        from llguidance import LLMatcher

        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.text)
        if self.kind == "choices":
            return LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in self.value))
        return LLMatcher.grammar_from_json_schema(self.text, defaults={"whitespace_flexible": not compact_json})

    def request_fields(self) -> dict[str, Any]:
        """vLLM's structured-outputs fields of this constraint (`StructuredOutputsParams(**fields)`)."""
        key = {"regex": "regex", "choices": "choice", "json_schema": "json"}[self.kind]
        return {key: self.value}


def grammar_library_available() -> bool:
    """Whether llguidance, the grammar library of the Hugging Face path, is importable."""
    return importlib.util.find_spec("llguidance") is not None


def check_grammar(constraint: Constraint, where: str, tokenizer: Any = None) -> None:
    """Raise ValueError naming `where` when llguidance cannot compile the constraint."""
    from llguidance import LLMatcher

    try:
        message = LLMatcher.validate_grammar(constraint.grammar(), tokenizer)
    except ValueError as error:
        message = str(error)
    if message and not message.startswith("WARNING"):
        raise ValueError(
            f"{where}={constraint.value!r} cannot be compiled: {message.strip().splitlines()[0]}. "
            "Fix: correct the constraint (regexes use Rust regex syntax; schemas JSON Schema)."
        )


def fill_bitmasks(executor: Any, matchers: Sequence[Any], words: int) -> torch.Tensor:
    """Each matcher's next-token bitmask, `[len(matchers), words]` int32, filled in one parallel llguidance call
    (the GIL released; `llguidance.torch` is not imported, since it compiles a kernel at import)."""
    bitmask = torch.full((len(matchers), words), -1, dtype=torch.int32)
    executor.unsafe_compute_mask_ptr(
        [(m, j) for j, m in enumerate(matchers)], bitmask.data_ptr(), words * 4, len(matchers)
    )
    return bitmask


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """`[rows, words]` int32 bitmask (bit j of word w: token 32w+j allowed) as a `[rows, vocab]` bool tensor;
    tokens past the bitmask's width are disallowed."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = ((bitmask.unsqueeze(-1) >> shifts) & 1).bool().reshape(bitmask.shape[0], -1)
    if bits.shape[1] >= vocab:
        return bits[:, :vocab]
    return torch.cat([bits, bits.new_zeros(bits.shape[0], vocab - bits.shape[1])], dim=1)


class _RowState:
    """One constrained sequence's matcher and the generated tokens it has consumed."""

    __slots__ = ("matcher", "consumed", "done")

    def __init__(self, matcher: Any) -> None:
        self.matcher = matcher
        self.consumed: list[int] = []
        self.done = False


class GrammarLogitsProcessor:
    """One call's grammar masks: row i's next-token scores keep only the tokens row i's grammar allows.

    Built on the call's prompt length and one compiled matcher (or None: unconstrained) per prompt row. A row's
    generated tokens are the columns after the prompt; when a row's tokens do not extend the ones its matcher
    consumed (a decoding driver's new rollout), the matcher restarts on them. A call with k times the prompt
    rows (a rollout's `num_return_sequences`) gives each prompt row's k sequences a matcher of their own.
    """

    def __init__(
        self,
        prototypes: Sequence[Any | None],
        prompt_length: int,
        eos_token_ids: Sequence[int],
        executor: Any,
        words: int,
    ) -> None:
        self.prototypes = list(prototypes)
        self.words = words
        self.prompt_length = prompt_length
        self.eos = sorted(set(eos_token_ids))
        self.executor = executor
        self._states: list[_RowState | None] = []
        self._warned = False

    def _rows(self, count: int) -> list[_RowState | None]:
        if len(self._states) != count:
            prompts = len(self.prototypes)
            if count != prompts and not (prompts == 1 or count % prompts == 0):
                raise ValueError(
                    f"ConstrainedDecoding was built for {prompts} prompt rows but is called on {count} sequences. "
                    "Fix: call generate on the rows the processor was built for."
                )
            repeat = count // prompts
            self._states = [
                None if (p := self.prototypes[i // repeat]) is None else _RowState(p.deep_copy()) for i in range(count)
            ]
        return self._states

    def _advance(self, state: _RowState, generated: list[int]) -> None:
        consumed = state.consumed
        if generated[: len(consumed)] != consumed:
            state.matcher.reset()
            state.consumed, state.done = [], False
            consumed = state.consumed
        for token in generated[len(consumed) :]:
            if state.done:
                break
            if token in self.eos and state.matcher.is_accepting():
                state.done = True
            elif not state.matcher.consume_token(token):
                self._warn(
                    f"token {token} is outside its grammar ({state.matcher.get_error()[:200]}): another output "
                    "control changed the scores after the grammar mask"
                )
                state.done = True
            consumed.append(token)

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(
                "ConstrainedDecoding: a row left its constraint (%s); the rest of that row is not constrained.",
                why,
            )

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        states = self._rows(input_ids.shape[0])
        tail = input_ids[:, self.prompt_length :].tolist()
        active: list[int] = []
        for i, state in enumerate(states):
            if state is None:
                continue
            self._advance(state, tail[i])
            if not state.done:
                active.append(i)
        if not active:
            return scores
        bitmask = fill_bitmasks(self.executor, [states[i].matcher for i in active], self.words)
        allowed = unpack_bitmask(bitmask, scores.shape[-1])
        eos = [t for t in self.eos if t < scores.shape[-1]]
        for j, i in enumerate(active):
            allowed[j, eos] = states[i].matcher.is_accepting()
            if not allowed[j].any():  # nothing can follow (the tokenizer cannot spell the rest): end the row
                self._warn("no token can continue it, so it ends here")
                allowed[j, eos] = True
        rows = torch.tensor(active, device=scores.device)
        out = scores.clone()
        masked = scores[rows].masked_fill(~allowed.to(scores.device), -float("inf"))
        # an earlier processor may have banned what the grammar needs (min_new_tokens bans eos): the row ends
        dead = torch.isneginf(masked).all(dim=-1)
        if eos and bool(dead.any()):
            masked[dead.nonzero().flatten().unsqueeze(-1), torch.tensor(eos, device=scores.device)] = 0.0
        out[rows] = masked
        return out


class ConstrainedDecoding(OutputControl):
    """Constrained decoding: each output matches a regex, is one of a list of choices, or is JSON valid under a
    JSON schema.

    Method: grammar-constrained decoding with llguidance (guidance-ai/llguidance: an Earley parser over a
    derivative-based regex lexer that computes each step's token mask on the fly; evaluated as "Guidance" in Geng,
    Cooper, Moskal et al., "Generating Structured Outputs from Language Models: Benchmark and Studies"
    (JSONSchemaBench), arXiv 2501.10868, 2025). vLLM ships the same library as its `guidance` backend. At each
    step the scores of every token the row's grammar cannot accept next are set to -inf, so greedy and sampled
    outputs alike satisfy the constraint (unless `max_new_tokens` ends them first); eos is allowed exactly when
    the grammar accepts what came so far.

    Args:
        regex: the whole output matches this regular expression (Rust regex syntax).
        choices: the output is exactly one of these strings.
        json_schema: the output is a JSON value valid under this schema (a dict, or its JSON text).
        At most one is set; with none, only rows that bring a runtime constraint are constrained.
        compact_json: JSON outputs carry no whitespace between tokens (default: any whitespace, as vLLM's
            default), which keeps a model from spending its token budget on whitespace. On vLLM this is an
            engine setting: `structured_outputs_config: {backend: guidance, disable_any_whitespace: true}` in the
            backend options (`xgrammar` also takes it).

    Runtime kwargs (row scope, one per row or one for every row; a row's runtime constraint replaces the fixed
    one; a row with none of the three and no fixed constraint decodes freely): `constrain_regex` (str),
    `constrain_choices` (list[str]), `constrain_json_schema` (dict or JSON text). The provider maps an Inspect
    `GenerateConfig.response_schema` to `constrain_json_schema`.

    Backends: on Hugging Face a logits processor with one llguidance matcher per row (compiled once per distinct
    constraint, bitmasks filled for the whole batch in one parallel call): batches, a row alone equals the same
    row in a batch; no slot refill. On vLLM (`vllm`, `vllm_serve`) each row's request carries vLLM's structured
    outputs (`regex`, `choice` or `json`), whose backend the engine chooses (`structured_outputs_config`; set its
    `backend: guidance` for llguidance there too).
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        regex: str | None = None
        choices: list[str] | None = None
        json_schema: Mapping[str, Any] | str | None = None
        compact_json: bool = False

        def validate(self) -> None:
            given = [kind for kind in ("regex", "choices", "json_schema") if getattr(self, kind) is not None]
            if len(given) > 1:
                raise ValueError(
                    f"ConstrainedDecoding takes at most one of regex, choices and json_schema; got {given}. "
                    "Fix: keep one (or none, and pass the constraint per row as a runtime kwarg)."
                )
            if given:
                kind = given[0]
                constraint = Constraint.parse(kind, getattr(self, kind), f"ConstrainedDecoding.{kind}")
                if grammar_library_available():
                    check_grammar(constraint, f"ConstrainedDecoding.{kind}")

    RUNTIME_KWARGS_SCHEMA = [
        {
            "name": REGEX_KWARG,
            "type": "str",
            "required": False,
            "scope": "row",
            "help": "A regular expression the row's whole output must match.",
        },
        {
            "name": CHOICES_KWARG,
            "type": "list[str]",
            "required": False,
            "scope": "row",
            "help": "The strings the row's output must be exactly one of (e.g. a sample's options).",
        },
        {
            "name": JSON_SCHEMA_KWARG,
            "type": "dict",
            "required": False,
            "scope": "row",
            "help": "A JSON schema the row's output must be a valid JSON value under.",
        },
    ]
    supports_batching = True
    supports_refill = False

    def _configure(self) -> None:
        kind = next((k for k in ("regex", "choices", "json_schema") if getattr(self.args, k) is not None), None)
        self._fixed = None if kind is None else Constraint.parse(kind, getattr(self.args, kind), kind)
        self._backend_kind: str | None = None
        self._ll_tokenizer: Any = None
        self._eos: list[int] = []
        self._executor: Any = None
        self._compiled: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def constraint(self) -> Constraint | None:
        """The fixed constraint from the Args (None: rows are constrained by runtime kwargs only)."""
        return self._fixed

    @property
    def compiled_constraints(self) -> int:
        """How many distinct constraints this control holds compiled (Hugging Face; each compiled once)."""
        return len(self._compiled)

    def requirements(self) -> frozenset[Capability]:
        return frozenset()

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        if backend_kind in ENGINE_KINDS or grammar_library_available():
            return []
        return [
            "constrains outputs on Hugging Face with the llguidance grammar library, which is not importable. "
            f"Fix: {INSTALL_HINT}, or use backend=vllm / vllm_serve (vLLM's structured outputs)."
        ]

    def steer(
        self, model: torch.nn.Module | None, tokenizer: Any = None, backend: str | None = None, **kwargs: Any
    ) -> None:
        self._backend_kind = backend or "huggingface"
        if self._backend_kind in ENGINE_KINDS:
            if self.compact_json:
                logger.info(
                    "ConstrainedDecoding.compact_json is an engine setting on backend=%s: set "
                    "structured_outputs_config.disable_any_whitespace=true (with backend guidance or xgrammar) where "
                    "the engine starts (backend.options for vllm, the server's --structured-outputs-config for "
                    "vllm_serve).",
                    self._backend_kind,
                )
            return None
        tokenizer = tokenizer if tokenizer is not None else self.tokenizer
        if model is None or tokenizer is None:
            raise RuntimeError(
                f"ConstrainedDecoding on backend={self._backend_kind} needs the model's tokenizer in this process. "
                "Fix: use backend=huggingface, vllm or vllm_serve."
            )
        import llguidance
        import llguidance.hf

        try:
            self._ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer)
        except ValueError as error:
            raise ValueError(
                f"ConstrainedDecoding needs a fast tokenizer to build token masks ({error}). "
                "Fix: load the model's fast tokenizer (use_fast=True)."
            ) from None
        config = getattr(model, "generation_config", None)
        self._eos = eos_ids(tokenizer.eos_token_id, getattr(config, "eos_token_id", None))
        self._executor = llguidance.LLExecutor()
        if self._fixed is not None:
            self._compile(self._fixed, f"ConstrainedDecoding.{self._fixed.kind}")
        return None

    def cleanup(self) -> None:
        with self._lock:
            self._compiled.clear()
        self._ll_tokenizer = self._executor = None
        self._backend_kind = None

    def _compile(self, constraint: Constraint, where: str) -> Any:
        """The cached matcher prototype of `constraint` (compiled on first use; refused when it does not compile)."""
        with self._lock:
            matcher = self._compiled.get(constraint)
            if matcher is not None:
                self._compiled.move_to_end(constraint)
                return matcher
        from llguidance import LLMatcher

        matcher = LLMatcher(self._ll_tokenizer, constraint.grammar(self.compact_json), log_level=0)
        if matcher.is_error():
            raise ValueError(
                f"{where}={constraint.value!r} cannot be compiled: {matcher.get_error().strip().splitlines()[0]}. "
                "Fix: correct the constraint (regexes use Rust regex syntax; schemas JSON Schema)."
            )
        with self._lock:
            self._compiled[constraint] = matcher
            while len(self._compiled) > CACHE_SIZE:
                self._compiled.popitem(last=False)
        return matcher

    def row_constraints(self, runtime_kwargs: Mapping[str, Any], batch: int) -> list[Constraint | None]:
        """Each row's constraint: its runtime kwarg, else the fixed one (None: the row decodes freely)."""
        rows: list[Constraint | None] = [self._fixed] * batch
        chosen: list[str | None] = [None] * batch
        for name, kind in KIND_OF_KWARG.items():
            for i, value in enumerate(_per_row(runtime_kwargs.get(name), batch, name, kind)):
                if value is None:
                    continue
                if chosen[i] is not None:
                    raise ValueError(
                        f"Row {i} brings both runtime kwargs {chosen[i]} and {name}; a row takes one constraint. "
                        "Fix: give each row at most one of constrain_regex, constrain_choices, constrain_json_schema."
                    )
                chosen[i] = name
                rows[i] = Constraint.parse(kind, value, f"runtime kwarg {name} (row {i})")
        return rows

    def get_logits_processors(self, input_ids: torch.Tensor, runtime_kwargs: Mapping[str, Any], **kwargs: Any) -> list:
        if self._backend_kind is None:
            raise RuntimeError("ConstrainedDecoding is not steered. Fix: call pipeline.steer() first.")
        ids = torch.as_tensor(input_ids)
        ids = ids.unsqueeze(0) if ids.dim() == 1 else ids
        constraints = self.row_constraints(runtime_kwargs, ids.shape[0])
        if all(c is None for c in constraints):
            return []
        if self._backend_kind in ENGINE_KINDS:
            rows = tuple({} if c is None else {"structured_outputs": c.request_fields()} for c in constraints)
            return [RequestFields(rows)]
        names = {kind: name for name, kind in KIND_OF_KWARG.items()}
        prototypes = [
            None if c is None else self._compile(c, f"runtime kwarg {names[c.kind]} (row {i})")
            for i, c in enumerate(constraints)
        ]
        words = math.ceil(self._ll_tokenizer.vocab_size / 32)
        return [GrammarLogitsProcessor(prototypes, ids.shape[1], self._eos, self._executor, words)]


def _per_row(value: Any, batch: int, name: str, kind: ConstraintKind) -> list[Any]:
    """A row-scoped constraint kwarg as one value (or None) per row: one value is every row's."""
    if value is None:
        return [None] * batch
    single = (
        isinstance(value, str)
        if kind == "regex"
        else isinstance(value, (Mapping, str))
        if kind == "json_schema"
        else isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) and bool(value)
    )
    if single:
        return [value] * batch
    if isinstance(value, (list, tuple)) and len(value) == batch:
        return list(value)
    raise ValueError(
        f"Runtime kwarg {name} must be one {kind} constraint for every row or a list with one per row (None for a "
        f"free row); got {value!r} for {batch} row(s). Fix: pass one value per row, in row order."
    )
