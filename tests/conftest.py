"""Shared fixtures: offline environment, the tiny model, steered pipelines, the tiny model served on loopback, and
a GPU marker."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("INSPECT_DISPLAY", "none")


def _freeze_imported_objects() -> None:
    """Move the objects of the heavy imports into the permanent generation: `gc.collect()` (which every pipeline
    release runs to free a model) then scans only what the tests created, 0.6 s less per call."""
    import gc

    import inspect_ai.log  # noqa: F401
    import inspect_ai.model  # noqa: F401
    import pandas  # noqa: F401
    import transformers.models.llama.modeling_llama  # noqa: F401

    import steer_hydra.evaluation.runner  # noqa: F401 - the package's own layers, Inspect's eval machinery with them
    from steer_hydra.models import build_tiny_model

    build_tiny_model()  # the tokenizers and model classes the tiny model loads
    gc.collect()
    gc.freeze()


_freeze_imported_objects()


@pytest.fixture(autouse=True)
def _logging_restored():
    """Every test leaves the logging configuration as it found it: the root logger's level and handlers, and which
    loggers are disabled. A job run in this process (`python -m steer_hydra` through `main()`) lets Hydra apply its
    job logging config, which sets the root level to INFO, replaces the root handlers with its own (a file handler in
    the job's folder among them) and may disable existing loggers; left as they are, the tests after it capture, or
    miss, other records than they do after a test that ran no job. Inspect installs its log handler on the root
    logger once per process (memoised) at its first eval: that one is kept."""
    import logging

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    loggers = [logger for logger in logging.root.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    disabled = {logger: logger.disabled for logger in loggers}
    yield
    inspect_handlers = [h for h in root.handlers if h not in handlers and type(h).__module__.startswith("inspect_ai")]
    for handler in root.handlers:
        if handler not in handlers and handler not in inspect_handlers:
            handler.close()  # e.g. Hydra's file handler on a job folder the test's tmp_path holds
    root.handlers[:] = handlers + inspect_handlers
    root.setLevel(level)
    for logger in logging.root.manager.loggerDict.values():
        if isinstance(logger, logging.Logger):
            logger.disabled = disabled.get(logger, False)  # a logger created since was enabled when created


@pytest.fixture(autouse=True)
def _asyncio_unpatched():
    """No test leaves `asyncio.run` patched. Inspect applies nest_asyncio, process-wide and for good, when one of its
    synchronous calls runs inside an event loop (e.g. `score()` on a lazily read log); the patched `asyncio.run`
    then leaves event loops unclosed, whose ResourceWarnings surface in whichever later test collects them."""
    import asyncio

    yield
    assert asyncio.run.__module__ == "asyncio.runners", (
        "this test left asyncio patched by nest_asyncio (an Inspect sync call inside an event loop): read the log "
        "whole first, or call the async variant"
    )


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Checkpoints built by references go to a per-session cache, not the user's home.

    `STEER_HYDRA_TEST_CACHE` names a shared one instead (CI: the main and the vLLM sessions convert SmolLM2 once).
    """
    shared = os.environ.get("STEER_HYDRA_TEST_CACHE")
    os.environ["STEER_HYDRA_CACHE"] = shared or str(tmp_path_factory.mktemp("steer_hydra_cache"))


@pytest.fixture(autouse=True)
def _nothing_stays_resident():
    """A base model a test's run kept resident (`core.resident`), or a log it read (`analysis.logs`), never reaches
    the next test of this worker."""
    yield
    from steer_hydra.analysis.logs import clear_log_cache
    from steer_hydra.core import resident

    resident.configure(False)
    clear_log_cache()  # the logs a test's comparisons read are read anew by the next test


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import importlib.util

    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    no_vllm = pytest.mark.skip(reason="needs vLLM importable (scripts/setup_vllm.sh builds .venv-vllm)")
    has_gpu, has_vllm = torch.cuda.is_available(), importlib.util.find_spec("vllm") is not None
    for item in items:
        if item.get_closest_marker("gpu") and not has_gpu:
            item.add_marker(no_gpu)
        elif item.get_closest_marker("vllm") and not has_vllm:
            item.add_marker(no_vllm)


@pytest.fixture
def tiny():
    """A fresh `(model, tokenizer)` of the tiny chat model (fresh per test: controls may modify the model)."""
    from steer_hydra.models import build_tiny_model

    return build_tiny_model()


@pytest.fixture
def make_pipeline():
    """Build and steer a pipeline on a fresh tiny model: `make_pipeline(controls, chat=True, **spec_fields)`."""
    from steer_hydra.core import SteeringPipeline
    from steer_hydra.models import TinySpec, build_tiny_model

    built = []

    def factory(controls=(), *, chat: bool = True, steer: bool = True, **spec_fields):
        model, tokenizer = build_tiny_model(TinySpec(chat_template=chat, **spec_fields))
        pipeline = SteeringPipeline(model=model, tokenizer=tokenizer, controls=list(controls))
        built.append(pipeline)
        return pipeline.steer() if steer else pipeline

    yield factory
    for pipeline in built:
        pipeline.release()


@pytest.fixture(scope="module")
def tiny_server():
    """The tiny chat model on the Hugging Face backend, served as `tiny` on 127.0.0.1 by a
    `LoopbackCompletionsServer` for the whole test module; `tiny_server.pipeline` is the pipeline it generates with.
    Tests that share it take `loopback` (reset around each test) unless they reset it themselves."""
    from steer_hydra.core import SteeringPipeline
    from steer_hydra.models import build_tiny_model
    from steer_hydra.testing.loopback_server import LoopbackCompletionsServer

    model, tokenizer = build_tiny_model()
    reference = SteeringPipeline(model=model, tokenizer=tokenizer).steer()
    with LoopbackCompletionsServer(reference, model_name="tiny") as server:
        yield server
    reference.release()


@pytest.fixture
def loopback(tiny_server):
    """The module's loopback server with no recorded requests, faults or freeze; the test must leave it idle (a
    request a client gave up on finishes within 10 s) and it is reset again after."""
    tiny_server.reset()
    yield tiny_server
    tiny_server.thaw()  # a frozen request is let go (unanswered) so the server can go idle
    assert tiny_server.wait_idle(), "a loopback request is still being served"
    tiny_server.reset()


@pytest.fixture
def serve_client(loopback):
    """`serve_client(controls=(), *, steer=True, **options)`: a pipeline with the tiny tokenizer on
    backend=vllm_serve pointed at the loopback server (`retry_backoff=0` unless given), released after the test."""
    from steer_hydra.core import BackendSpec, SteeringPipeline
    from steer_hydra.models import build_tiny_model

    made = []

    def factory(controls=(), *, steer: bool = True, **options):
        _, tokenizer = build_tiny_model()
        spec = BackendSpec("vllm_serve", {"base_url": loopback.base_url, "retry_backoff": 0.0, **options})
        pipeline = SteeringPipeline(tokenizer=tokenizer, controls=list(controls), backend=spec)
        made.append(pipeline)
        return pipeline.steer() if steer else pipeline

    yield factory
    for pipeline in made:
        pipeline.release()
