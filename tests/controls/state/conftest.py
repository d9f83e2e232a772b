"""Helpers for the state-control tests: recording a module's inputs, applying a HookSet outside the pipeline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch


class InputRecorder:
    """Records the hidden-state input of one module at every forward (a clone, so later edits do not leak)."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []

    def __call__(self, module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self.inputs.append(hidden.detach().clone())


@contextlib.contextmanager
def recording(module: torch.nn.Module) -> Iterator[InputRecorder]:
    recorder = InputRecorder()
    handle = module.register_forward_pre_hook(recorder, with_kwargs=True)
    try:
        yield recorder
    finally:
        handle.remove()


@contextlib.contextmanager
def hooks_applied(model: torch.nn.Module, hook_set) -> Iterator[None]:
    """Register a control's HookSet on `model` for the body (what `HFBackend.applied` does)."""
    with contextlib.ExitStack() as stack:
        for spec in hook_set.get("pre", ()):
            handle = model.get_submodule(spec["module"]).register_forward_pre_hook(spec["hook_func"], with_kwargs=True)
            stack.callback(handle.remove)
        for spec in hook_set.get("forward", ()):
            handle = model.get_submodule(spec["module"]).register_forward_hook(spec["hook_func"], with_kwargs=True)
            stack.callback(handle.remove)
        for factory in hook_set.get("context", ()):
            stack.enter_context(factory())
        yield


def hook_count(model: torch.nn.Module) -> int:
    """Forward and forward-pre hooks registered anywhere in `model`."""
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


@pytest.fixture
def record_inputs():
    return recording


@pytest.fixture
def apply_hooks():
    return hooks_applied


@pytest.fixture
def count_hooks():
    return hook_count
