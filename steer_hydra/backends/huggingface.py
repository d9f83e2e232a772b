"""The Hugging Face backend: in-process `model.generate`, hooks applied for one call, stop criteria, seeds."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    LogitsProcessorList,
    StoppingCriteriaList,
)

from steer_hydra.backends.refill import RefillEngine
from steer_hydra.core.backend import Backend
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import HookSet
from steer_hydra.core.params import GenerationParams
from steer_hydra.core.source import ModelSource
from steer_hydra.core.stopping import StopOnStrings, StopOnTokens
from steer_hydra.core.tensors import eos_ids
from steer_hydra.models import resolve_model_reference
from steer_hydra.models.loading import ensure_loaded, model_construction

logger = logging.getLogger(__name__)


class HFBackend(Backend):
    """Generation with `transformers` in this process; the only backend that runs hooks and beam proposals.

    Declares every in-process capability (live model, hidden-state capture, beam proposals, sampled rollouts) and
    `supports_refill` (`refill_engine`); it repeats rows for `n` and decodes rows of distinct seeds one by one.
    """

    kind = "huggingface"
    capabilities = frozenset(
        {Capability.IN_PROCESS_TORCH, Capability.HIDDEN_CAPTURE, Capability.BEAM_PROPOSALS, Capability.SAMPLED_ROLLOUTS}
    )
    supports_refill = True

    def load(self, source: ModelSource, *, model: Any = None, tokenizer: Any = None) -> None:
        device = source.device
        if tokenizer is None:
            reference = source.tokenizer_name_or_path or source.model_name_or_path
            if reference is None:
                raise ValueError("No tokenizer: pass tokenizer= or a ModelSource with a model or tokenizer reference.")
            tokenizer = AutoTokenizer.from_pretrained(
                resolve_model_reference(reference), trust_remote_code=source.trust_remote_code
            )
        if model is None:
            if source.model_name_or_path is None:
                raise ValueError("No model: pass model= or a ModelSource with model_name_or_path.")
            kwargs = dict(source.hf_model_kwargs)
            if device is None and source.device_map is not None:
                if importlib.util.find_spec("accelerate") is not None:
                    kwargs.setdefault("device_map", source.device_map)
                elif torch.cuda.is_available():
                    device = "cuda"
            logger.info("Loading %s", source.model_name_or_path)
            with model_construction():  # transformers' from_pretrained is not thread-safe (models/loading.py)
                model = AutoModelForCausalLM.from_pretrained(
                    resolve_model_reference(source.model_name_or_path), **kwargs
                )
        if device is not None:
            model = model.to(device)
        ensure_loaded(model, source.model_name_or_path)
        model.eval()
        ensure_pad_token(tokenizer, model)
        self.model, self.tokenizer = model, tokenizer

    def load_auxiliary_model(
        self, reference: str, *, head: str = "causal_lm", with_tokenizer: bool = False
    ) -> torch.nn.Module | tuple[torch.nn.Module, Any]:
        """Load `reference` (a built-in `steer_hydra:` reference, Hub id or path) onto the model's device and dtype,
        as a causal LM or (`head="sequence_classification"`) a sequence classifier; with its tokenizer on request."""
        if self.model is None:
            raise RuntimeError("Load the model before an auxiliary model (HFBackend.load).")
        auto = {"causal_lm": AutoModelForCausalLM, "sequence_classification": AutoModelForSequenceClassification}
        if head not in auto:
            raise ValueError(f"HFBackend.load_auxiliary_model: unknown head {head!r}. Fix: one of {sorted(auto)}.")
        dtype = next(self.model.parameters()).dtype
        path = resolve_model_reference(reference)
        logger.info("Loading auxiliary model %s (%s)", reference, head)
        with model_construction():
            aux = auto[head].from_pretrained(path, dtype=dtype)
        ensure_loaded(aux, reference)
        aux = aux.to(self.device).eval()
        return (aux, AutoTokenizer.from_pretrained(path)) if with_tokenizer else aux

    def _generate_kwargs(
        self,
        input_ids: torch.Tensor,
        stop_strings: Sequence[str],
        stop_token_ids: Sequence[int],
        logits_processors: Sequence[Any],
        stopping_criteria: Sequence[Any],
    ) -> dict[str, Any]:
        criteria = list(stopping_criteria)
        prompt_len = input_ids.shape[1]
        if stop_strings:
            criteria.append(StopOnStrings(self.tokenizer, stop_strings, prompt_len))
        if stop_token_ids:
            criteria.append(StopOnTokens(stop_token_ids, prompt_len))
        return {
            "logits_processor": LogitsProcessorList(logits_processors),
            "stopping_criteria": StoppingCriteriaList(criteria),
            "pad_token_id": self.tokenizer.pad_token_id,
        }

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
        if len(set(seeds)) > 1:
            raise ValueError(
                "HFBackend.generate needs one seed per call; the pipeline decodes distinct seeds serially."
            )
        if params.n != 1:
            raise ValueError("HFBackend.generate takes n=1; the pipeline repeats rows for n candidates.")
        kwargs = self._generate_kwargs(
            input_ids, params.stop_strings, params.stop_token_ids, logits_processors, stopping_criteria
        )
        kwargs.update(sampling_kwargs(params))
        kwargs.update(params.extra)
        with self.seeded(seeds[0] if seeds else None), torch.no_grad():
            sequences = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        return sequences[:, input_ids.shape[1] :]

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
        kwargs = self._generate_kwargs(input_ids, stop_strings, stop_token_ids, logits_processors, stopping_criteria)
        kwargs.update(gen_kwargs)
        with torch.no_grad():
            return self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    @contextlib.contextmanager
    def applied(self, hooks: Sequence[HookSet]) -> Iterator[None]:
        """Register every hook for the body only; removed on exit, also when the body raises."""
        with contextlib.ExitStack() as stack:
            for hook_set in hooks:
                for spec in hook_set.get("pre", ()):
                    module = self.model.get_submodule(spec["module"])
                    stack.callback(module.register_forward_pre_hook(spec["hook_func"], with_kwargs=True).remove)
                for spec in hook_set.get("forward", ()):
                    module = self.model.get_submodule(spec["module"])
                    stack.callback(module.register_forward_hook(spec["hook_func"], with_kwargs=True).remove)
                for spec in hook_set.get("backward", ()):
                    module = self.model.get_submodule(spec["module"])
                    stack.callback(module.register_full_backward_hook(spec["hook_func"]).remove)
                for factory in hook_set.get("context", ()):
                    stack.enter_context(factory())
            yield

    def refill_engine(self, max_rows: int, build_hooks: Any) -> RefillEngine:
        """A `RefillEngine` on this model: slots of finished rows are refilled between decode steps."""
        return RefillEngine(
            self.model,
            self.tokenizer,
            max_rows=max_rows,
            build_hooks=build_hooks,
            applied=self.applied,
            eos_token_ids=eos_ids(getattr(self.model.generation_config, "eos_token_id", None)),
        )

    def release(self) -> None:
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def sampling_kwargs(params: GenerationParams) -> dict[str, Any]:
    """`model.generate` names for the decoding parameters of `params`."""
    kwargs: dict[str, Any] = {"max_new_tokens": params.max_new_tokens, "do_sample": not params.greedy}
    if params.min_new_tokens:
        kwargs["min_new_tokens"] = params.min_new_tokens
    if params.repetition_penalty is not None:
        kwargs["repetition_penalty"] = params.repetition_penalty
    if params.greedy:
        # neutralize sampling defaults a checkpoint's generation_config may carry
        kwargs.update(temperature=None, top_p=None, top_k=None)
    else:
        kwargs.update(
            temperature=params.temperature if params.temperature else 1.0,
            top_p=params.top_p if params.top_p is not None else 1.0,
            top_k=params.top_k if params.top_k is not None else 0,
        )
    return kwargs


def ensure_pad_token(tokenizer: Any, model: Any = None) -> None:
    """Give the tokenizer a pad token (eos when it has none) and left padding."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if model is not None and getattr(model.generation_config, "pad_token_id", None) is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
