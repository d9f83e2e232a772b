"""The study's page: one self-contained `index.html` in the study folder (its tables, plots and the logs' bundle
command), plain HTML and CSS with no script or network asset, so a browser opens it from disk."""

from __future__ import annotations

import html
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from steer_hydra.store import SaveDir

PAGE = "index.html"
PAGE_TABLES = ("study_summary", "costs_summary", "selection", "study_results")  # in page order
PAGE_PLOTS = ("strength_curves.png", "study_deltas.png", "pareto.png")
OPEN_ROWS = 60  # a longer table starts folded
STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:110em}table{border-collapse:collapse;font-size:.8em}"
    "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}summary{cursor:pointer}"
    "pre{background:#f4f4f4;padding:.6em;overflow-x:auto}"
)


def _number(value: float) -> str:
    return f"{value:.0f}" if float(value).is_integer() else f"{value:.3f}"


def bundle_command(save_dir: str | Path, out_dir: str | Path) -> str:
    """The command that writes Inspect's static log viewer of `save_dir`'s logs into `<out_dir>/logs_bundle`."""
    logs, bundle = SaveDir(save_dir).logs_root, Path(out_dir).absolute() / "logs_bundle"
    return shlex.join(["inspect", "view", "bundle", "--log-dir", str(logs), "--output-dir", str(bundle), "--overwrite"])


def write_page(
    out_dir: str | Path,
    *,
    concepts: Sequence[str],
    tables: Mapping[str, pd.DataFrame],
    objective: str,
    save_dir: str | Path | None = None,
) -> Path:
    """Write `<out_dir>/index.html`: the title, the concepts, the plots of `PAGE_PLOTS` that exist (relative
    links), each non-empty table of `PAGE_TABLES` (escaped `to_html`, with a link to its CSV) and, given the
    study's `save_dir`, the `inspect view bundle` command for its logs (printed, never run)."""
    out_dir, esc = Path(out_dir), html.escape
    title = f"Concept study: {len(concepts)} concept(s), objective {objective}"
    parts = [
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>',
        f"<style>{STYLE}</style></head><body><h1>{esc(title)}</h1>",
        f"<p>Concepts: {', '.join(esc(str(c)) for c in concepts)}</p>",
    ]
    plots = [name for name in PAGE_PLOTS if (out_dir / name).is_file()]
    if plots:
        parts.append("<h2>Plots</h2>")
        parts += [f'<p><img src="{esc(name)}" alt="{esc(name)}"></p>' for name in plots]
    parts.append("<h2>Tables</h2>")
    for name in PAGE_TABLES:
        table = tables.get(name)
        if table is None or table.empty:
            continue
        csv = f"{name}.csv"
        link = f' (<a href="{esc(csv)}">{esc(csv)}</a>)' if (out_dir / csv).is_file() else ""
        shown = table.dropna(axis=1, how="all")  # axes no point of the study uses
        body = shown.to_html(index=False, escape=True, na_rep="", float_format=_number, border=0)
        fold = " open" if len(table) <= OPEN_ROWS else ""
        parts.append(f"<details{fold}><summary>{esc(name)}, {len(table)} row(s){link}</summary>{body}</details>")
    if save_dir is not None:
        parts += [
            "<h2>Logs</h2><p>Every sample's record (prompts, completions, scores) is in the Inspect logs. This writes "
            "their static viewer beside this page, in <code>logs_bundle/</code> (serve that folder from any web "
            "server, e.g. <code>python -m http.server</code> run inside it):</p>",
            f"<pre>{esc(bundle_command(save_dir, out_dir))}</pre>",
        ]
    parts.append("</body></html>\n")
    path = out_dir / PAGE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts), encoding="utf-8")
    return path
