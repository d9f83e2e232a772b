"""`TokenEngineBackend`: the shared half of the vLLM backends (client-side tokenizer, token-id rows, rollouts).

An engine backend has no live `nn.Module`: the tokenizer runs here, prompts go to the engine as token ids
(each row's real tokens only), every row is one request with its own sampling fields and seed, and the
engine returns candidate token ids that come back as a right-padded `[rows * n, new]` tensor grouped by
prompt. Subclasses implement `_open` (boot the engine or connect to the server; called by `ready()`, once the
controls are prepared), `_complete` (run one list of requests) and `_close`.

What it can do is what it advertises: sampled rollouts (best-of-n) and serving a checkpoint, plus layer-vector
state controls (CAA, ActAdd with a given vector) lowered into the engine per request (`vllm_steering`), and output
controls that hand per-row request fields (`RequestFields`, e.g. ConstrainedDecoding's `structured_outputs`) in
place of a live logits processor, merged into each prompt row's request. It cannot run other hooks, attention
edits, live logits processors or stopping criteria, hidden-state capture, or beam proposals;
`SteeringPipeline.check()` refuses controls that need them before anything loads.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from steer_hydra.backends.vllm.lowering import (
    expand_candidates,
    pad_continuations,
    prompt_rows,
    refuse_extra,
    rollout_params,
    rollout_seeds,
    row_seeds,
    sampling_fields,
)
from steer_hydra.backends.vllm.steering import EngineSteering, needs_fit
from steer_hydra.core.backend import Backend
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import RequestFields
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.source import ModelSource
from steer_hydra.core.tensors import eos_ids
from steer_hydra.models import resolve_model_reference

logger = logging.getLogger(__name__)


class TokenEngineBackend(EngineSteering, Backend):
    """Base of backends that generate on a vLLM engine (in this process or behind a server) from token ids.

    Declares sampled rollouts and checkpoint serving as capabilities, `native_n` (the engine returns the `n`
    candidates), `batches_distinct_seeds` (a seed per request) and `streams` (calls from several threads run at
    once: each request goes to the engine, whose scheduler batches them); no refill engine (`supports_refill`).
    """

    capabilities: ClassVar[frozenset[Capability]] = frozenset(
        {Capability.SAMPLED_ROLLOUTS, Capability.SERVE_CHECKPOINT}
    )
    native_n: ClassVar[bool] = True
    batches_distinct_seeds: ClassVar[bool] = True
    streams: ClassVar[bool] = True
    # the model group's `hf_model_kwargs.dtype` sets the engine's dtype where its options leave it to vLLM ("auto"),
    # so a model config gives the same numerics on Hugging Face and in the engine (and its vectors are fitted so)
    uses_model_dtype: ClassVar[bool] = False

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.model_path: str | None = None
        self._rollout_seed: int | None = None
        self._rollout_calls = 0
        self._lock = threading.Lock()
        self._generation_eos: list[int] = []
        self._reference: str | None = None
        self._trust_remote_code = False
        self._opened = False
        self._model_dtype: Any = None

    @classmethod
    def uses_model_dtype_with(cls, options: Mapping[str, Any]) -> bool:
        """Whether the engine runs at the model group's `hf_model_kwargs.dtype` with these options."""
        return cls.uses_model_dtype

    @classmethod
    def _model_dtype_of(cls, source: ModelSource, options: Mapping[str, Any]) -> Any:
        """The model group's dtype where the engine runs at it (`uses_model_dtype_with`), else None: what a vector
        is fitted in, in a job (`load`) and ahead of one (`fit_ahead`) alike."""
        return source.hf_model_kwargs.get("dtype") if cls.uses_model_dtype_with(options) else None

    @classmethod
    def fit_ahead(cls, controls: Sequence[Any], source: ModelSource, options: Mapping[str, Any]) -> list[Path]:
        """The vectors `controls` fit from hidden states (`needs_fit`), fitted on one Hugging Face load of the
        checkpoint, with the tokenizer and dtype a job's `load` takes, into the cache `steer_control` reads."""
        from steer_hydra.backends.vllm.fit import fit_vectors

        todo = [c for c in controls if needs_fit(c)] if cls.fits_vectors_with(options) else []
        if not todo or not source.model_name_or_path:
            return []
        model_path, tokenizer, dtype = cls._checkpoint_of(source, options)
        return fit_vectors(todo, model_path, tokenizer, trust_remote_code=source.trust_remote_code, dtype=dtype)

    @classmethod
    def _checkpoint_of(cls, source: ModelSource, options: Mapping[str, Any]) -> tuple[str, Any, Any]:
        """`(checkpoint path, tokenizer, dtype)` as a job's `load` takes them, for work done ahead of the jobs."""
        model_path = resolve_model_reference(source.model_name_or_path)
        tokenizer = cls._client_tokenizer(None, source.tokenizer_name_or_path or model_path, source.trust_remote_code)
        return model_path, tokenizer, cls._model_dtype_of(source, options)

    # ------------------------------------------------------------------ load
    def load(self, source: ModelSource, *, model: Any = None, tokenizer: Any = None) -> None:
        if model is not None:
            raise ValueError(
                f"backend={self.kind} generates with its own engine and cannot adopt a preloaded model= "
                f"({type(model).__name__}). Fix: pass model_name_or_path= (save_pretrained a custom model first), "
                "or use backend=huggingface."
            )
        self._model_dtype = self._model_dtype_of(source, self.options)
        uses_dtype = self.uses_model_dtype_with(self.options)
        unused = sorted(k for k in source.hf_model_kwargs if not (k == "dtype" and uses_dtype))
        if unused:
            logger.warning(
                "hf_model_kwargs %s are not used by backend=%s; engine settings go in the backend options.",
                unused,
                self.kind,
            )
        model_reference = source.model_name_or_path
        self.model_path = resolve_model_reference(model_reference) if model_reference else None
        self._trust_remote_code = source.trust_remote_code
        reference = source.tokenizer_name_or_path or self.model_path
        self.tokenizer = self._client_tokenizer(tokenizer, reference, source.trust_remote_code)
        self._generation_eos = _generation_config_eos(self.model_path)
        self._reference = model_reference

    def ready(self) -> None:
        """Start the engine (or connect to the server) once the controls are prepared: a vector fitted on the
        Hugging Face model (`fit`) is released before the engine takes the device."""
        if not self._opened:
            self._open(model_name_or_path=self._reference, trust_remote_code=self._trust_remote_code)
            self._opened = True

    @classmethod
    def _client_tokenizer(cls, tokenizer: Any, reference: str | None, trust_remote_code: bool) -> Any:
        """`tokenizer`, else the one at `reference` (the tokenizer's or the model's), with a pad token."""
        from steer_hydra.backends.huggingface import ensure_pad_token

        if tokenizer is None:
            if reference is None:
                raise ValueError(
                    f"backend={cls.kind} tokenizes prompts client-side and needs a tokenizer: pass tokenizer=, "
                    "tokenizer_name_or_path= or model_name_or_path=."
                )
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(
                resolve_model_reference(reference), trust_remote_code=trust_remote_code
            )
        ensure_pad_token(tokenizer)
        return tokenizer

    @abstractmethod
    def _open(self, *, model_name_or_path: str | None, trust_remote_code: bool) -> None:
        """Boot the engine or connect to the server (the tokenizer is loaded already)."""

    @abstractmethod
    def _complete(self, prompts: Sequence[list[int]], fields: Sequence[dict[str, Any]]) -> list[list[list[int]]]:
        """Run one request per prompt row; return each row's candidates' token ids (index order)."""

    @abstractmethod
    def _close(self) -> None:
        """Shut the engine down or close the connection pool; safe to call twice."""

    # ------------------------------------------------------------------ generate
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
        request_fields, live = split_request_fields(logits_processors)
        self._refuse_live(live, stopping_criteria)
        refuse_extra(params, self.kind)
        prompts = prompt_rows(input_ids.cpu(), attention_mask.cpu())
        return self._run(prompts, params, row_seeds(params, seeds, len(prompts)), request_fields)

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
        """Prompt plus continuation rows for decoding drivers: sampled proposals (`num_return_sequences`, ...).

        Seeded when the pipeline seeds the driver's decode (`seeded(seed)`): the k-th rollout's rows get
        `derive_item_seed(seed, "rollout-k", row)`, so successive proposals differ and a rerun repeats them.
        """
        request_fields, live = split_request_fields(logits_processors)
        self._refuse_live(live, stopping_criteria)
        params = rollout_params(
            gen_kwargs, stop_strings=stop_strings, stop_token_ids=stop_token_ids, backend_kind=self.kind
        )
        prompts = prompt_rows(input_ids.cpu(), attention_mask.cpu())
        with self._lock:
            call, self._rollout_calls = self._rollout_calls, self._rollout_calls + 1
            seed = self._rollout_seed
        seeds = [None] * len(prompts) if params.greedy else rollout_seeds(seed, call, len(prompts))
        continuations = self._run(prompts, params, seeds, request_fields).to(input_ids.device)
        return torch.cat([input_ids.repeat_interleave(params.n, 0), continuations], dim=1)

    def _run(
        self,
        prompts: list[list[int]],
        params: GenerationParams,
        seeds: Sequence[int | None],
        request_fields: Sequence[RequestFields] = (),
    ) -> torch.Tensor:
        steering = self._steering_fields(prompts)  # layer-vector controls lowered to the engine (vllm_steering)
        fields = [sampling_fields(params, seed=seed) | extra for seed, extra in zip(seeds, steering, strict=True)]
        for given in request_fields:  # output controls' per-row fields (e.g. structured outputs), one request per row
            for row, extra in zip(fields, given.for_prompts(len(prompts)), strict=True):
                clash = sorted(set(row) & set(extra))
                if clash:
                    raise ValueError(
                        f"Two sources set request field(s) {clash} of one engine request on backend={self.kind}. "
                        "Fix: enable one output control that sets them."
                    )
                row.update(extra)
        candidates = self._complete(prompts, fields)
        return pad_continuations(expand_candidates(candidates, params.n), self.tokenizer.pad_token_id)

    def _refuse_live(self, logits_processors: Sequence[Any], stopping_criteria: Sequence[Any]) -> None:
        live = [type(x).__name__ for x in (*logits_processors, *stopping_criteria)]
        if live:
            raise ValueError(
                f"backend={self.kind} cannot run live logits processors or stopping criteria ({', '.join(live)}); "
                "the output controls that produce them need in-process torch. Fix: use backend=huggingface, or "
                "express stops through StoppingRules (lowered to the engine)."
            )

    @contextlib.contextmanager
    def seeded(self, seed: int | None) -> Iterator[None]:
        """Seed the driver's rollouts (and torch's RNG, for the driver's own draws) for the body."""
        with self._lock:
            previous, self._rollout_seed, self._rollout_calls = self._rollout_seed, seed, 0
        try:
            with super().seeded(seed):
                yield
        finally:
            with self._lock:
                self._rollout_seed = previous

    @property
    def eos_token_ids(self) -> list[int]:
        """The tokenizer's eos id plus the eos ids of the checkpoint's generation config (when it is local)."""
        return eos_ids(super().eos_token_ids, self._generation_eos)

    def release(self) -> None:
        self._close()
        self._opened = False
        self.model = None


def split_request_fields(processors: Sequence[Any]) -> tuple[list[RequestFields], list[Any]]:
    """The `RequestFields` among an output stack's processors (merged into the requests) and the live rest."""
    fields = [p for p in processors if isinstance(p, RequestFields)]
    return fields, [p for p in processors if not isinstance(p, RequestFields)]


def _generation_config_eos(model_path: str | None) -> list[int]:
    """eos ids from `generation_config.json` next to a local checkpoint (nothing for hub ids or servers)."""
    if model_path is None or not (Path(model_path) / "generation_config.json").exists():
        return []
    from transformers import GenerationConfig

    try:
        value = GenerationConfig.from_pretrained(model_path).eos_token_id
    except (OSError, ValueError) as error:
        logger.debug("No generation config eos ids from %s: %s", model_path, error)
        return []
    return eos_ids(value)
