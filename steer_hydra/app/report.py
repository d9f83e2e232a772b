"""The results table a job or a sweep ends with, rendered for the terminal, and the lines that say where things are.

The table's rows are built by `analysis.table`; this module only renders them (`render`, `report_text`) and prints.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd


def _number(value: Any, digits: int = 3, *, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:+.{digits}f}" if sign else f"{number:.{digits}f}"


def render(table: pd.DataFrame, *, title: str, width: int | None = None) -> str:
    """The table as text (rich), one line per row; columns that hold a single value for every row go in the title."""
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    shown = Table(title=escape(title), box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False)
    constant = {c for c in ("model", "suite") if c in table.columns and table[c].nunique() <= 1}
    headers = [
        ("model", "Model"),
        ("suite", "Suite"),
        ("task", "Task"),
        ("scorer", "Scorer"),
        ("metric", "Metric"),
        ("arm", "Arm"),
    ]
    headers = [(c, h) for c, h in headers if c in table.columns and c not in constant]
    for _, header in headers:
        shown.add_column(header, no_wrap=True)
    for header in ("Value", "± Stderr", "n", "Δ vs baseline", "95% CI", "Changed"):
        shown.add_column(header, justify="right", no_wrap=True)
    for row in table.to_dict("records"):
        has_delta = not (isinstance(row.get("delta"), float) and math.isnan(row["delta"]))
        ci = f"[{_number(row['ci_low'], 2, sign=True)}, {_number(row['ci_high'], 2, sign=True)}]" if has_delta else ""
        if has_delta and not _number(row["ci_low"]):
            ci = "(n<2)"
        changed = row.get("changed")
        changed_text = "" if changed is None or math.isnan(changed) else f"{100 * changed:.0f}%"
        runs = int(row["runs"]) if row.get("runs") and not math.isnan(row["runs"]) else 1
        n = "" if row.get("n") is None or math.isnan(row["n"]) else f"{int(row['n'])}"
        shown.add_row(
            *[escape(str(row[c])) for c, _ in headers],
            _number(row["value"]),
            _number(row["stderr"]),
            n + (f" x{runs}" if runs > 1 else ""),
            _number(row["delta"], sign=True) if has_delta else "",
            ci,
            changed_text,
        )
    console = Console(width=width or 200, record=True, file=_Discard(), highlight=False, color_system=None)
    console.print(shown)
    return "\n".join(line.rstrip() for line in console.export_text().splitlines()).strip("\n")


class _Discard:
    """A text stream that drops what it is given (rich records the table; the caller prints the text)."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        return None


def table_title(kind: str, frame: pd.DataFrame, extra: Mapping[str, Any] | None = None) -> str:
    """`<kind>: suite S, model M[, k=v...]` with the single-valued model/suite of the table."""
    parts = [kind]
    for column in ("suite", "model"):
        if column in frame.columns and frame[column].nunique() == 1:
            parts.append(f"{column} {frame[column].iloc[0]}")
    parts += [f"{k} {v}" for k, v in (extra or {}).items() if v not in (None, "")]
    return ", ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")


def inspect_view_command(log_dir: str | Path) -> str:
    """The exact command that opens these Inspect logs."""
    return shlex.join(["inspect", "view", "--log-dir", str(log_dir)])


def report_text(
    table: pd.DataFrame,
    *,
    title: str,
    files: Mapping[str, str | Path],
    log_dir: str | Path | None = None,
    notes: Sequence[str] = (),
) -> str:
    """The table, then the files written, the `inspect view` command and any notes (W&B location...)."""
    lines = [render(table, title=title) if not table.empty else f"{title}: no scored results."]
    written = [Path(p) for p in files.values() if p is not None and Path(p).exists()]
    if written:
        folders = sorted({str(p.parent) for p in written})
        if len(folders) == 1:
            lines.append(f"Files in {folders[0]}: {', '.join(p.name for p in written)}")
        else:
            lines.append("Files: " + ", ".join(str(p) for p in written))
    if log_dir is not None:
        lines.append(f"Inspect logs: {inspect_view_command(log_dir)}")
    lines += [n for n in notes if n]
    return "\n".join(lines)


def print_report(text: str, stream: TextIO | None = None) -> None:
    """Print the report to stdout (the researcher's terminal), flushed, framed by blank lines."""
    stream = stream or sys.stdout
    stream.write("\n" + text + "\n\n")
    stream.flush()
