"""What a job prints besides its results table: each warning once through logging, no library progress bars.

Invariants while `job_console()` is open: a Python warning (a control's "PASTA got no substrings...", a library's
deprecation) is logged once per job through the `steer_hydra.warnings` logger as `<Category>: <message>`, without
the source line `warnings` would print; transformers' own progress bars (model loading) are off; the job's own
progress display decides for itself whether the terminal is a TTY (`is_tty`). Everything is restored on exit.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

logger = logging.getLogger("steer_hydra.warnings")


def is_tty(stream: TextIO | None = None) -> bool:
    """Whether `stream` (stderr by default, where progress goes) is an interactive terminal."""
    stream = stream if stream is not None else sys.stderr
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def job_console() -> Iterator[None]:
    """Warnings once per job through logging, transformers' progress bars off; restored on exit."""
    seen: set[tuple[str, str]] = set()
    original_show = warnings.showwarning

    def show(message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None):
        key = (category.__name__, str(message))
        if key in seen:
            return
        seen.add(key)
        logger.warning("%s: %s", category.__name__, message)

    bars_were_on = _transformers_bars(False)
    warnings.showwarning = show
    try:
        with warnings.catch_warnings():
            # a filter change resets the once-per-location memory, so a second job in one process warns again
            warnings.filterwarnings("default", category=UserWarning)
            warnings.showwarning = show  # catch_warnings restores the previous hook on exit
            yield
    finally:
        warnings.showwarning = original_show
        if bars_were_on:
            _transformers_bars(True)


def _transformers_bars(on: bool) -> bool:
    """Switch transformers' tqdm bars; returns whether they were on before."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    was_on = hf_logging.is_progress_bar_enabled()
    if on:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    return was_on
