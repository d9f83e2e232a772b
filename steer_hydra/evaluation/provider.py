"""The Inspect model provider for a steered `SteeringPipeline` (registered with Inspect as `steer_hydra`).

`as_inspect_model(pipeline, options=ProviderOptions(...))` wraps a steered pipeline as an Inspect `Model`. Each
Inspect request (one per sample) is converted to one conversation, its `GenerateConfig` is mapped to pipeline
gen kwargs, and the request is handed to a `LockLeaderCollator`, which batches concurrent requests into
`pipeline.generate()` calls. The returned `Output` rows become the `ModelOutput` choices.

Contract:
- Generation only: tools, tool messages, logprob parameters and non-text content are refused with an error
  that explains the scope; every other `GenerateConfig` field is classified as mapped, handled upstream by
  Inspect, or subject to the unsupported-parameter policy (`ProviderOptions.on_unsupported_param`). One policy
  field maps when the pipeline can honour it: `response_schema` becomes the request's runtime kwarg
  `RESPONSE_SCHEMA_RUNTIME_KWARG` (its `json_schema`) when an enabled control declares that kwarg (a constrained
  decoding control) and the sample brings no output constraint of its own; otherwise the policy applies to it.
- Prompt path: with a chat template, conversations are dispatched as `messages=` (every input control runs as
  in deployment); without one, each conversation is rendered to plain text and dispatched as `text=` (no
  `adapt_messages`; token-level `adapt` still runs). The path is fixed at construction and warned about once.
- Batch ceiling and connections: the provider's `batch_ceiling` is the ceiling in force,
  `ProviderOptions.batch_ceiling(pipeline)`. Its `max_connections()` is twice the ceiling: under static batching
  the next full batch is queued when one ends, so the collator's worker starts it at once while Inspect finishes
  the previous batch's samples on its event loop; under refill a freed slot finds the next request waiting; when
  streaming, the engine holds up to twice the ceiling (vLLM's own `max_num_seqs` bounds what it decodes at once).
  **Pass `max_connections=model.api.max_connections()` to every `inspect_ai.eval` / `eval_set` call**: Inspect's
  adaptive concurrency (on by default) ignores `ModelAPI.max_connections()` unless `max_connections` is given,
  and with it given `max_samples` defaults to the same value.
- Batching (`ProviderOptions.batching_in_force`, the default "auto" picks the first the pipeline allows):
  "stream" hands each request to an engine that batches concurrent calls itself (vLLM), `max_connections()` at
  once (`stream_serving.StreamCollator`); "refill" decodes every request in one loop that refills a finished row's
  slot at once (`refill_serving.RefillCollator`, Hugging Face); "static" runs each batch until its longest row
  ends (`batching.LockLeaderCollator`).
- Errors: every error a request raises passes through the function given to `redact_errors_with` (the app's
  removes secret values in place) before Inspect records it in the sample's log.
- Context window: when the pipeline holds a local model whose config states its context window
  (`max_position_embeddings`, ...), a request whose prompt tokens (the conversation under the chat template, or
  the rendered text, before input controls adapt it) plus its `max_tokens` exceed it raises `PromptTooLongError`
  before it is queued: that sample fails alone, named, and the others are served. Backends without a local model
  (vLLM, a server) leave the check to the engine, which refuses such a prompt itself.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from inspect_ai.model import (
    ChatCompletionChoice,
    ChatMessageAssistant,
    ChatMessageTool,
    ContentReasoning,
    ContentText,
    GenerateConfig,
    Model,
    ModelAPI,
    ModelOutput,
    ModelUsage,
    modelapi,
)

from steer_hydra.core.controls import runtime_kwargs_schema
from steer_hydra.core.layout import CONTEXT_FIELDS, config_int
from steer_hydra.core.output import truncate_at_stop_strings
from steer_hydra.core.pipeline import RESERVED_TEMPLATE_KWARGS
from steer_hydra.core.rendering import encode_lock, has_chat_template, render_messages
from steer_hydra.evaluation.batching import LockLeaderCollator
from steer_hydra.evaluation.options import (
    CONSTRAINT_RUNTIME_KWARGS,
    POLICY_CHECKED_FIELDS,
    REFUSED_FIELDS,
    RESPONSE_SCHEMA_RUNTIME_KWARG,
    ProviderOptions,
)
from steer_hydra.evaluation.refill_serving import RefillCollator
from steer_hydra.evaluation.stream_serving import StreamCollator
from steer_hydra.evaluation.thinking import (
    ThinkingSplit,
    resolve_split_mode,
    split_thinking,
    split_thinking_ids,
)

if TYPE_CHECKING:
    from inspect_ai.model import ChatMessage
    from inspect_ai.tool import ToolChoice, ToolInfo

    from steer_hydra.core.output import Output
    from steer_hydra.core.pipeline import SteeringPipeline

logger = logging.getLogger(__name__)

PROVIDER_NAME = "steer_hydra"
DEFAULT_MODEL_NAME = "steering-pipeline"
RUNTIME_KWARGS_EXTRA_BODY_KEY = "runtime_kwargs"

_STOP_REASONS = {"length": "max_tokens", "stop": "stop", "eos": "stop"}

_GENERATION_ONLY = (
    "The steer_hydra provider is generation-only: it evaluates open-ended generations of a steering pipeline "
    "(output controls such as decoding drivers define no per-token distribution), so tools, tool messages, "
    "logprobs and non-text content are not supported. Use a non-agentic, text-only task."
)


class PromptTooLongError(ValueError):
    """A request whose prompt plus `max_tokens` does not fit the model's context window (that sample fails)."""


def context_window(pipeline: Any) -> tuple[int, str] | None:
    """`(tokens, config field)` of the context window of the pipeline's loaded local model, from its config; None
    when the pipeline holds no local model (vLLM, a server) or its config does not say."""
    config = getattr(getattr(pipeline, "model", None), "config", None)
    return config_int(config, CONTEXT_FIELDS) if config is not None else None


# Called on every error a request raises, before Inspect records it in the sample's log: the app passes one that
# removes secret values in place (`redact_errors_with`).
_error_redactor: Callable[[BaseException], None] | None = None


def redact_errors_with(redact: Callable[[BaseException], None] | None) -> None:
    """Pass every error a request raises through `redact` (in place) before Inspect records it; None: leave them."""
    global _error_redactor
    _error_redactor = redact


# called as builder(model_args, model_name): the name after `steer_hydra/` lets the builder check or infer the arm
PipelineBuilder = Callable[[Mapping[str, Any], str], "tuple[SteeringPipeline, ProviderOptions | None]"]
_pipeline_builder: PipelineBuilder | None = None


def set_pipeline_builder(builder: PipelineBuilder | None) -> None:
    """Let `--model steer_hydra/<name> -M key=value` build a steered pipeline from `model_args`.

    The Hydra app registers one (through the `inspect_ai` entry point) that composes its config groups with the
    model args as overrides (`-M arm=pasta -M base_model=tiny`). A provider built this way owns its pipeline and
    releases it on `close()`.
    """
    global _pipeline_builder
    _pipeline_builder = builder


class SteeringPipelineModelAPI(ModelAPI):
    """An Inspect `ModelAPI` that generates with a steered `SteeringPipeline` through a lock-leader collator.

    Build it with `as_inspect_model(pipeline, ...)`; the Inspect-standard arguments (`base_url`, `api_key`,
    `config`, `model_args`) are accepted for registry compatibility and ignored. A pipeline can't travel through
    `get_model(..., model_args)` (Inspect memoises on a JSON form in which objects become None).

    Args:
        model_name: The name after `steer_hydra/` in logs.
        pipeline: A steered pipeline (`pipeline.steer()` has run).
        options: `ProviderOptions` (defaults when None).
        trial_seed: The seed of sampling requests that set none (the runner passes the trial seed).
        generations: A `store.GenerationStore`: a deterministic request it holds (greedy, or seeded) is answered
            from it without generating, and a new one is kept there once generated (the output's metadata says
            `generation: shared` or `new`).
    """

    def __init__(
        self,
        model_name: str,
        base_url: str | None = None,
        api_key: str | None = None,
        api_key_vars: list[str] = [],  # noqa: B006 - Inspect's ModelAPI signature
        config: GenerateConfig = GenerateConfig(),
        *,
        pipeline: SteeringPipeline | None = None,
        options: ProviderOptions | None = None,
        trial_seed: int | None = None,
        generations: Any = None,
        **model_args: Any,
    ) -> None:
        super().__init__(model_name=model_name, config=GenerateConfig())
        self._owns_pipeline = False
        if pipeline is None and model_args and _pipeline_builder is not None:
            pipeline, built_options = _pipeline_builder(model_args, model_name)
            options = options if options is not None else built_options
            self._owns_pipeline = True
            model_args = {}
        if pipeline is None:
            raise ValueError(
                "SteeringPipelineModelAPI needs a pipeline. Build the model with "
                "steer_hydra.evaluation.as_inspect_model(pipeline, options=ProviderOptions(...)); a pipeline "
                "cannot be passed through get_model()/--model or model_args. From the Inspect CLI, name the config "
                "groups instead: --model steer_hydra/<name> -M arm=pasta -M base_model=tiny."
            )
        if not pipeline.is_steered:
            raise ValueError("The pipeline is not steered; call pipeline.steer() before as_inspect_model(pipeline).")
        if options is None:
            options = ProviderOptions()
        elif not isinstance(options, ProviderOptions):
            raise TypeError(f"options must be a ProviderOptions; got {type(options).__name__}.")
        if model_args:
            logger.debug("Ignoring model_args %s: the steer_hydra provider reads ProviderOptions.", model_args)
        self._pipeline = pipeline
        self._options = options
        self._trial_seed = None if trial_seed is None else int(trial_seed)
        self._generations = generations
        self._tokenizer = pipeline.tokenizer
        self._warned_params: set[str] = set()

        self._prompt_path = "messages" if has_chat_template(self._tokenizer) else "text"
        if self._prompt_path == "text":
            if options.chat_template_kwargs is not None:
                raise TypeError(
                    "ProviderOptions.chat_template_kwargs is set, but the tokenizer has no chat template, so prompts "
                    "take the text path where no template runs. Fix: remove chat_template_kwargs, or give the "
                    "tokenizer a chat_template."
                )
            warnings.warn(
                "The tokenizer has no chat template: conversations are rendered to plain text and dispatched as "
                "text= (prompt_path='text'). Input controls' adapt_messages does not run on this path (token-level "
                "adapt still does), so message-level input controls behave differently than with a chat model.",
                UserWarning,
                stacklevel=2,
            )

        self._batch_ceiling = options.batch_ceiling(pipeline)
        if self._batch_ceiling != options.max_batch_size:
            logger.info(
                "The pipeline has a control that does not support batching; the batch ceiling is clamped from "
                "max_batch_size=%d to %d (pass max_connections=model.api.max_connections(), now %d, to Inspect).",
                options.max_batch_size,
                self._batch_ceiling,
                self.max_connections(),
            )

        self._declared_scopes = {
            name: entry.get("scope", "call") for name, entry in runtime_kwargs_schema(pipeline.controls).items()
        }
        self._reasoning_split, self._reasoning_tag_ids = resolve_split_mode(
            self._tokenizer, options.reasoning_tags, options.reasoning_split
        )
        self._batching = options.batching_in_force(pipeline)
        logger.debug("Batching in force: %s (ProviderOptions.batching=%r)", self._batching, options.batching)
        self._context = context_window(pipeline)
        collator_kwargs: dict[str, Any] = dict(
            batch_ceiling=self._batch_ceiling,
            prompt_path=self._prompt_path,
            declared_scopes=self._declared_scopes,
            static_runtime_kwargs=options.runtime_kwargs,
            chat_template_kwargs=options.chat_template_kwargs,
        )
        if self._batching == "stream":
            self._collator = StreamCollator(pipeline, concurrency=self.max_connections(), **collator_kwargs)
        elif self._batching == "refill":
            self._collator = RefillCollator(pipeline, **collator_kwargs)
        else:
            self._collator = LockLeaderCollator(pipeline, **collator_kwargs)

    # ------------------------------------------------------------------ properties
    @property
    def pipeline(self) -> SteeringPipeline:
        """The wrapped pipeline."""
        return self._pipeline

    @property
    def options(self) -> ProviderOptions:
        """The provider options."""
        return self._options

    @property
    def prompt_path(self) -> str:
        """The prompt path: "messages" (chat template) or "text" (conversations rendered to plain text)."""
        return self._prompt_path

    @property
    def batch_ceiling(self) -> int:
        """The batch ceiling in force: `ProviderOptions.batch_ceiling(pipeline)`."""
        return self._batch_ceiling

    @property
    def inert_runtime_kwargs(self) -> frozenset[str]:
        """Runtime kwargs seen on either tier that no enabled control declares."""
        return self._collator.inert_runtime_kwargs

    @property
    def batching(self) -> str:
        """The batching in force: "stream", "refill" or "static"."""
        return self._batching

    @property
    def collator(self) -> LockLeaderCollator:
        """The collator serving this provider."""
        return self._collator

    # ------------------------------------------------------------------ ModelAPI hooks
    def max_tokens(self) -> int | None:
        return self._options.default_max_tokens

    def max_connections(self) -> int:
        """The `max_connections` to pass to Inspect (the rule and why: the module docstring)."""
        return 2 * self._batch_ceiling

    def connection_key(self) -> str:
        return f"{PROVIDER_NAME}:{id(self)}"

    def should_retry(self, ex: Exception) -> bool:
        return False

    def is_auth_failure(self, ex: Exception) -> bool:
        return False

    def tools_required(self) -> bool:
        return False

    def close(self) -> None:
        """Refuse new requests; a batch in flight completes. A pipeline passed in stays loaded (release it
        yourself); one built from `-M` model args is released here."""
        self._collator.close()
        if self._owns_pipeline:
            self._pipeline.release()

    async def aclose(self) -> None:
        self.close()

    # ------------------------------------------------------------------ generate
    async def generate(
        self,
        input: list[ChatMessage],
        tools: list[ToolInfo],
        tool_choice: ToolChoice,
        config: GenerateConfig,
    ) -> ModelOutput:
        try:
            return await self._generate(input, tools, config)
        except Exception as error:
            if _error_redactor is not None:
                _error_redactor(error)
            raise

    async def _generate(self, input: list[ChatMessage], tools: list[ToolInfo], config: GenerateConfig) -> ModelOutput:
        if self._collator.closed:
            raise RuntimeError("The steer_hydra provider is closed; build a new model with as_inspect_model().")
        if tools:
            names = ", ".join(getattr(t, "name", "?") for t in tools)
            raise NotImplementedError(f"This request offers tools ({names}). {_GENERATION_ONLY}")
        conversation = self._convert_input(input)
        gen_kwargs, per_sample, num_choices = self._map_generate_config(config)
        prompt: Any = conversation
        if self._prompt_path == "text":
            prompt = render_messages(self._tokenizer, conversation)
        self._check_context(prompt, gen_kwargs.get("max_new_tokens", self._options.default_max_tokens))
        key = None
        if self._generations is not None:
            request = {"prompt": prompt, "gen_kwargs": gen_kwargs, "runtime_kwargs": per_sample, "n": num_choices}
            key = self._generations.request_key(request)
            kept = self._generations.get(key) if key is not None else None
            if kept is not None:
                shared = ModelOutput.model_validate(kept)
                shared.metadata = {**(shared.metadata or {}), "generation": "shared"}
                return shared
        record = self._collator.admit(prompt, gen_kwargs, per_sample, num_choices)
        output = await self._collator.serve(record)
        result = self._assemble_model_output(output, stop_strings=gen_kwargs.get("stop_strings", ()))
        if key is not None:
            self._generations.put(key, result.model_dump(mode="json", exclude={"metadata"}))
            result.metadata = {**(result.metadata or {}), "generation": "new"}
        return result

    def prompt_tokens(self, prompt: Any) -> int:
        """Tokens of one prompt as the pipeline tokenizes it (chat template or plain text), before input controls."""
        template_kwargs = {
            k: v for k, v in (self._options.chat_template_kwargs or {}).items() if k not in RESERVED_TEMPLATE_KWARGS
        }
        with encode_lock(self._tokenizer):
            if self._prompt_path == "text":
                return len(self._tokenizer(prompt)["input_ids"])
            encoded = self._tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=True, **template_kwargs
            )
        return len(encoded["input_ids"])

    def _check_context(self, prompt: Any, max_tokens: int | None) -> None:
        """Raise `PromptTooLongError` when the prompt plus `max_tokens` exceed the model's context window."""
        if self._context is None:
            return
        context, field = self._context
        try:
            tokens = self.prompt_tokens(prompt)
        except Exception:  # noqa: BLE001 - a prompt the template refuses as given is the pipeline's to judge
            return
        wanted = tokens + int(max_tokens or 0)
        if wanted > context:
            raise PromptTooLongError(
                f"The prompt is {tokens} tokens and max_tokens is {max_tokens}: {wanted} tokens exceed the model's "
                f"context window of {context} tokens ({field}), so this sample is not generated. Fix: shorten the "
                "input, lower max_tokens (suite.generate_overrides.max_tokens), or use a model with a longer context."
            )

    def _convert_input(self, input: str | Sequence[ChatMessage]) -> list[dict[str, str]]:
        """Inspect messages to `{"role", "content": str}` dicts; refuses tools and non-text content."""
        if isinstance(input, str):
            return [{"role": "user", "content": input}]
        conversation: list[dict[str, str]] = []
        for message in input:
            if isinstance(message, ChatMessageTool) or message.role == "tool":
                raise NotImplementedError(f"The conversation contains a tool message. {_GENERATION_ONLY}")
            if getattr(message, "tool_calls", None):
                raise NotImplementedError(f"The conversation contains assistant tool calls. {_GENERATION_ONLY}")
            conversation.append({"role": message.role, "content": _text_content(message.content)})
        return conversation

    def _map_generate_config(self, config: GenerateConfig) -> tuple[dict[str, Any], dict[str, Any], int]:
        """Map a request's config to `(gen_kwargs, per_sample_runtime_kwargs, num_choices)`."""
        refused = [name for name in sorted(REFUSED_FIELDS) if getattr(config, name) is not None]
        if refused:
            setting = ", ".join(f"GenerateConfig.{name}={getattr(config, name)!r}" for name in refused)
            raise NotImplementedError(f"{setting} requests log probabilities. {_GENERATION_ONLY}")

        extra_body = dict(config.extra_body or {})
        per_sample = extra_body.pop(RUNTIME_KWARGS_EXTRA_BODY_KEY, None)
        if per_sample is None:
            per_sample = {}
        elif not isinstance(per_sample, Mapping):
            raise ValueError(
                f"extra_body[{RUNTIME_KWARGS_EXTRA_BODY_KEY!r}] must be a mapping of runtime-kwarg name to value; "
                f"got {type(per_sample).__name__} {per_sample!r}. Fix: store a dict in "
                "Sample.metadata['runtime_kwargs'] and use runtime_kwargs_solver()."
            )

        per_sample = dict(per_sample)
        for name in POLICY_CHECKED_FIELDS:
            value = getattr(config, name)
            if value is None:
                continue
            if name == "response_schema" and RESPONSE_SCHEMA_RUNTIME_KWARG in self._declared_scopes:
                # an enabled constrained-decoding control enforces it; a constraint of the sample's (or a static
                # one from the options) wins
                given = set(per_sample) | set(self._options.runtime_kwargs or {})
                if given.isdisjoint(CONSTRAINT_RUNTIME_KWARGS):
                    per_sample[RESPONSE_SCHEMA_RUNTIME_KWARG] = value.json_schema.model_dump(exclude_none=True)
                continue
            self._unsupported(f"GenerateConfig.{name}", name, value)
        for key, value in extra_body.items():
            if value is not None:
                self._unsupported(f"GenerateConfig.extra_body[{key!r}]", f"extra_body[{key!r}]", value)

        gen_kwargs: dict[str, Any] = {}
        if config.max_tokens is not None:
            gen_kwargs["max_new_tokens"] = int(config.max_tokens)
        if config.stop_seqs:
            gen_kwargs["stop_strings"] = tuple(config.stop_seqs)
        if config.temperature is not None:
            if config.temperature == 0:
                gen_kwargs["do_sample"] = False
            else:
                gen_kwargs["do_sample"] = True
                gen_kwargs["temperature"] = float(config.temperature)
                if config.top_p is not None:
                    gen_kwargs["top_p"] = float(config.top_p)
                if config.top_k is not None:
                    gen_kwargs["top_k"] = int(config.top_k)
                seed = config.seed if config.seed is not None else self._trial_seed
                if seed is not None:
                    gen_kwargs["seed"] = int(seed)
                    gen_kwargs["seed_scope"] = self._options.seed_scope
        num_choices = int(config.num_choices) if config.num_choices is not None else 1
        return gen_kwargs, per_sample, num_choices

    def _unsupported(self, label: str, name: str, value: Any) -> None:
        """Apply the unsupported-parameter policy to one parameter the pipeline cannot honor."""
        hint = (
            "The steering pipeline cannot honor it. Fix: drop it from the task or eval config, or set "
            "ProviderOptions(on_unsupported_param='warn') to ignore it with a warning."
        )
        if name == "response_schema":
            hint += (
                " (No constrained-decoding control is injected: the arm runs only the controls it declares. Add "
                "ConstrainedDecoding to the arm, +control@arm.controls.constrained=constrained_decoding, and the "
                f"schema constrains each output through its runtime kwarg {RESPONSE_SCHEMA_RUNTIME_KWARG}.)"
            )
        if self._options.on_unsupported_param == "raise":
            raise ValueError(f"{label}={value!r} is not supported by the steer_hydra provider. {hint}")
        if name not in self._warned_params:
            self._warned_params.add(name)
            warnings.warn(
                f"{label}={value!r} is not supported by the steer_hydra provider and is ignored "
                "(on_unsupported_param='warn'); this warning is shown once per parameter.",
                UserWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------------ output assembly
    def _assemble_model_output(self, output: Output, *, stop_strings: Sequence[str] = ()) -> ModelOutput:
        """Turn one pipeline `Output` (one row per candidate) into a `ModelOutput`."""
        texts = output.decode(self._tokenizer)
        rows = len(texts)
        reasons = list(output.finish_reasons or ())
        if len(reasons) != rows:
            reasons = [output.finish_reason] * rows
        choices: list[ChatCompletionChoice] = []
        unclosed = 0
        id_rows = output.output_ids.tolist() if self._reasoning_split == "tokens" else None
        for index, text in enumerate(texts):
            split: ThinkingSplit | None = None
            if self._reasoning_split == "text":
                split = split_thinking(
                    text,
                    self._options.reasoning_tags,
                    opened_at_start=self._options.reasoning_opened_at_start,
                    stop_strings=stop_strings,
                )
            elif self._reasoning_split == "tokens":
                split = split_thinking_ids(
                    id_rows[index],
                    self._tokenizer,
                    self._reasoning_tag_ids,
                    opened_at_start=self._options.reasoning_opened_at_start,
                    stop_strings=stop_strings,
                )
            content: str | list[Any]
            if split is None:
                content = truncate_at_stop_strings(text, stop_strings)
            else:
                unclosed += not split.closed
                if split.reasoning:
                    content = [ContentReasoning(reasoning=split.reasoning), ContentText(text=split.answer)]
                else:
                    content = split.answer
            message = ChatMessageAssistant(content=content, model=self.model_name, source="generate")
            choices.append(
                ChatCompletionChoice(message=message, stop_reason=_STOP_REASONS.get(reasons[index], "unknown"))
            )
        if unclosed:
            logger.warning(
                "%d of %d row(s) opened a thinking channel that never closed: the whole continuation is reasoning "
                "and the answer is empty. Raise max_tokens, or check ProviderOptions.reasoning_tags / "
                "reasoning_opened_at_start.",
                unclosed,
                rows,
            )
        returned = self._non_pad(output.output_ids)
        return ModelOutput(
            model=self.model_name,
            choices=choices,
            usage=self._usage(output, returned),
            metadata={"returned_output_tokens": returned},
        )

    def _non_pad(self, ids: Any) -> int:
        """Count of non-pad elements (all elements when the tokenizer has no pad id; 0 for None)."""
        if ids is None:
            return 0
        pad = getattr(self._tokenizer, "pad_token_id", None)
        return int(ids.numel()) if pad is None else int((ids != pad).sum())

    def _usage(self, output: Output, returned: int) -> ModelUsage:
        input_tokens = self._non_pad(output.adapted_input_ids)
        output_tokens = int(output.generated_tokens) if output.generated_tokens is not None else returned
        return ModelUsage(
            input_tokens=input_tokens, output_tokens=output_tokens, total_tokens=input_tokens + output_tokens
        )


def _text_content(content: str | Sequence[Any]) -> str:
    """A message's text: ContentText parts joined with no separator, reasoning parts dropped."""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, ContentText):
            parts.append(part.text)
        elif isinstance(part, ContentReasoning):
            continue
        else:
            raise NotImplementedError(f"The conversation contains {type(part).__name__} content. {_GENERATION_ONLY}")
    return "".join(parts)


@modelapi(name=PROVIDER_NAME)
def steer_hydra() -> type[ModelAPI]:
    """Registry entry for `steer_hydra/<name>` (the instance needs a pipeline: use `as_inspect_model`)."""
    return SteeringPipelineModelAPI


def _tag_class_with_registry_info() -> None:
    """Let directly constructed instances carry the provider's registry name (so `str(Model(api, ...))` works)."""
    try:
        from inspect_ai._util.registry import registry_info, set_registry_info
    except ImportError:  # pragma: no cover - Inspect moved its registry helpers; as_inspect_model still tags
        return
    set_registry_info(SteeringPipelineModelAPI, registry_info(steer_hydra))


_tag_class_with_registry_info()


def as_inspect_model(
    pipeline: SteeringPipeline,
    *,
    options: ProviderOptions | None = None,
    trial_seed: int | None = None,
    model_name: str = DEFAULT_MODEL_NAME,
    generations: Any = None,
) -> Model:
    """Wrap a steered pipeline as an Inspect `Model` named `steer_hydra/<model_name>`.

    `model.api` is the `SteeringPipelineModelAPI`. `trial_seed` is the seed of sampling requests that set none
    (the runner passes the trial seed). Pass `max_connections=model.api.max_connections()` to `inspect_ai.eval` /
    `eval_set` (see the module docstring); Inspect never closes the model, so call `model.api.close()` and release
    the pipeline yourself when done.

    Example:
        >>> model = as_inspect_model(pipeline, options=ProviderOptions(max_batch_size=8))
        >>> logs = inspect_ai.eval(task, model=model, max_connections=model.api.max_connections(), temperature=0)
    """
    api = steer_hydra(model_name, pipeline=pipeline, options=options, trial_seed=trial_seed, generations=generations)
    return Model(api, GenerateConfig())
