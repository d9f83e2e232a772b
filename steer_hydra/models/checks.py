"""Checking a model reference without loading it: does it resolve (a built-in, a checkpoint folder, a Hub id), and
what its config says of its shape (context window, layers, heads), so a job's mistakes fail before any model loads.

The same for what controls load beside the model (`core.Reference`): a reward model or classifier must be a sequence
classifier (`classifier_problems`: a causal-LM folder loaded as one gets a random scoring head), a LoRA folder must
hold a readable safetensors file whose tensors fit the model (`adapter_problems`: the header is read, nothing else).

Every check is bounded: a Hub id that is not in the local cache is looked up once with `HUB_TIMEOUT` seconds, and
not at all under `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`). Each problem is one line naming the config key
(`where`), the value and the fix.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steer_hydra.models.references import BUILTIN_REFERENCES, PREFIX
from steer_hydra.models.smollm2 import gguf_path, is_smollm2_reference
from steer_hydra.models.tiny import is_tiny_reference, parse_tiny_reference

HUB_TIMEOUT = 5.0  # seconds for one Hub lookup of a model id that is not cached locally
SMOLLM2_SHAPE = {"num_hidden_layers": 30, "num_attention_heads": 9}  # steer_hydra:smollm2 (SmolLM2-135M-Instruct)


def hub_offline() -> bool:
    """Whether the environment forbids reaching the Hugging Face Hub."""
    return any(
        os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE") for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def looks_local(ref: str) -> bool:
    """Whether a reference is meant as a local path rather than a Hub id."""
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref.count("/") > 1 or "\\" in ref


def cached_hub_file(repo_id: str, filename: str) -> str | None:
    """A file of a Hub repository from the local cache, None when it is not there."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def reference_problems(ref: Any, where: str) -> list[str]:
    """Why `ref` (the value of config key `where`) cannot be loaded, found without loading it: `[]` for a built-in
    reference that resolves, a checkpoint folder, or a Hub id that is cached or that the Hub knows."""
    if not isinstance(ref, str) or not ref:
        return [f"{where} is empty. Fix: {where}=<Hub id or local folder>."]
    if ref.startswith(PREFIX):
        return _builtin_problems(ref, where)
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not list(path.glob("*.gguf")):
            return [f"{where}={ref!r} is a folder without config.json. Fix: point it at a saved checkpoint folder."]
        return []
    if looks_local(ref):
        return [
            f"{where}={ref!r}: no such local folder (resolved to {path.absolute()}). Fix: correct the path, "
            "or give a Hugging Face Hub id like org/name."
        ]
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as error:
        return [f"{where}={ref!r} is neither a local folder nor a valid Hub id ({error}). Fix: correct it."]
    if cached_hub_file(ref, "config.json") is not None:
        return []
    if hub_offline():
        return [
            f"{where}={ref!r} is not a local folder and not in the Hugging Face cache, and HF_HUB_OFFLINE=1 (or "
            "TRANSFORMERS_OFFLINE=1) forbids downloading it. Fix: download it once with network (hf download "
            f"{ref}), unset HF_HUB_OFFLINE, or point {where} at a local folder."
        ]
    return _hub_lookup(ref, where)


def _builtin_problems(ref: str, where: str) -> list[str]:
    if is_tiny_reference(ref):
        try:
            parse_tiny_reference(ref)
        except ValueError as error:
            return [f"{where}={ref!r}: {error} Fix: model=tiny or model=tiny_base."]
        return []
    if is_smollm2_reference(ref):
        try:
            gguf_path()
        except ImportError as error:
            return [f"{where}={ref!r}: {error}"]
        return []
    return [
        f"{where}={ref!r} is not a built-in model reference. Fix: one of {list(BUILTIN_REFERENCES)}, a Hub id "
        "or a local folder."
    ]


def _hub_lookup(ref: str, where: str) -> list[str]:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        HfApi().model_info(ref, timeout=HUB_TIMEOUT)
    except GatedRepoError:
        return [
            f"{where}={ref!r} is gated on the Hub and this machine has no access. Fix: accept its license on the "
            "Hub, then `hf auth login` or export HF_TOKEN."
        ]
    except RepositoryNotFoundError:
        return [f"{where}={ref!r}: no such model on the Hub (or it is private). Fix: check the id, or log in."]
    except Exception as error:  # network: unreachable, DNS, timeout
        return [
            f"{where}={ref!r} is not cached locally and the Hub did not answer within {HUB_TIMEOUT:.0f}s "
            f"({type(error).__name__}). Fix: download it where there is network (hf download {ref}), or set "
            "HF_HUB_OFFLINE=1 with a populated cache, or use a local folder."
        ]
    return []


def known_config(ref: Any) -> Mapping[str, Any] | None:
    """The config fields of a model when readable without loading it (no transformers import): the built-in
    models' known shapes, `config.json` of a local folder or of a Hub id in the local cache; else None."""
    if not isinstance(ref, str) or not ref:
        return None
    config: Any = None
    try:
        if is_tiny_reference(ref):
            spec = parse_tiny_reference(ref)
            head = "ForSequenceClassification" if spec.head == "sequence_classification" else "ForCausalLM"
            config = {
                "architectures": [f"Llama{head}"],
                "max_position_embeddings": spec.max_position_embeddings,
                "num_hidden_layers": spec.num_hidden_layers,
                "num_attention_heads": spec.num_attention_heads,
                "num_key_value_heads": spec.num_key_value_heads or spec.num_attention_heads,
                "hidden_size": spec.hidden_size,
                "intermediate_size": spec.intermediate_size,
                "head_dim": spec.head_dim or spec.hidden_size // spec.num_attention_heads,
                "vocab_size": spec.vocab_size,
            }
        elif is_smollm2_reference(ref):
            config = SMOLLM2_SHAPE
        elif (Path(ref).expanduser() / "config.json").is_file():
            config = json.loads((Path(ref).expanduser() / "config.json").read_text())
        elif not ref.startswith(PREFIX) and not looks_local(ref):
            cached = cached_hub_file(ref, "config.json")
            config = json.loads(Path(cached).read_text()) if cached else None
    except (ValueError, OSError):
        return None
    return config if isinstance(config, Mapping) else None


# ---------------------------------------------------------------------------------------------- second models
CLASSIFIER_SUFFIXES = ("ForSequenceClassification",)


def classifier_problems(ref: Any, where: str) -> list[str]:
    """`reference_problems`, then: a model whose config names its architectures must be a sequence classifier (a
    reward or value model); a causal LM loaded as one gets a randomly initialized scoring head, so every score it
    gives would be noise."""
    problems = reference_problems(ref, where)
    if problems:
        return problems
    config = known_config(ref)
    architectures = [str(a) for a in (config or {}).get("architectures") or []]
    if architectures and not any(a.endswith(CLASSIFIER_SUFFIXES) for a in architectures):
        return [
            f"{where}={ref!r} is not a sequence classifier (its config.json names {architectures}): loaded as a reward "
            "or value model it would get a randomly initialized scoring head, and every score would be noise. Fix: "
            f"{where}=<a reward model or classifier, whose config lists *ForSequenceClassification> (offline, for "
            "tests: 'steer_hydra:tiny-reward')."
        ]
    return []


# ---------------------------------------------------------------------------------------------- adapters
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MAX_HEADER = 100 * 2**20  # bytes: safetensors refuses larger headers too
_LORA_KEY = re.compile(r"layers\.(\d+)\.(?:[\w.]*\.)?(\w+_proj)\.(lora_A|lora_B)(?:\.[\w-]+)?\.weight$")


def safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The tensor entries of a safetensors file's header (`{name: {"dtype", "shape", "data_offsets"}}`), read
    without loading a tensor; ValueError saying what is wrong when the file is damaged (too short for its header, a
    header that is not JSON, tensors that end past the file's end: a truncated copy)."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            raise ValueError(f"it is {size} bytes long, too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise ValueError(
                f"its header claims {length} bytes and the file holds {size} (it is truncated or not safetensors)"
            )
        try:
            header = json.loads(handle.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"its header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise ValueError("its header is not a mapping of tensors")
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    data = size - 8 - length
    ends = [int((entry.get("data_offsets") or [0, 0])[1]) for entry in tensors.values() if isinstance(entry, dict)]
    if ends and max(ends) > data:
        raise ValueError(
            f"its tensors need {max(ends)} bytes after the header and the file holds {data}: it is truncated (a copy "
            "cut short)"
        )
    return tensors


def _expected_lora_dims(config: Mapping[str, Any], module: str) -> tuple[int, int] | None:
    """`(in_features, out_features)` of a decoder module a LoRA adapts, from the model's config (Llama-style
    projection names); None when the config does not say."""
    hidden = config.get("hidden_size")
    heads = config.get("num_attention_heads")
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
        return None
    head_dim = config.get("head_dim") or hidden // heads
    kv = (config.get("num_key_value_heads") or heads) * head_dim
    inner = config.get("intermediate_size")
    dims = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv),
        "v_proj": (hidden, kv),
        "o_proj": (heads * head_dim, hidden),
    }
    if isinstance(inner, int):
        dims.update({"gate_proj": (hidden, inner), "up_proj": (hidden, inner), "down_proj": (inner, hidden)})
    return dims.get(module)


def adapter_problems(folder: Any, where: str, model_ref: Any = None) -> list[str]:
    """Why the LoRA folder `folder` (config key `where`) cannot be applied to the model `model_ref`, found by
    reading its `adapter_config.json` and its safetensors header only: missing files, a damaged or truncated
    weights file, a tensor naming a layer the model lacks or whose shape does not fit the model's config (when the
    model's config is readable without loading it)."""
    path = Path(str(folder)).expanduser()
    if not str(folder).strip() or not path.is_dir():
        return [f"{where}={str(folder)!r}: no such folder. Fix: {where}=<folder written by PeftModel.save_pretrained>."]
    for needed in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        if not (path / needed).is_file():
            return [
                f"{where}={str(folder)!r} holds no {needed}. Fix: point {where} at a folder written by "
                "PeftModel.save_pretrained(folder) (safetensors, its default)."
            ]
    try:
        adapter = json.loads((path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return [
            f"{where}={str(folder)!r}: {ADAPTER_CONFIG} is not readable JSON ({error}). Fix: save the adapter again."
        ]
    try:
        tensors = safetensors_header(path / ADAPTER_WEIGHTS)
    except (OSError, ValueError) as error:
        return [
            f"{where}={str(folder)!r}: {ADAPTER_WEIGHTS} is damaged: {error}. Fix: copy or save the adapter again "
            "(PeftModel.save_pretrained)."
        ]
    config = known_config(model_ref) if model_ref is not None else None
    if not config:
        return []
    base = adapter.get("base_model_name_or_path") if isinstance(adapter, Mapping) else None
    trained_on = f" (adapter_config.json names base model {base!r})" if base else ""
    layers = config.get("num_hidden_layers")
    for name, entry in sorted(tensors.items()):
        found = _LORA_KEY.search(name)
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if found is None or not isinstance(shape, list) or len(shape) != 2:
            continue
        layer, module, part = int(found.group(1)), found.group(2), found.group(3)
        if isinstance(layers, int) and layer >= layers:
            return [
                f"{where}={str(folder)!r} adapts layer {layer}, and the model {model_ref!r} has {layers} decoder "
                f"layers: it was trained on another model{trained_on}. Fix: an adapter trained on this model, or "
                "model.model_name_or_path=<the model it was trained on>."
            ]
        dims = _expected_lora_dims(config, module)
        if dims is None:
            continue
        expected = [shape[0], dims[0]] if part == "lora_A" else [dims[1], shape[1]]
        if list(shape) != expected:
            return [
                f"{where}={str(folder)!r} does not fit the model {model_ref!r}: its {part} weight for layer {layer} "
                f"{module} has shape {list(shape)}, the model's {module} takes {expected}; it was trained on another "
                f"model{trained_on}. Fix: an adapter trained on this model, or model.model_name_or_path=<the model it "
                "was trained on>."
            ]
    return []
