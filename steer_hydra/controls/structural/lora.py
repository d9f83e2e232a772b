"""LoRAAdapter: a PEFT LoRA adapter served on the base model (merged or live on Hugging Face, per request on vLLM).

How it runs: on Hugging Face, `steer()` checks the adapter against the live model (every module it adapts exists,
with the shapes its weights expect), loads it with `peft` in place (the model object stays the one the pipeline
holds, so module paths, hooks and refill are unchanged) and either merges it into the weights (`merge=True`, after
copying the adapted modules' original parameters to the CPU) or keeps it as live LoRA layers. `cleanup()` (run by
`SteeringPipeline.release()`) restores the model exactly: the LoRA layers are unloaded, merged parameters get their
saved bits back, and training mode and `requires_grad` flags are what they were. On the vLLM backends the adapter
is not applied here: the backend reads `export_lora()` and serves it per request (offline engine: a `LoRARequest`
on each request; server: the adapter's name as the request's model), so arms with and without the adapter can
share one engine.

Identity: the adapter's content (`adapter_sha256`, the sha256 of its `adapter_config.json` and
`adapter_model.safetensors`) is part of `descriptor()`, so a configuration's id changes when the adapter's files
change, and it is recorded as the control's `vector_hash`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from steer_hydra.core.capabilities import Capability
from steer_hydra.core.controls import BaseArgs, Reference, StructuralControl

logger = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."  # how PeftModel.save_pretrained names the adapted model's modules
_LORA_PARTS = (".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude_vector")
_DIGESTS: dict[tuple[Any, ...], str] = {}  # (folder, files' size and mtime) -> sha256
_APPLIED: weakref.WeakKeyDictionary[torch.nn.Module, str] = weakref.WeakKeyDictionary()  # model -> adapter applied


@dataclass(frozen=True, slots=True)
class LoRAArtifact:
    """What an engine needs to serve the adapter per request.

    Attributes:
        name: the adapter's name in the engine (`LoRAAdapter.name`, else `lora-<first 12 hex of sha256>`).
        path: the adapter folder, absolute.
        rank: the largest rank among its LoRA weights.
        sha256: the content digest of its files (`LoRAAdapter.adapter_sha256`).
        use_dora: whether it is a DoRA adapter (weight-decomposed LoRA).
    """

    name: str
    path: str
    rank: int
    sha256: str
    use_dora: bool = False

    @property
    def int_id(self) -> int:
        """A stable positive integer id derived from the content (vLLM's `lora_int_id`)."""
        return int(self.sha256[:7], 16) + 1


def adapter_digest(folder: str | os.PathLike[str]) -> str:
    """sha256 over the adapter's config and weights files (names and bytes), cached by their size and mtime."""
    folder = Path(folder).resolve()
    files = [folder / ADAPTER_CONFIG, folder / ADAPTER_WEIGHTS]
    stats = [f.stat() for f in files]
    key = (str(folder), *((s.st_size, s.st_mtime_ns) for s in stats))
    found = _DIGESTS.get(key)
    if found is None:
        digest = hashlib.sha256()
        for path in files:
            digest.update(path.name.encode() + b"\0")
            with open(path, "rb") as handle:
                while chunk := handle.read(1 << 20):
                    digest.update(chunk)
        found = _DIGESTS[key] = digest.hexdigest()
    return found


def read_adapter_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """`adapter_config.json` of an adapter folder as a dict (ValueError naming the field when it is not JSON)."""
    path = Path(folder) / ADAPTER_CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(
            f"LoRAAdapter.adapter: {path} is not readable JSON ({error}). "
            "Fix: point adapter at a folder written by PeftModel.save_pretrained."
        ) from error
    if not isinstance(config, Mapping):
        raise ValueError(f"LoRAAdapter.adapter: {path} holds {type(config).__name__}, not a JSON object.")
    return dict(config)


def adapter_weight_shapes(folder: str | os.PathLike[str]) -> dict[str, tuple[int, ...]]:
    """The shapes of the adapter's weights by tensor name, read from the safetensors header (no tensor loaded)."""
    from safetensors import safe_open

    with safe_open(str(Path(folder) / ADAPTER_WEIGHTS), framework="pt") as handle:
        return {key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()}  # noqa: SIM118


def _module_path(key: str) -> tuple[str, str] | None:
    """`(module path in the base model, LoRA part)` of an adapter tensor name, None for other tensors."""
    for part in _LORA_PARTS:
        if part in key:
            module = key.split(part, 1)[0]
            return (module[len(_PREFIX) :] if module.startswith(_PREFIX) else module), part.strip(".")
    return None


def _is_lora_layer(module: torch.nn.Module) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A")


def _strip_lora_layers(model: torch.nn.Module) -> None:
    """Replace every peft LoRA layer left in `model` by its base layer (after a failed load)."""
    for name, module in list(model.named_modules()):
        if name and _is_lora_layer(module):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())
    if "peft_config" in model.__dict__:
        del model.__dict__["peft_config"]


class LoRAAdapter(StructuralControl):
    """A LoRA adapter on the base model: low-rank updates `W + (alpha / r) B A` of chosen weight matrices.

    Paper: Hu et al., "LoRA: Low-Rank Adaptation of Large Language Models" (ICLR 2022, arXiv 2106.09685).

    Args:
        adapter: a local folder written by `PeftModel.save_pretrained` (`adapter_config.json` and
            `adapter_model.safetensors`), trained on this pipeline's base model.
        merge: Hugging Face only: merge the update into the weights (fast decoding; the adapted modules' original
            parameters are kept on the CPU until release), or keep it as live LoRA layers (`False`). vLLM always
            serves it unmerged, per request.
        name: the adapter's name in a vLLM engine (a server's `--lora-modules NAME=PATH`); default
            `lora-<first 12 hex of the adapter's sha256>`, so one name always means the same weights.

    Batches (the adapter is the same for every row) and refills (the refill engine decodes with the same model).
    Runs on backend=huggingface (`peft`), backend=vllm (the engine boots with `enable_lora` and a `max_lora_rank`
    that fits) and backend=vllm_serve (a server started with the adapter: `--enable-lora --lora-modules
    NAME=PATH`). DoRA adapters run on Hugging Face only; adapters with `modules_to_save` (full module copies) are
    refused. It edits the model it is given and restores it exactly at release, so it runs on a shared or resident
    base (`restores_base`).
    """

    restores_base = True

    @dataclass(frozen=True)
    class Args(BaseArgs):
        adapter: str | Path
        merge: bool = True
        name: str | None = None

        def validate(self) -> None:
            folder = Path(self.adapter).expanduser()
            if not str(self.adapter).strip() or not folder.is_dir():
                raise ValueError(
                    f"LoRAAdapter.adapter must be an existing folder; got {str(self.adapter)!r}. "
                    "Fix: adapter=<folder written by PeftModel.save_pretrained>."
                )
            for needed in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
                if not (folder / needed).is_file():
                    raise ValueError(
                        f"LoRAAdapter.adapter={str(self.adapter)!r} holds no {needed}. Fix: point adapter at a folder "
                        "written by PeftModel.save_pretrained(folder) (safetensors, its default)."
                    )
            config = read_adapter_config(folder)
            kind = str(config.get("peft_type", "")).upper()
            if kind != "LORA":
                raise ValueError(
                    f"LoRAAdapter.adapter={str(self.adapter)!r} is a {config.get('peft_type')!r} adapter, not LoRA. "
                    "Fix: use a LoRA adapter (peft_type LORA in adapter_config.json)."
                )
            if config.get("modules_to_save"):
                raise ValueError(
                    f"LoRAAdapter.adapter={str(self.adapter)!r} saves full copies of modules "
                    f"{config['modules_to_save']} (modules_to_save), which LoRAAdapter does not serve. "
                    "Fix: use an adapter with LoRA weights only, or merge it into a checkpoint and use that as the "
                    "model."
                )
            if self.name is not None and (not self.name.strip() or any(c in self.name for c in "= \t\n/")):
                raise ValueError(
                    f"LoRAAdapter.name must be a non-empty name without '=', '/' or whitespace; got {self.name!r}. "
                    "Fix: leave it unset (a digest of the adapter) or use e.g. name=my-adapter."
                )

    supports_batching = True
    supports_refill = True

    def _configure(self) -> None:
        self.adapter_path = Path(self.adapter).expanduser().resolve()
        self.adapter_config = read_adapter_config(self.adapter_path)
        self._model: torch.nn.Module | None = None
        self._peft: Any = None  # the PeftModel of an unmerged adapter
        self._saved: dict[tuple[str, str], torch.Tensor] = {}  # merged: original parameters by (module, name)
        self._flags: dict[str, bool] = {}  # requires_grad of every parameter before steer()
        self._training = False

    # ------------------------------------------------------------------ identity
    @property
    def adapter_sha256(self) -> str:
        """sha256 of the adapter's `adapter_config.json` and `adapter_model.safetensors` (names and bytes)."""
        return adapter_digest(self.adapter_path)

    @property
    def adapter_name(self) -> str:
        """The adapter's name in an engine: `name`, else `lora-<first 12 hex of adapter_sha256>`."""
        return self.name or f"lora-{self.adapter_sha256[:12]}"

    @property
    def vector_hash(self) -> str | None:
        """The adapter's content digest (`adapter_sha256`), recorded in provenance."""
        return self.adapter_sha256

    @classmethod
    def content_digests(cls, args: Mapping[str, Any]) -> dict[str, str]:
        """The adapter's content digest (`adapter_sha256`): new weights give a new configuration id, also for a
        `ControlSpec` sweep (which names the folder before any control is built)."""
        folder = Path(args["adapter"]).expanduser().resolve() if args.get("adapter") else None
        if folder is None or not all((folder / name).is_file() for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)):
            return {}  # nothing to digest: building the control refuses the folder, naming the fix
        return {"adapter_sha256": adapter_digest(folder)}

    @classmethod
    def references(cls, args: Mapping[str, Any]) -> dict[str, Reference]:
        """The adapter folder `steer()` applies: its files and tensor shapes are checked before the model loads."""
        adapter = args.get("adapter")
        return {"adapter": Reference(str(adapter), "adapter")} if adapter and str(adapter).strip() else {}

    # ------------------------------------------------------------------ declarations
    def requirements(self) -> frozenset[Capability]:
        """The live model (peft) on Hugging Face; the vLLM backends serve it themselves (`export_lora`)."""
        return frozenset({Capability.IN_PROCESS_TORCH})

    def constraint_failures(self, backend_kind: str, hf_model_kwargs: Mapping[str, Any]) -> list[str]:
        if backend_kind in ("vllm", "vllm_serve") and self.adapter_config.get("use_dora"):
            return [
                f"adapter {str(self.adapter_path)!r} is a DoRA adapter (use_dora), which vLLM does not serve. "
                "Fix: use backend=huggingface."
            ]
        return []

    def export_lora(self) -> LoRAArtifact:
        """The adapter as an engine serves it per request (read by the vLLM backends instead of `steer()`)."""
        shapes = adapter_weight_shapes(self.adapter_path)
        ranks = [shape[0] for key, shape in shapes.items() if ".lora_A." in key or ".lora_embedding_A" in key]
        if not ranks:
            raise ValueError(
                f"LoRAAdapter.adapter={str(self.adapter_path)!r} holds no LoRA weights (no lora_A tensors in "
                f"{ADAPTER_WEIGHTS}). Fix: save the adapter again with PeftModel.save_pretrained."
            )
        return LoRAArtifact(
            name=self.adapter_name,
            path=str(self.adapter_path),
            rank=max(ranks),
            sha256=self.adapter_sha256,
            use_dora=bool(self.adapter_config.get("use_dora")),
        )

    # ------------------------------------------------------------------ compatibility
    def check_model(self, model: torch.nn.Module) -> None:
        """Refuse a model this adapter was not trained on: each adapted module must exist with the shapes the
        adapter's weights expect (a model on the meta device will do). A different `base_model_name_or_path` alone
        is only logged: one checkpoint often goes by several names (a Hub id, a local copy)."""
        where = f"LoRAAdapter.adapter={str(self.adapter_path)!r}"
        if model in _APPLIED or any(_is_lora_layer(m) for m in model.modules()):
            raise ValueError(
                f"{where}: the model already carries LoRA layers (another LoRAAdapter in this pipeline?). "
                "Fix: one LoRAAdapter per arm (combine adapters offline into one)."
            )
        base = self.adapter_config.get("base_model_name_or_path")
        ours = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
        if base and ours and Path(str(base)).name != Path(str(ours)).name:
            logger.warning("%s names base model %r; this model is %r (shapes match, applying it).", where, base, ours)
        adapted = 0
        for key, shape in adapter_weight_shapes(self.adapter_path).items():
            parsed = _module_path(key)
            if parsed is None:
                continue
            path, part = parsed
            try:
                module = model.get_submodule(path)
            except AttributeError:
                raise ValueError(
                    f"{where} adapts module {path!r}, which this model (base {ours or type(model).__name__!r}) lacks; "
                    f"the adapter was trained for {base!r}. Fix: use the adapter's base model, or an adapter trained "
                    "on this one."
                ) from None
            expected = _expected_shape(module, part, shape)
            if expected is not None and tuple(expected) != tuple(shape):
                raise ValueError(
                    f"{where} does not fit this model: its {part} weight for {path!r} has shape {list(shape)}, the "
                    f"model's module needs {list(expected)} (adapter base model {base!r}, this model "
                    f"{ours or type(model).__name__!r}). Fix: use the adapter's base model, or an adapter trained on "
                    "this one."
                )
            adapted += 1
        if not adapted:
            raise ValueError(
                f"{where} holds no LoRA weights (no lora_A/lora_B tensors in {ADAPTER_WEIGHTS}). "
                "Fix: save the adapter again with PeftModel.save_pretrained."
            )

    # ------------------------------------------------------------------ Hugging Face
    def steer(self, model: torch.nn.Module | None, tokenizer: Any = None, **kwargs: Any) -> torch.nn.Module:
        if model is None:
            raise RuntimeError(
                "LoRAAdapter needs the live model (backend=huggingface), or a vLLM backend that serves the adapter "
                "per request (backend=vllm or vllm_serve call export_lora() instead of steer())."
            )
        if self._model is not None:
            raise RuntimeError("LoRAAdapter is applied already. Fix: release the pipeline before steering it again.")
        if self.merge and getattr(model, "is_quantized", False):
            raise ValueError(
                "LoRAAdapter.merge=true on a quantized model would change its quantized weights irreversibly. "
                "Fix: merge=false (live LoRA layers)."
            )
        self.check_model(model)
        from peft import PeftModel

        self._flags = {name: p.requires_grad for name, p in model.named_parameters()}
        self._training = model.training
        self._model = model
        _APPLIED[model] = self.adapter_name
        try:
            peft_model = PeftModel.from_pretrained(model, str(self.adapter_path), adapter_name=self.adapter_name)
            if self.merge:
                for path, module in model.named_modules():
                    if _is_lora_layer(module):
                        for name, param in module.get_base_layer().named_parameters(recurse=False):
                            self._saved[(path, name)] = param.detach().to("cpu", copy=True)
                peft_model.merge_and_unload()
            else:
                self._peft = peft_model
        except BaseException:
            self.cleanup()
            raise
        logger.info(
            "LoRA adapter %s (%s) %s", self.adapter_name, self.adapter_path, "merged" if self.merge else "unmerged"
        )
        return model

    def cleanup(self) -> None:
        """Unload the LoRA layers and give merged parameters their saved values back; idempotent."""
        model, self._model = self._model, None
        if model is None:
            return
        peft_model, self._peft = self._peft, None
        try:
            if peft_model is not None:
                peft_model.unload()
            _strip_lora_layers(model)
            with torch.no_grad():
                for (path, name), saved in self._saved.items():
                    getattr(model.get_submodule(path), name).copy_(saved)
            for name, param in model.named_parameters():
                param.requires_grad_(self._flags.get(name, param.requires_grad))
            model.train(self._training)
        finally:
            self._saved, self._flags = {}, {}
            _APPLIED.pop(model, None)


def _expected_shape(module: torch.nn.Module, part: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape an adapter tensor must have on `module` (its rank taken from the tensor); None when not checked."""
    in_features, out_features = getattr(module, "in_features", None), getattr(module, "out_features", None)
    if isinstance(module, torch.nn.Embedding):
        in_features, out_features = module.num_embeddings, module.embedding_dim
    if in_features is None or out_features is None or (len(shape) != 2 and part != "lora_magnitude_vector"):
        return None
    if part in ("lora_A", "lora_embedding_A"):
        return (shape[0], in_features)
    if part in ("lora_B", "lora_embedding_B"):
        return (out_features, shape[1])
    if part == "lora_magnitude_vector":
        return (out_features,)
    return None
