"""Fixtures shared by the real-engine tests: the tiny head-dim-64 model steered on Hugging Face and on vLLM.

Built lazily (only a test that asks starts an engine), so the other backend tests never import vLLM.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny64_hf():
    """The tiny64 model on Hugging Face with `steering_controls()` (CAA and ActAdd, both given)."""
    from vllm_real import TINY64, steered, steering_controls

    with steered(TINY64, steering_controls()) as pipeline:
        yield pipeline


@pytest.fixture(scope="module")
def tiny64_engine():
    """The same pipeline on an offline vLLM engine (`backend=vllm`), one engine per module."""
    from vllm_real import ENGINE_OPTIONS, TINY64, steered, steering_controls

    from steer_hydra.core import BackendSpec

    with steered(TINY64, steering_controls(), BackendSpec("vllm", ENGINE_OPTIONS)) as pipeline:
        yield pipeline
