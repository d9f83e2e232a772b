"""LoadCheckpoint: run the pipeline on another checkpoint of the same architecture, swapped into the live model.

How it runs (Hugging Face): `steer()` reads the checkpoint's tensors (a folder's safetensors or `.bin` files read
directly; any other reference, e.g. a built-in `steer_hydra:` one or a Hub id, loaded by the backend as a second
model), checks every tensor against the live model (the same names, the same shapes, the same architecture
settings, every parameter covered), keeps the values it replaces on the CPU and copies the checkpoint's values in
place. The model object stays the one the pipeline holds (hooks, refill and the shared base see it), and
`cleanup()` (run at release) copies the saved values back, so the base is restored bit for bit. `WeightSwap` is
that apply-and-restore step; ModelMerge and the full-weight trainers use it too.

Identity: a folder's content (`checkpoint_sha256`: its weights and config files) is part of the configuration's
`config_id` (`content_digests`); any other reference is identified by the reference itself.

On the vLLM backends an engine serves one checkpoint as its model: point `model.model_name_or_path` at the
checkpoint instead (`check()` refuses this control there, naming that fix).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from steer_hydra.controls.structural.artifacts import CHECKPOINT_PATTERNS, folder_sha256, weights_digest
from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, Reference, StructuralControl

logger = logging.getLogger(__name__)

# configuration fields that change what the same weights compute: a checkpoint must agree with the live model on them
ARCHITECTURE_FIELDS = (
    "model_type",
    "hidden_act",
    "rms_norm_eps",
    "layer_norm_eps",
    "rope_theta",
    "rope_parameters",
    "rope_scaling",
    "tie_word_embeddings",
    "sliding_window",
    "attention_bias",
    "mlp_bias",
)
TensorSource = Callable[[], Iterator[tuple[str, torch.Tensor]]]


def folder_tensors(folder: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a checkpoint folder by name, one at a time (safetensors shards, else `.bin` files)."""
    folder = Path(folder)
    shards = sorted(folder.glob("*.safetensors"))
    if shards:
        from safetensors import safe_open

        for shard in shards:
            with safe_open(str(shard), framework="pt") as handle:
                for key in handle.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                    yield key, handle.get_tensor(key)
        return
    bins = sorted(p for p in folder.glob("*.bin") if p.name != "training_args.bin")
    if not bins:
        raise ValueError(
            f"{folder} holds no weights (*.safetensors or *.bin). Fix: point at a folder written by save_pretrained."
        )
    for path in bins:
        yield from torch.load(path, map_location="cpu", weights_only=True).items()


def read_config(folder: str | Path) -> dict[str, Any]:
    """A checkpoint folder's `config.json` ({} when it has none)."""
    path = Path(folder) / "config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def architecture_mismatches(model: torch.nn.Module, config: Mapping[str, Any]) -> list[str]:
    """`field: ours vs theirs` for every architecture setting on which a checkpoint's config differs from the
    model's (fields either side lacks are not compared)."""
    ours = model.config.to_dict() if hasattr(getattr(model, "config", None), "to_dict") else {}
    found = []
    for name in ARCHITECTURE_FIELDS:
        if name in ours and name in config and ours[name] != config[name]:
            found.append(f"{name}: {ours[name]!r} here, {config[name]!r} in the checkpoint")
    return found


class WeightSwap:
    """Copy tensors into a live model in place, keeping every replaced value on the CPU; `restore()` puts them back.

    `apply(model, tensors, where=...)` checks names and shapes as it goes and, at the end, that every parameter was
    covered (a tied output embedding counts through its twin); any refusal restores what was already copied.
    """

    def __init__(self) -> None:
        self._model: torch.nn.Module | None = None
        self._saved: dict[str, torch.Tensor] = {}

    @property
    def applied(self) -> bool:
        return self._model is not None

    def apply(self, model: torch.nn.Module, tensors: Iterator[tuple[str, torch.Tensor]], *, where: str) -> None:
        if self._model is not None:
            raise RuntimeError(f"{where}: weights are swapped in already. Fix: release the pipeline first.")
        state = model.state_dict(keep_vars=True)
        prefix = getattr(model, "base_model_prefix", "") or ""
        owner: dict[int, str] = {}  # tensor identity -> the first state_dict name that holds it
        for name, tensor in state.items():
            owner.setdefault(id(tensor), name)
        covered: dict[int, str] = {}
        self._model = model
        try:
            with torch.no_grad():
                for key, value in tensors:
                    name = key if key in state else f"{prefix}.{key}" if f"{prefix}.{key}" in state else None
                    if name is None:
                        raise ValueError(
                            f"{where} holds tensor {key!r}, which this model ({type(model).__name__}) lacks. Fix: use "
                            "a checkpoint of this model's architecture (the same module names)."
                        )
                    target = state[name]
                    if tuple(target.shape) != tuple(value.shape):
                        raise ValueError(
                            f"{where}: tensor {key!r} has shape {list(value.shape)}, the model's needs "
                            f"{list(target.shape)}. Fix: use a checkpoint of this model's size."
                        )
                    ident = id(target)
                    if ident in covered:  # a tied pair given twice: both copies must agree
                        if not torch.equal(target.detach().cpu(), value.to(target.dtype).cpu()):
                            raise ValueError(
                                f"{where} gives {covered[ident]!r} and {key!r} different values, but this model ties "
                                "them (tie_word_embeddings). Fix: use a checkpoint with tied embeddings."
                            )
                        continue
                    self._saved[owner[ident]] = target.detach().to("cpu", copy=True)
                    target.data.copy_(value.to(device=target.device, dtype=target.dtype))
                    covered[ident] = key
            missing = sorted(
                name
                for name, tensor in state.items()
                if id(tensor) not in covered and isinstance(tensor, torch.nn.Parameter)
            )
            if missing:
                raise ValueError(
                    f"{where} lacks {len(missing)} of the model's parameters (e.g. {missing[:3]}). Fix: use a complete "
                    "checkpoint of this model's architecture."
                )
        except BaseException:
            self.restore()
            raise

    def restore(self) -> None:
        """Copy every saved value back (bit-exact); idempotent."""
        model, self._model = self._model, None
        saved, self._saved = self._saved, {}
        if model is None:
            return
        state = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, value in saved.items():
                state[name].data.copy_(value.to(state[name].device))


def reference_tensors(
    reference: str, model: torch.nn.Module, load_model: Callable[..., Any] | None, *, where: str
) -> tuple[Iterator[tuple[str, torch.Tensor]], dict[str, Any]]:
    """`(tensors, config)` of a checkpoint reference: a folder read directly, anything else loaded by the backend
    (`load_model`, the Hugging Face backend's second-model loader)."""
    folder = Path(reference).expanduser()
    if folder.is_dir():
        return folder_tensors(folder), read_config(folder)
    if load_model is None:
        raise RuntimeError(
            f"{where}: {reference!r} is not a folder and this backend cannot load a second model. Fix: use "
            "backend=huggingface, or give the checkpoint as a local folder."
        )
    other = load_model(reference)
    config = other.config.to_dict() if hasattr(other, "config") else {}
    state = {k: v.detach() for k, v in other.state_dict().items()}
    del other
    return iter(state.items()), config


class LoadCheckpoint(StructuralControl):
    """Run the pipeline on another checkpoint of the base model's architecture (a fine-tune, a merge, an earlier
    training step), its weights swapped into the live model and restored at release.

    Args:
        checkpoint: a folder written by `save_pretrained` (safetensors or `.bin` weights plus `config.json`), or a
            model reference the Hugging Face backend loads (a Hub id, a built-in `steer_hydra:` reference).

    Batches and refills (the model is the same for every row). Hugging Face only; on vLLM set
    `model.model_name_or_path` to the checkpoint instead.
    """

    @dataclass(frozen=True)
    class Args(BaseArgs):
        checkpoint: str

        def validate(self) -> None:
            if not self.checkpoint.strip():
                raise ValueError(
                    "LoadCheckpoint.checkpoint must be a folder or a model reference; got ''. "
                    "Fix: checkpoint=<folder written by save_pretrained> or a model reference."
                )

    supports_batching = True
    supports_refill = True
    restores_base = True  # edits the given model in place and restores it bit for bit: runs on a shared base

    def _configure(self) -> None:
        self._swap = WeightSwap()
        self._applied_digest: str | None = None

    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """A folder's content digest (`checkpoint_sha256`): new weights give a new configuration id."""
        folder = Path(str(args.get("checkpoint") or "")).expanduser()
        if not str(args.get("checkpoint") or "").strip() or not folder.is_dir():
            return {}
        try:
            return {"checkpoint_sha256": folder_sha256(folder, CHECKPOINT_PATTERNS)}
        except ValueError:
            return {}  # no weights there: steer() refuses the folder, naming the fix

    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The checkpoint `steer()` loads (a folder or a model reference), resolved before the model loads."""
        checkpoint = args.get("checkpoint")
        return {"checkpoint": Reference(checkpoint)} if isinstance(checkpoint, str) and checkpoint.strip() else {}

    @property
    def vector_hash(self) -> str | None:
        """The digest of the weights in use once steered (`weights_digest`), recorded in provenance."""
        return self._applied_digest

    def provenance(self) -> dict[str, Any]:
        """The digest of the weights in use, once steered."""
        return {"weights_sha256": self._applied_digest} if self._applied_digest else {}

    def requirements(self) -> frozenset[Capability]:
        return frozenset({Capability.IN_PROCESS_TORCH})

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        if backend_kind in ("vllm", "vllm_serve"):
            return [
                f"LoadCheckpoint swaps weights in a live model; an engine serves one checkpoint as its model. Fix: "
                f"set model.model_name_or_path={self.checkpoint} (and drop this control) on backend={backend_kind}, "
                "or use backend=huggingface."
            ]
        return []

    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module:
        where = f"LoadCheckpoint.checkpoint={self.checkpoint!r}"
        if model is None:
            raise RuntimeError(f"{where} needs the live model. Fix: use backend=huggingface.")
        tensors, config = reference_tensors(self.checkpoint, model, kwargs.get("load_model"), where=where)
        mismatches = architecture_mismatches(model, config)
        if mismatches:
            raise ValueError(
                f"{where} is another architecture: {'; '.join(mismatches)}. Fix: use a checkpoint of the base "
                "model's architecture, or make the checkpoint the model (model.model_name_or_path)."
            )
        self._swap.apply(model, tensors, where=where)
        self._applied_digest = weights_digest(model)
        logger.info("Checkpoint %s swapped into the model (weights %s)", self.checkpoint, self._applied_digest[:12])
        return model

    def cleanup(self) -> None:
        """Put the base model's weights back (bit-exact); idempotent."""
        self._swap.restore()
