"""Shared helpers of the GPU benchmarks (benchmarks/gpu/): timestamped logging and real-size random Llama models.

Models are built straight on the target device in the target dtype (no CPU fp32 detour), with the project's
tiny in-code BPE tokenizer (so text decodes) and the same config conventions as `steer_hydra.models.tiny`.
"""

from __future__ import annotations

import datetime
import time

import torch

SHAPES: dict[str, dict[str, int]] = {
    # Llama-3.1-8B without its 128k vocabulary (the tiny tokenizer's vocab is used instead)
    "llama-3.1-8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    ),
    # Llama-3.2-1B likewise
    "llama-3.2-1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
    ),
    # CPU dry run
    "smoke": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    ),
}

_T0 = time.perf_counter()


def log(message: str) -> None:
    now = datetime.datetime.now().strftime("%H:%M:%S")
    print(f"[{now} +{time.perf_counter() - _T0:6.1f}s] {message}", flush=True)


def dtype_of(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def build_shaped_model(shape: str, device: str, dtype: torch.dtype, *, seed: int = 0, max_positions: int = 4096):
    """`(model, tokenizer)`: a random Llama of `SHAPES[shape]`, created directly on `device` in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from steer_hydra.models import TinySpec, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer(TinySpec(max_position_embeddings=max_positions))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=max_positions,
        initializer_range=0.02,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        **SHAPES[shape],
    )
    config._attn_implementation = "sdpa"
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device), torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            if str(device).startswith("cuda"):
                torch.cuda.manual_seed(seed)
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.eval()
    return model, tokenizer


def describe(model) -> str:
    params = sum(p.numel() for p in model.parameters())
    first = next(model.parameters())
    cfg = model.config
    return (
        f"{type(model).__name__}: layers={cfg.num_hidden_layers} hidden={cfg.hidden_size} "
        f"heads={cfg.num_attention_heads}"
        f" kv_heads={cfg.num_key_value_heads} head_dim={getattr(cfg, 'head_dim', None)} "
        f"intermediate={cfg.intermediate_size} vocab={cfg.vocab_size} params={params / 1e9:.3f}B "
        f"dtype={first.dtype} device={first.device} attn={cfg._attn_implementation}"
    )


def dump_modules_at_exit() -> None:
    """With KIT_DUMP_MODULES=<file>, append the top-level modules imported by this process at exit (dry runs)."""
    import atexit
    import os
    import sys

    target = os.environ.get("KIT_DUMP_MODULES")
    if not target:
        return

    def write() -> None:
        full = os.environ.get("KIT_DUMP_FULL") == "1"
        names = sorted({name if full else name.split(".")[0] for name in list(sys.modules) if not name.startswith("_")})
        with open(target, "a") as handle:
            handle.write("\n".join(names) + "\n")

    atexit.register(write)
