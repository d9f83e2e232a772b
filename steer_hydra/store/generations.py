"""`GenerationStore`: generations kept in a save_dir by what determines them, so a request made again (the same arm
on the same prompt for another concept's suite) is answered without generating, and scored as its own task asks.

A generation is determined by its scope and its request. The scope (`comparable.generation_scope`) is the
configuration (`config_id`), the evaluation setting without the suite and the scoring (model source, backend
options, provider options, generation defaults) and the trial; the request is what the provider hands the pipeline:
the prompt as rendered, the generation arguments (seed included when sampling), the per-sample runtime kwargs and
the number of choices. A suite's name, its task's scoring arguments (a concept) and its scorers are in neither, so
concept suites share the generations of every arm that reads no concept (the baseline, PASTA on the instruction).

Invariants: only deterministic requests are stored (greedy, or sampled with a seed): an unseeded sample is drawn
afresh, so trials and epochs stay independent draws; an entry is written atomically once its generation finished
(a concurrent reader sees none or all of it); an entry that cannot be read is ignored (generated again). Entries
live under `<save_dir>/generations/<scope>/`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from steer_hydra.core.files import atomic_write_text
from steer_hydra.core.identity import canonical_json

logger = logging.getLogger(__name__)

GENERATIONS_DIR = "generations"


class GenerationStore:
    """The generations of one scope (configuration, setting, trial) in a save_dir; `hits` counts answered requests."""

    def __init__(self, root: str | Path, scope: str) -> None:
        self.folder = Path(root) / GENERATIONS_DIR / scope
        self.scope = scope
        self.hits = 0

    @staticmethod
    def request_key(request: Mapping[str, Any]) -> str | None:
        """The key of a request, or None when it must not be shared (sampling without a seed, or a value with no
        content form)."""
        arguments = request.get("gen_kwargs") or {}
        if arguments.get("do_sample") and arguments.get("seed") is None:
            return None
        try:
            return hashlib.sha256(canonical_json(dict(request)).encode()).hexdigest()
        except TypeError:
            return None

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored output of `key` (as `put` was given it), or None."""
        path = self._path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as error:
            logger.warning("Generation %s cannot be read (%s); it is generated again.", path, error)
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or not isinstance(entry.get("output"), dict):
            return None
        self.hits += 1
        return entry["output"]

    def put(self, key: str, output: Mapping[str, Any]) -> None:
        """Keep the output of a finished generation under `key`."""
        atomic_write_text(self._path(key), json.dumps({"key": key, "output": dict(output)}, default=str))
