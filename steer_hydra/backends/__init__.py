"""Where generation runs: Hugging Face in process, vLLM offline, and a vLLM/OpenAI-compatible server."""

from steer_hydra.core.backend import BACKENDS, Backend, BackendSpec, backend_class

__all__ = ["BACKENDS", "Backend", "BackendSpec", "backend_class"]
