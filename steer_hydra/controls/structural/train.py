"""Trainers as controls: SFT and DPO (TRL) train a LoRA adapter (or full weights) at `steer()`, once per content
digest, then serve it through the LoRA path.

How it runs (Hugging Face): `steer()` takes the arm's training rows (a dataset file or rows such as a concept's
contrastive pairs; rows of another split than `split` never reach the trainer: `steer_hydra.controls.rows`),
formats them for the trainer (chat messages when the tokenizer has a chat template, plain text otherwise) and
computes the training key: a digest of the trainer, its arguments, the rows, the base model's weights
(`weights_digest` of the live model, so an earlier structural control's edit counts), the tokenizer and the TRL
version. The adapter is trained (TRL's `SFTTrainer` / `DPOTrainer`, on a copy of the live model, which stays
untouched; tqdm shows progress) only when the artifact cache (`<cache>/adapters/<key>/`) holds no entry for the key,
and then applied exactly as a given adapter: a `LoRAAdapter` on the live model (merged or live layers, restored bit
for bit at release). `full=True` trains every weight instead and swaps them in (`WeightSwap`, as LoadCheckpoint).

Interruptions: training writes into the entry's work folder and checkpoints every `save_steps` steps there; a killed
training leaves no cache entry (the finished adapter is renamed into place whole) and the next `steer()` with the
same key resumes from the last checkpoint (or restarts when there is none).

On the vLLM backends (LoRA only): the backend calls `prepare_for_engine(model_path, ...)` first, which trains (or
finds) the adapter on the Hugging Face model of the engine's checkpoint before the engine boots, then serves it per
request like any LoRAAdapter (`export_lora`). The base model's digest is memoised per checkpoint folder, so a cached
adapter needs no second load of the model (`artifacts.BuildsForEngine`); the app trains it ahead of the jobs, beside
the run's other trainings on one load (`Backend.fit_ahead`).

Identity: the configuration's `config_id` holds the trainer, its Args (rows included) and a data file's sha256
(`content_digests`); `vector_hash` is the trained adapter's (or weights') content digest.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, ClassVar

import torch

from steer_hydra.controls.rows import (
    CHOSEN_KEYS,
    PROMPT_KEYS,
    REJECTED_KEYS,
    RESPONSE_KEYS,
    first,
    read_rows,
    rows_digest,
    split_rows,
)
from steer_hydra.controls.structural.artifacts import (
    BuildsForEngine,
    build_artifact,
    cache_root,
    content_key,
    file_sha256,
    folder_sha256,
    is_complete,
    memoise_digest,
    memoised_digest,
    read_record,
    tokenizer_digest,
    weights_digest,
)
from steer_hydra.controls.structural.checkpoint import WeightSwap, folder_tensors
from steer_hydra.controls.structural.lora import LoRAAdapter, LoRAArtifact
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, StructuralControl
from steer_hydra.core.files import read_json, write_json

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'steer_hydra[train]' (TRL)"
FORMAT_VERSION = 1  # bump when the formatting or the training recipe below changes: cached adapters are retrained


def import_trl() -> Any:
    """The `trl` module, or an ImportError naming the extra to install."""
    try:
        import trl
    except ImportError as error:
        raise ImportError(f"The trainer controls (SFTAdapter, DPOAdapter) need TRL: {INSTALL_HINT}.") from error
    return trl


def _has_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


class TrainedAdapter(BuildsForEngine, StructuralControl):
    """Base of the trainer controls: rows in, a cached adapter (or weights) out, applied as a LoRAAdapter.

    Subclasses set `TRAINER` and implement `format_row` and `_trainer` (the TRL trainer of their method).
    """

    TRAINER: ClassVar[str] = "trainer"
    # Args that change what is trained (part of the training key); the others (merge, name, cache_dir) only how
    # the result is served or where it is kept
    _SERVING_ARGS: ClassVar[frozenset[str]] = frozenset({"merge", "name", "cache_dir", "data", "split"})

    @dataclass(frozen=True)
    class Args(BaseArgs):
        data: str | list[dict[str, Any]]
        split: str | None = "train"
        full: bool = False
        lora_r: int = 8
        lora_alpha: int = 16
        lora_dropout: float = 0.0
        target_modules: str | list[str] = "all-linear"
        epochs: float = 1.0
        max_steps: int = -1
        learning_rate: float = 1e-4
        batch_size: int = 4
        gradient_accumulation_steps: int = 1
        max_length: int = 512
        seed: int = 0
        save_steps: int = 50
        gradient_checkpointing: bool = False
        merge: bool = True
        name: str | None = None
        cache_dir: str | None = None

        def validate(self) -> None:
            owner = type(self).__qualname__.rsplit(".", 1)[0]
            if isinstance(self.data, str) and not self.data.strip():
                raise ValueError(f"{owner}.data must be a dataset file or rows; got ''. Fix: data=<file.jsonl>.")
            if isinstance(self.data, list) and not self.data:
                raise ValueError(f"{owner}.data holds no rows. Fix: give training rows or a dataset file.")
            positive = {
                "lora_r": self.lora_r,
                "lora_alpha": self.lora_alpha,
                "batch_size": self.batch_size,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "max_length": self.max_length,
                "save_steps": self.save_steps,
                "learning_rate": self.learning_rate,
                "epochs": self.epochs,
            }
            for name, value in positive.items():
                if value <= 0:
                    raise ValueError(f"{owner}.{name} must be > 0; got {value}. Fix: a positive value.")
            if self.max_steps == 0 or self.max_steps < -1:
                raise ValueError(
                    f"{owner}.max_steps must be -1 (train for `epochs`) or positive; got {self.max_steps}."
                )
            if not 0 <= self.lora_dropout < 1:
                raise ValueError(f"{owner}.lora_dropout must be in [0, 1); got {self.lora_dropout}.")

    supports_batching = True
    supports_refill = True
    restores_base = True  # edits the given model in place and restores it bit for bit: runs on a shared base

    def _configure(self) -> None:
        self._adapter: LoRAAdapter | None = None
        self._swap = WeightSwap()
        self._digest: str | None = None
        self.artifact_path: Path | None = None
        self.trained_steps = 0  # optimizer steps run by the last steer() (0 when the adapter came from the cache)
        self.resumed_from_step = 0  # the checkpoint's step a resumed training started from
        self.trainer_callbacks: list[Any] = []  # extra transformers TrainerCallbacks (not part of the identity)
        self.last_train_dataset: Any = None  # the dataset the trainer received (a `datasets.Dataset`)

    # ------------------------------------------------------------------ data and identity
    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """A dataset file's sha256 (`data_sha256`): a changed file gives a new configuration id (and retrains)."""
        data = args.get("data")
        if isinstance(data, (str, Path)) and str(data).strip() and Path(data).expanduser().is_file():
            return {"data_sha256": file_sha256(Path(data).expanduser())}
        return {}

    def source_rows(self) -> list[dict[str, Any]]:
        """The training rows: the data's rows of `split` (a dev or test row never gets here)."""
        where = f"{type(self).__name__}.data"
        return split_rows(read_rows(self.data, where=where), self.split, where=where)

    def training_rows(self, tokenizer: Any) -> list[dict[str, Any]]:
        """The rows as the trainer receives them (`format_row` of each training row)."""
        chat = _has_template(tokenizer)
        return [self.format_row(row, chat=chat) for row in self.source_rows()]

    def format_row(self, row: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
        raise NotImplementedError

    def training_settings(self) -> dict[str, Any]:
        """The Args that change what is trained."""
        return {k: v for k, v in self.arg_values().items() if k not in self._SERVING_ARGS}

    def training_key(self, rows: list[dict[str, Any]], base_digest: str, tokenizer: Any) -> str:
        """The cache key: trainer, settings, rows, base weights, tokenizer, TRL version (see the module docstring)."""
        return content_key(
            {
                "trainer": self.TRAINER,
                "format": FORMAT_VERSION,
                "settings": self.training_settings(),
                "rows": rows_digest(rows),
                "base": base_digest,
                "tokenizer": tokenizer_digest(tokenizer),
                "trl": version("trl") if self._trl_installed() else None,
            }
        )

    @staticmethod
    def _trl_installed() -> bool:
        import importlib.util

        return importlib.util.find_spec("trl") is not None

    @property
    def vector_hash(self) -> str | None:
        """The trained adapter's (or weights') content digest once steered, recorded in provenance."""
        return self._digest

    def provenance(self) -> dict[str, Any]:
        """The cache entry, the steps trained now (0: reused) and what the entry recorded, once steered."""
        if self.artifact_path is None:
            return {}
        return {
            "artifact": str(self.artifact_path),
            "trained_steps": self.trained_steps,
            "training": self.training_record,
        }

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        """The live model on Hugging Face; the vLLM backends serve the adapter per request (`export_lora`)."""
        return frozenset({Capability.IN_PROCESS_TORCH})

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        if backend_kind in ("vllm", "vllm_serve") and self.full:
            return [
                f"{type(self).__name__} with full=true trains every weight, which an engine cannot take per request. "
                "Fix: full=false (a LoRA adapter, served per request), or backend=huggingface."
            ]
        return []

    # ------------------------------------------------------------------ training
    def _trainer(self, model: torch.nn.Module, tokenizer: Any, dataset: Any, config: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _common_config(self, work: Path, dtype: torch.dtype) -> dict[str, Any]:
        """The TrainingArguments every trainer shares. Precision follows the model's dtype (TRL's configs default to
        bf16 mixed precision, which on a CPU is both slower and a different computation than the model's own)."""
        return {
            "bf16": dtype == torch.bfloat16,
            "fp16": dtype == torch.float16,
            "gradient_checkpointing": bool(self.gradient_checkpointing),
            "output_dir": str(work / "checkpoints"),
            "num_train_epochs": float(self.epochs),
            "max_steps": int(self.max_steps),
            "per_device_train_batch_size": int(self.batch_size),
            "gradient_accumulation_steps": int(self.gradient_accumulation_steps),
            "learning_rate": float(self.learning_rate),
            "seed": int(self.seed),
            "data_seed": int(self.seed),
            "max_length": int(self.max_length),
            "save_strategy": "steps",
            "save_steps": int(self.save_steps),
            "save_total_limit": 1,
            "logging_steps": max(1, int(self.save_steps) // 5),
            "report_to": [],
            "use_cpu": not torch.cuda.is_available(),
            "dataloader_num_workers": 0,
            "disable_tqdm": False,
        }

    def _lora_config(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=int(self.lora_r),
            lora_alpha=int(self.lora_alpha),
            lora_dropout=float(self.lora_dropout),
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )

    def _train(self, model: torch.nn.Module, tokenizer: Any, rows: list[dict[str, Any]], work: Path, out: Path) -> None:
        """Train on a copy of `model` and write the adapter (or the full weights) into `out`."""
        import_trl()
        from datasets import Dataset

        checkpoints = work / "checkpoints"
        resume = sorted(checkpoints.glob("checkpoint-*"), key=lambda p: int(p.name.rsplit("-", 1)[-1]))
        self.resumed_from_step = int(resume[-1].name.rsplit("-", 1)[-1]) if resume else 0
        write_json(work / "rows.json", {"count": len(rows), "digest": rows_digest(rows)})
        trainee = copy.deepcopy(model)
        trainee.train()
        dataset = Dataset.from_list(rows)
        self.last_train_dataset = dataset
        devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
        with torch.random.fork_rng(devices=devices):  # the trainer seeds torch: the caller's RNG state comes back
            config = self._common_config(work, next(trainee.parameters()).dtype)
            trainer = self._trainer(trainee, copy.deepcopy(tokenizer), dataset, config)
            for callback in self.trainer_callbacks:
                trainer.add_callback(callback)
            logger.info(
                "%s: training %s on %d rows%s",
                type(self).__name__,
                "full weights" if self.full else "a LoRA adapter",
                len(rows),
                f" (resuming from step {self.resumed_from_step})" if resume else "",
            )
            result = trainer.train(resume_from_checkpoint=str(resume[-1]) if resume else None)
        self.trained_steps = int(result.global_step) - self.resumed_from_step
        trained = trainer.model
        trained.save_pretrained(str(out))
        write_json(
            out / "training.json",
            {
                "trainer": self.TRAINER,
                "rows": len(rows),
                "global_step": int(result.global_step),
                "resumed_from_step": self.resumed_from_step,
                "train_loss": float(result.training_loss),
                "settings": self.training_settings(),
            },
        )
        del trainer, trained, trainee

    def _build(self, model: torch.nn.Module | None, tokenizer: Any, base_digest: str) -> Path:
        """The cache entry for this training on a base of `base_digest`, trained on `model` when missing."""
        rows = self.training_rows(tokenizer)
        key = self.training_key(rows, base_digest, tokenizer)
        self.trained_steps = self.resumed_from_step = 0

        def build(work: Path, out: Path) -> None:
            if model is None:
                raise RuntimeError(f"{type(self).__name__}: the adapter {key} is not cached and no model was given.")
            self._train(model, tokenizer, rows, work, out)

        entry, built = build_artifact(
            "adapters",
            key,
            build,
            cache_dir=self.cache_dir,
            record={"trainer": self.TRAINER, "full": self.full, "rows": len(rows)},
        )
        if not built:
            logger.info("%s: adapter reused from %s (trained earlier: 0 steps now)", type(self).__name__, entry)
        self.artifact_path = entry
        return entry

    def _serve(self, entry: Path) -> LoRAAdapter:
        name = self.name or f"{self.TRAINER}-{entry.name[:12]}"
        self._adapter = LoRAAdapter(adapter=str(entry), merge=self.merge, name=name)
        self._digest = self._adapter.adapter_sha256
        return self._adapter

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module:
        if model is None:
            raise RuntimeError(
                f"{type(self).__name__} trains on the live model (backend=huggingface); a vLLM backend calls "
                "prepare_for_engine() and serves the adapter per request instead."
            )
        if self._adapter is not None or self._swap.applied:
            raise RuntimeError(f"{type(self).__name__} is applied already. Fix: release the pipeline first.")
        entry = self._build(model, tokenizer, weights_digest(model))
        if self.full:
            self._swap.apply(model, folder_tensors(entry), where=f"{type(self).__name__} weights at {entry}")
            self._digest = folder_sha256(entry, ("*.safetensors",))
            return model
        return self._serve(entry).steer(model, tokenizer)

    def cleanup(self) -> None:
        """Unload the adapter (or put the base weights back); idempotent."""
        adapter, self._adapter = self._adapter, None
        if adapter is not None:
            adapter.cleanup()
        self._swap.restore()

    # ------------------------------------------------------------------ vLLM
    def found_for_engine(self, model_path: str, tokenizer: Any, dtype: Any = None) -> bool:
        digest = memoised_digest(model_path, dtype, self.cache_dir)
        if digest is None:
            return False
        rows = self.training_rows(tokenizer)
        if not is_complete(cache_root(self.cache_dir) / "adapters" / self.training_key(rows, digest, tokenizer)):
            return False
        self._serve(self._build(None, tokenizer, digest))  # found in the cache: no model needed
        return True

    def build_for_engine(self, model: torch.nn.Module, model_path: str, tokenizer: Any, dtype: Any = None) -> Path:
        entry = self._build(model, tokenizer, memoise_digest(model, model_path, dtype, self.cache_dir))
        self._serve(entry)
        return entry

    def export_lora(self) -> LoRAArtifact:
        """The trained adapter as an engine serves it (after `prepare_for_engine`)."""
        if self._adapter is None:
            raise RuntimeError(
                f"{type(self).__name__} has no adapter yet: the backend calls prepare_for_engine() (vLLM) or steer() "
                "(Hugging Face) first."
            )
        return self._adapter.export_lora()

    def check_model(self, model: torch.nn.Module) -> None:
        """The trained adapter's fit to `model` (see `LoRAAdapter.check_model`)."""
        if self._adapter is not None:
            self._adapter.check_model(model)

    @property
    def training_record(self) -> dict[str, Any] | None:
        """What the cached entry recorded about its training (`training.json`), once steered."""
        if self.artifact_path is None:
            return None
        path = self.artifact_path / "training.json"
        return {**read_record(self.artifact_path), **(read_json(path) if path.is_file() else {})}


class SFTAdapter(TrainedAdapter):
    """Supervised fine-tuning (TRL's `SFTTrainer`) of a LoRA adapter on prompt/response rows; loss on the response.

    Rows: `{prompt, response}` (also `input`/`question`/`instruction` for the prompt and `completion`/`output`/
    `answer`/`positive`/`chosen` for the response: a concept's pairs train on their positives, AxBench's SFT arm),
    or `{messages: [...]}` (a whole chat, loss on every assistant turn's tokens as TRL computes it).

    Args: see `TrainedAdapter.Args` (`data`, `split`, LoRA shape, optimisation settings, `merge`, `cache_dir`).
    Batches and refills. Hugging Face; vLLM per request (LoRA only).
    """

    TRAINER = "sft"

    @dataclass(frozen=True)
    class Args(TrainedAdapter.Args):
        """`TrainedAdapter.Args` (its own class, so a refusal names SFTAdapter)."""

    def format_row(self, row: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
        where = f"{type(self).__name__}.data"
        if row.get("messages"):
            if not chat:
                raise ValueError(f"{where}: rows with messages need a tokenizer with a chat template.")
            return {"messages": [dict(m) for m in row["messages"]]}
        prompt = first(row, PROMPT_KEYS, where=where, what="prompt")
        response = first(row, RESPONSE_KEYS, where=where, what="response")
        if chat:
            return {"prompt": _user(prompt), "completion": _assistant(response)}
        return {"prompt": prompt, "completion": response}

    def _trainer(self, model: torch.nn.Module, tokenizer: Any, dataset: Any, config: dict[str, Any]) -> Any:
        trl = import_trl()
        return trl.SFTTrainer(
            model=model,
            args=trl.SFTConfig(**config, packing=False),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=None if self.full else self._lora_config(),
        )


class DPOAdapter(TrainedAdapter):
    """Direct preference optimization (Rafailov et al. 2023; TRL's `DPOTrainer`) of a LoRA adapter on preference
    rows `{prompt, chosen, rejected}` (a concept's pairs: `positive` is chosen, `negative` rejected).

    Args: `TrainedAdapter.Args` plus `beta` (the KL strength; 0.1 as in the paper) and `loss_type` (TRL's name;
    `sigmoid` is the paper's loss). With LoRA, the reference model is the base (the adapter switched off).
    Batches and refills. Hugging Face; vLLM per request (LoRA only).
    """

    TRAINER = "dpo"

    @dataclass(frozen=True)
    class Args(TrainedAdapter.Args):
        beta: float = 0.1
        loss_type: str = "sigmoid"

        def validate(self) -> None:
            TrainedAdapter.Args.validate(self)
            if self.beta <= 0:
                raise ValueError(f"DPOAdapter.beta must be > 0; got {self.beta}. Fix: beta=0.1 (the paper's).")

    def format_row(self, row: Mapping[str, Any], *, chat: bool) -> dict[str, Any]:
        where = f"{type(self).__name__}.data"
        prompt = first(row, PROMPT_KEYS, where=where, what="prompt")
        chosen = first(row, CHOSEN_KEYS, where=where, what="chosen answer")
        rejected = first(row, REJECTED_KEYS, where=where, what="rejected answer")
        if chat:
            return {"prompt": _user(prompt), "chosen": _assistant(chosen), "rejected": _assistant(rejected)}
        return {"prompt": prompt, "chosen": chosen, "rejected": rejected}

    def _trainer(self, model: torch.nn.Module, tokenizer: Any, dataset: Any, config: dict[str, Any]) -> Any:
        trl = import_trl()
        return trl.DPOTrainer(
            model=model,
            args=trl.DPOConfig(**config, beta=float(self.beta), loss_type=self.loss_type),
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=None if self.full else self._lora_config(),
        )
