"""Building and loading transformers models safely in a process with threads, and checking the result is whole.

`model_construction()` is the one process-wide lock every model build or load of this package holds. transformers
is not thread-safe there: `from_pretrained` builds the model inside `transformers.initialization.no_tie_weights()`,
which replaces `PreTrainedModel.tie_weights` *on the class* with a no-op and puts back, on exit, whatever it found on
entry; it also sets the process's default dtype (`local_torch_dtype`) and patches `torch.linspace` the same way. Two
loads in two threads interleave as enter A, enter B (which saves A's no-op), exit A, exit B (which restores the
no-op): from then on `tie_weights()` does nothing for every model of the process, so a checkpoint that ties its
output embedding to its input embedding (SmolLM2) loads with `lm_head` left on the meta device, and `save_pretrained`
or the first forward fails with "Cannot copy out of meta tensor". Under the lock the swaps never overlap.

`ensure_loaded(model)` is the check after a load or a conversion: an output embedding the config ties but that was
left on the meta device is tied to the input embedding; any other parameter without data is refused, naming it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

logger = logging.getLogger(__name__)

_CONSTRUCTION = threading.RLock()  # re-entrant: a load may convert a built-in reference first, under the same lock

LOAD_CAUSE = "not loaded, or offloaded to disk by a device_map"
LOAD_FIX = "load it whole, e.g. model.device_map=null on a CPU, or a device with room for it"


@contextmanager
def model_construction() -> Iterator[None]:
    """Hold the process-wide lock around building or loading a transformers model (see the module docstring)."""
    with _CONSTRUCTION:
        yield


def ensure_loaded(
    model: torch.nn.Module, reference: Any = None, *, cause: str = LOAD_CAUSE, fix: str = LOAD_FIX
) -> None:
    """Every parameter of `model` holds data: an output embedding the config ties to the input embedding but that
    was left on the meta device is tied now; any other parameter still on the meta device (by default: not loaded,
    or offloaded to disk by a `device_map`) raises a RuntimeError naming it, the model (`reference`), `cause` and
    `fix`."""
    config = getattr(model, "config", None)
    get_output = getattr(model, "get_output_embeddings", None)
    head = get_output() if callable(get_output) else None
    weight = getattr(head, "weight", None)
    if getattr(config, "tie_word_embeddings", False) and weight is not None and weight.device.type == "meta":
        logger.warning("The output embedding of %s was not tied to the input embedding at load; tying it.", reference)
        head.weight = model.get_input_embeddings().weight  # the tie the config asks for, done here
    missing = [name for name, parameter in model.named_parameters() if parameter.device.type == "meta"]
    if missing:
        raise RuntimeError(
            f"{len(missing)} parameter(s) of {reference or type(model).__name__} hold no data (on the meta device: "
            f"{', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}): {cause}. Fix: {fix}."
        )
