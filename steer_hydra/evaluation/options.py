"""`ProviderOptions` (how the Inspect provider drives a pipeline), its value sets, and the GenerateConfig field sets.

`ProviderOptions.max_batch_size` is what the user asks for (validated here, once);
`ProviderOptions.batch_ceiling(pipeline)` is the one owner of the rule for the ceiling in force: `max_batch_size`,
or 1 when an enabled control cannot batch. The value sets here (`BATCHING_MODES`, `UNSUPPORTED_POLICIES`, ...) are
the ones the app's config schema (`app/schema.py`) builds its enums from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inspect_ai.model import GenerateConfig

from steer_hydra.core.params import DEFAULT_SEED_SCOPE, SEED_SCOPES
from steer_hydra.evaluation.thinking import DEFAULT_THINK_TAGS, SPLIT_MODES

# Every GenerateConfig field belongs to exactly one of these sets (a test fails when Inspect adds a field).
MAPPED_FIELDS: frozenset[str] = frozenset(
    {"max_tokens", "stop_seqs", "temperature", "top_p", "top_k", "seed", "num_choices", "extra_body"}
)
UPSTREAM_FIELDS: frozenset[str] = frozenset(
    {
        "system_message",
        "max_retries",
        "timeout",
        "attempt_timeout",
        "stream_idle_timeout",
        "max_connections",
        "adaptive_connections",
        "fallback_models",
        "cache",
        "cache_prompt",
        "batch",
        "parallel_tool_calls",
        "internal_tools",
        "max_tool_output",
        "fail_on_refusal",
    }
)
POLICY_FIELDS: frozenset[str] = frozenset(
    {
        "best_of",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_schema",
        "reasoning_effort",
        "reasoning_tokens",
        "reasoning_summary",
        "reasoning_history",
        "reasoning_mode",
        "verbosity",
        "effort",
        "extra_headers",
        "modalities",
    }
)
REFUSED_FIELDS: frozenset[str] = frozenset({"logprobs", "top_logprobs", "prompt_logprobs"})
# `response_schema` (a policy field) maps to this runtime kwarg instead when an enabled control declares it: the
# JSON-schema constraint of constrained decoding (`controls.output.constrained.JSON_SCHEMA_KWARG`), unless the
# sample brings one of the output constraints of its own (`CONSTRAINT_RUNTIME_KWARGS`), which then wins.
RESPONSE_SCHEMA_RUNTIME_KWARG = "constrain_json_schema"
CONSTRAINT_RUNTIME_KWARGS: tuple[str, ...] = ("constrain_regex", "constrain_choices", RESPONSE_SCHEMA_RUNTIME_KWARG)
# Checked against the unsupported-parameter policy: the policy fields plus any field Inspect adds later.
POLICY_CHECKED_FIELDS: tuple[str, ...] = tuple(
    sorted(set(GenerateConfig.model_fields) - (MAPPED_FIELDS | UPSTREAM_FIELDS | REFUSED_FIELDS))
)

UNSUPPORTED_POLICIES: tuple[str, ...] = ("raise", "warn")
BATCHING_MODES: tuple[str, ...] = ("auto", "static", "refill", "stream")
__all__ = [
    "BATCHING_MODES",
    "CONSTRAINT_RUNTIME_KWARGS",
    "MAPPED_FIELDS",
    "POLICY_CHECKED_FIELDS",
    "POLICY_FIELDS",
    "REFUSED_FIELDS",
    "RESPONSE_SCHEMA_RUNTIME_KWARG",
    "SEED_SCOPES",
    "SPLIT_MODES",
    "UNSUPPORTED_POLICIES",
    "UPSTREAM_FIELDS",
    "ProviderOptions",
]


@dataclass(frozen=True, slots=True)
class ProviderOptions:
    """How the provider drives the pipeline (validated at construction).

    Attributes:
        runtime_kwargs: Static runtime kwargs applied to every request ("row"-scoped values are one row's value,
            broadcast to every row; "call"-scoped values pass through; undeclared names are inert).
        chat_template_kwargs: Forwarded to `apply_chat_template` on the messages path (refused on the text path).
        max_batch_size: The batch size asked for; the ceiling in force is `batch_ceiling(pipeline)`.
        default_max_tokens: `max_tokens` for requests that set none.
        reasoning_tags: `(open, close)` tags split off as reasoning before scoring; None disables the split.
        reasoning_opened_at_start: The prompt opens the thinking channel, so a continuation starts inside it.
        reasoning_split: "auto" (text when both tags round-trip through the tokenizer, else tokens), "text" or
            "tokens".
        on_unsupported_param: "raise" (default) or "warn" (warn once per field, then ignore) for
            `GenerateConfig` parameters the pipeline cannot honor.
        seed_scope: "dispatch" (the default: one derived seed per batched dispatch, decoded in one pass) or
            "item" (one seed per row, rows decoded one at a time), attached to seeded sampling requests. Static
            batching only: refill and streaming sample each request from its own seed (`batching.request_seed`),
            whatever the arrival timing.
        batching: "auto" (the default) streams where the pipeline allows it, else refills where it allows that
            and the ceiling is above 1, else runs static batches (`batching_in_force`); "stream" hands each
            request to the backend on its own as it arrives, `2 * max_batch_size` at once, and the engine's
            scheduler batches them (`StreamCollator`; vLLM backends, no decoding driver); "refill" decodes in one
            loop that refills a finished row's slot with the next request (`RefillCollator`; Hugging Face
            backend, controls that declare `supports_refill`); "static" runs each batch until its longest row
            ends (`LockLeaderCollator`).
    """

    runtime_kwargs: Mapping[str, Any] = field(default_factory=dict)
    chat_template_kwargs: Mapping[str, Any] | None = None
    max_batch_size: int = 8
    default_max_tokens: int = 1024
    reasoning_tags: tuple[str, str] | None = DEFAULT_THINK_TAGS
    reasoning_opened_at_start: bool = False
    reasoning_split: str = "auto"
    on_unsupported_param: str = "raise"
    seed_scope: str = DEFAULT_SEED_SCOPE
    batching: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.runtime_kwargs, Mapping):
            raise TypeError(
                f"ProviderOptions.runtime_kwargs must be a mapping of name to value; got "
                f"{type(self.runtime_kwargs).__name__} {self.runtime_kwargs!r}. Fix: pass a dict, e.g. "
                "runtime_kwargs={'substrings': ['...']}."
            )
        object.__setattr__(self, "runtime_kwargs", dict(self.runtime_kwargs))
        if self.chat_template_kwargs is not None:
            if not isinstance(self.chat_template_kwargs, Mapping):
                raise TypeError(
                    f"ProviderOptions.chat_template_kwargs must be a mapping or None; got "
                    f"{type(self.chat_template_kwargs).__name__} {self.chat_template_kwargs!r}."
                )
            object.__setattr__(self, "chat_template_kwargs", dict(self.chat_template_kwargs))
        for name in ("max_batch_size", "default_max_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(
                    f"ProviderOptions.{name} must be an integer >= 1; got {value!r}. Fix: set {name} (provider."
                    f"{name} in the app config) to a positive integer."
                )
        tags = self.reasoning_tags
        if tags is not None:
            if (
                isinstance(tags, str)
                or not isinstance(tags, Sequence)
                or len(tags) != 2
                or not all(isinstance(t, str) and t for t in tags)
            ):
                raise ValueError(
                    f"ProviderOptions.reasoning_tags must be None or a pair of non-empty strings (open, close); "
                    f"got {tags!r}. Fix: e.g. reasoning_tags=('<think>', '</think>'), or None to disable the split."
                )
            object.__setattr__(self, "reasoning_tags", (tags[0], tags[1]))
        if not isinstance(self.reasoning_opened_at_start, bool):
            raise TypeError(
                f"ProviderOptions.reasoning_opened_at_start must be a bool; got {self.reasoning_opened_at_start!r}."
            )
        for name, allowed in (
            ("reasoning_split", SPLIT_MODES),
            ("on_unsupported_param", UNSUPPORTED_POLICIES),
            ("seed_scope", SEED_SCOPES),
            ("batching", BATCHING_MODES),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"ProviderOptions.{name} must be one of {allowed}; got {value!r}.")

    def batch_ceiling(self, pipeline: Any) -> int:
        """The batch ceiling in force for `pipeline` (the most requests one dispatch may batch): `max_batch_size`,
        or 1 when an enabled control cannot batch (`pipeline.supports_batching` is False)."""
        return self.max_batch_size if pipeline.supports_batching else 1

    def batching_in_force(self, pipeline: Any) -> str:
        """ "stream", "refill" or "static" for `pipeline`: `batching` as given, or for "auto" stream where the
        pipeline can (`pipeline.stream_blockers()` is empty), else refill where it can (`refill_blockers()`) and
        the batch ceiling is above 1, else static. An explicit mode the pipeline cannot run raises ValueError
        naming why."""
        if self.batching == "static":
            return "static"
        found = {mode: _blockers(pipeline, f"{mode}_blockers") for mode in ("stream", "refill")}
        if self.batching != "auto":
            if found[self.batching]:
                raise ValueError(
                    f"ProviderOptions.batching={self.batching!r} but this pipeline cannot {self.batching}: "
                    f"{'; '.join(found[self.batching])}. Fix: use batching='auto' (the fastest mode the pipeline "
                    "allows) or 'static'."
                )
            return self.batching
        if not found["stream"]:
            return "stream"
        return "refill" if not found["refill"] and self.batch_ceiling(pipeline) > 1 else "static"


def _blockers(pipeline: Any, method: str) -> list[str]:
    blockers_of = getattr(pipeline, method, None)
    return blockers_of() if callable(blockers_of) else [f"the pipeline has no {method}()"]
