"""The results table a job or a sweep ends with (terminal and W&B alike), and the lines that say where things are.

One row per (model, suite, task, scorer, metric, arm): the arm's value (mean over its trials and seeds), the
scorer's stderr, `n` samples, and for every arm but the baseline the paired delta vs the baseline with its 95% CI
and the changed share (`evaluation.stats`). The rows come from the results frame (the logs' metrics) and the
paired-deltas frame (`results.compare`); `delta_rows` is the one place a delta's score column is matched to the
metric it moves, so the table and the W&B keys (`tracking.wandb_key`) agree.
"""

from __future__ import annotations

import math
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pandas as pd

SPREAD_METRICS = ("stderr", "std")
HEADLINE_METRICS = ("accuracy", "mean")  # what a per-sample score's mean is reported as by Inspect's scorers
TABLE_COLUMNS = (
    "model",
    "suite",
    "task",
    "scorer",
    "metric",
    "arm",
    "config_id",
    "value",
    "stderr",
    "n",
    "runs",
    "delta",
    "ci_low",
    "ci_high",
    "changed",
)


def _headline_metric(metrics: Sequence[str]) -> str | None:
    for name in HEADLINE_METRICS:
        if name in metrics:
            return name
    candidates = [m for m in metrics if m not in SPREAD_METRICS]
    return candidates[0] if candidates else None


def delta_rows(deltas: pd.DataFrame, results: pd.DataFrame) -> pd.DataFrame:
    """Each paired delta located as `(suite, task, scorer, metric)` of the results it moves.

    A delta's score column is a scorer (`includes`: its per-sample mean is the scorer's `accuracy` or `mean`
    metric) or `scorer/key` for a dict-valued score (metric `key`). Returns columns `[model,] suite, task, scorer,
    metric, arm, config_id, delta, ci_low, ci_high, n_paired, changed`.
    """
    columns = ["suite", "task", "scorer", "metric", "arm", "config_id", "delta", "ci_low", "ci_high"]
    if deltas.empty:
        return pd.DataFrame(columns=[*columns, "n_paired", "changed"])
    keys = ["model", "suite", "task"] if "model" in deltas.columns and "model" in results.columns else ["suite", "task"]
    metrics_of: dict[tuple, list[str]] = {}
    for key, rows in results.groupby([*keys, "scorer"], sort=False) if not results.empty else []:
        metrics_of[tuple(key)] = list(dict.fromkeys(rows["metric"]))
    out = []
    for row in deltas.to_dict("records"):
        column = str(row["metric"])
        if "/" in column:
            scorer, metric = column.split("/", 1)
        else:
            scorer = column
            metric = _headline_metric(metrics_of.get((*[row[k] for k in keys], scorer), [])) or "mean"
        out.append(
            {
                **({"model": row["model"]} if "model" in keys else {}),
                "suite": row["suite"],
                "task": row["task"],
                "scorer": scorer,
                "metric": metric,
                "arm": row["arm"],
                "config_id": row["config_id"],
                "delta": row["delta"],
                "ci_low": row["ci_low"],
                "ci_high": row["ci_high"],
                "n_paired": row["n"],
                "changed": row.get("changed", math.nan),
            }
        )
    return pd.DataFrame(out)


def results_table(results: pd.DataFrame, deltas: pd.DataFrame, baseline_config_id: str) -> pd.DataFrame:
    """The results table (columns `TABLE_COLUMNS`, `model` only when `results` has it), baseline rows first.

    `results`: a results frame in the app's columns (`arm`, `config_id`, `suite`, `task`, `scorer`, `metric`,
    `value`, `n`), possibly several trials or seeds per arm (averaged; `runs` counts them). `deltas`: paired deltas
    (`evaluation.stats.paired_deltas`).
    """
    keys = (["model"] if "model" in results.columns else []) + ["suite", "task", "scorer"]
    columns = [c for c in TABLE_COLUMNS if c != "model" or "model" in keys]
    if results.empty:
        return pd.DataFrame(columns=columns)
    main = results[~results["metric"].isin(SPREAD_METRICS)]
    values = (
        main.groupby([*keys, "metric", "arm", "config_id"], sort=False, dropna=False)
        .agg(value=("value", "mean"), n=("n", "max"), runs=("value", "count"))
        .reset_index()
    )
    spread = results[results["metric"] == "stderr"]
    stderr = spread.groupby([*keys, "arm", "config_id"], dropna=False)["value"].mean().rename("stderr").reset_index()
    table = values.merge(stderr, on=[*keys, "arm", "config_id"], how="left")
    located = delta_rows(deltas, results)
    if not located.empty:
        located = located.drop(columns=["arm", "n_paired"])
        table = table.merge(located, on=[*keys, "metric", "config_id"], how="left")
    for column in ("delta", "ci_low", "ci_high", "changed"):
        if column not in table.columns:
            table[column] = math.nan
    table["_base"] = table["config_id"] != baseline_config_id
    table = table.sort_values([*keys, "metric", "_base", "arm"], kind="stable").drop(columns="_base")
    return table[columns].reset_index(drop=True)


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
