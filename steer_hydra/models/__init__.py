"""Built-in models: the tiny random Llama of the tests, and SmolLM2-135M-Instruct converted offline from a wheel."""

from steer_hydra.models.references import BUILTIN_REFERENCES, cache_dir, resolve_model_reference
from steer_hydra.models.smollm2 import INSTALL_COMMAND, SMOLLM2_REF, is_smollm2_reference
from steer_hydra.models.tiny import (
    TINY_BASE_REF,
    TINY_REF,
    TINY_REWARD_REF,
    TinySpec,
    build_tiny_model,
    build_tiny_tokenizer,
    is_tiny_reference,
    save_tiny_model,
)

__all__ = [
    "BUILTIN_REFERENCES",
    "INSTALL_COMMAND",
    "SMOLLM2_REF",
    "TINY_BASE_REF",
    "TINY_REF",
    "TINY_REWARD_REF",
    "TinySpec",
    "build_tiny_model",
    "build_tiny_tokenizer",
    "cache_dir",
    "is_smollm2_reference",
    "is_tiny_reference",
    "resolve_model_reference",
    "save_tiny_model",
]
