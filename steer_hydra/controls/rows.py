"""Training rows for controls that learn at `steer()` (trainers, prompt optimizers): read, split-filtered, digested.

A control takes its data as rows (a list of mappings, e.g. a concept's contrastive pairs from the config) or as a
file (`.jsonl`: one JSON object per line; `.json`: a list of objects, or `{"rows": [...]}`). Rows that carry a
`split` field are kept only when it equals the control's split (default `train`), so a file holding train, dev
and test rows never lets a dev or test row reach a trainer or an optimizer; rows without the field are all
training rows. `rows_digest` is the content identity of the rows a control actually uses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from steer_hydra.core.identity import canonical_json

PROMPT_KEYS = ("prompt", "input", "question", "instruction")
RESPONSE_KEYS = ("response", "completion", "output", "answer", "positive", "chosen")
CHOSEN_KEYS = ("chosen", "positive")
REJECTED_KEYS = ("rejected", "negative")


def read_rows(data: str | Path | Sequence[Mapping[str, Any]], *, where: str) -> list[dict[str, Any]]:
    """Every row of `data` (a file path or rows), as plain dicts; errors name `where` and the fix."""
    if isinstance(data, (str, Path)):
        path = Path(data).expanduser()
        if not path.is_file():
            raise ValueError(
                f"{where}: {str(data)!r} is not a file. Fix: give a .jsonl file (one JSON object per line), a .json "
                "list of objects, or the rows themselves."
            )
        text = path.read_text(encoding="utf-8")
        try:
            if path.suffix == ".jsonl":
                raw: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
            else:
                raw = json.loads(text)
                raw = raw.get("rows") if isinstance(raw, Mapping) else raw
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: {path} is not valid JSON ({error}). Fix: one JSON object per line.") from error
    else:
        raw = data
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)) or not all(isinstance(r, Mapping) for r in raw):
        raise ValueError(f"{where}: the data must be a list of JSON objects (rows); got {type(raw).__name__}.")
    return [dict(r) for r in raw]


def split_rows(rows: Sequence[Mapping[str, Any]], split: str | None, *, where: str) -> list[dict[str, Any]]:
    """The rows of `split` (rows without a `split` field count as training rows; `split=None` keeps only those)."""
    kept = [dict(r) for r in rows if r.get("split") is None or (split is not None and r.get("split") == split)]
    if not kept:
        splits = sorted({str(r.get("split")) for r in rows})
        raise ValueError(
            f"{where}: no training rows (split={split!r}; the data's splits: {splits}). Fix: give rows of the "
            "training split, or set split to the name the data uses for it."
        )
    return kept


def first(row: Mapping[str, Any], keys: Sequence[str], *, where: str, what: str) -> str:
    """The value of the first of `keys` present in `row`, as a string; a ValueError naming the keys otherwise."""
    for key in keys:
        value = row.get(key)
        if value is not None and str(value).strip():
            return str(value)
    raise ValueError(
        f"{where}: a row has no {what} (looked for {list(keys)}; its keys: {sorted(row)}). Fix: give every row one "
        f"of {list(keys)}."
    )


def rows_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    """A content digest of rows (their canonical JSON)."""
    import hashlib

    return hashlib.sha256(canonical_json(list(rows)).encode()).hexdigest()
