"""The tiny offline model: a random-weight Llama and a BPE tokenizer built in code, for the default job and tests."""

from steer_hydra.models.tiny import (
    TINY_BASE_REF,
    TINY_REF,
    TinySpec,
    build_tiny_model,
    build_tiny_tokenizer,
    is_tiny_reference,
    resolve_model_reference,
    save_tiny_model,
)

__all__ = [
    "TINY_BASE_REF",
    "TINY_REF",
    "TinySpec",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "is_tiny_reference",
    "resolve_model_reference",
    "save_tiny_model",
]
