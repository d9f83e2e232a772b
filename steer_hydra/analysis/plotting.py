"""Plots of results frames: metric by configuration, trade-offs with Pareto frontiers, sensitivity, paired deltas.

Inputs are summary frames (`summarize_runs`: `{metric}_mean`, `{metric}_std` per configuration), per-trial runs
frames, or the `paired_deltas` frame. Every function takes `ax=None` (a new figure) and `save_path=None` (a PNG
at 150 dpi, tight bounding box) and returns the Axes unless noted. matplotlib is imported on first use (it picks
the Agg backend on a headless machine); the heatmap also needs seaborn (the `plots` extra).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

DPI = 150
_BASELINE_COLOR = "0.35"


def _pyplot() -> Any:
    import matplotlib.pyplot as plt

    return plt


def _axes(ax: Any, figsize: tuple[float, float] = (6.0, 4.0)) -> Any:
    if ax is not None:
        return ax
    _, ax = _pyplot().subplots(figsize=figsize)
    return ax


def _save(fig: Any, save_path: str | Path | None) -> None:
    if save_path is None:
        return
    path = Path(save_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")


def _column(frame: pd.DataFrame, name: str, what: str) -> pd.Series:
    if name not in frame.columns:
        raise KeyError(f"{what}: column {name!r} not in the frame; columns: {list(frame.columns)}.")
    return frame[name]


def _mean_col(frame: pd.DataFrame, metric: str) -> str:
    """`{metric}_mean` when present (summary frames), else the metric itself (per-trial frames)."""
    return f"{metric}_mean" if f"{metric}_mean" in frame.columns else metric


def _std_values(frame: pd.DataFrame, metric: str) -> np.ndarray | None:
    col = f"{metric}_std"
    return frame[col].to_numpy(dtype=float) if col in frame.columns else None


def _min_span(ax: Any, values: np.ndarray, *, span: float) -> None:
    """Widen the x axis to at least `span` around the finite `values` (all-equal values get a readable axis)."""
    finite = values[np.isfinite(values)]
    if not finite.size:
        return
    low, high = float(finite.min()), float(finite.max())
    if high - low < span:
        middle = (low + high) / 2
        ax.set_xlim(middle - span / 2 - 0.05 * span, middle + span / 2 + 0.05 * span)


def _check_compare(compare_to_arms: Sequence[tuple[str, pd.DataFrame]] | None) -> list[tuple[str, pd.DataFrame]]:
    checked = []
    for entry in compare_to_arms or []:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"compare_to_arms entries must be (label, frame) pairs; got {entry!r}.")
        label, frame = entry
        if "config_id" in frame.columns and frame["config_id"].nunique() > 1:
            raise ValueError(
                f"compare_to_arms[{label!r}] holds {frame['config_id'].nunique()} configurations; pass a frame "
                "of exactly one configuration (e.g. the baseline's summary row)."
            )
        checked.append((str(label), frame))
    return checked


def apply_plot_style() -> None:
    """A clean, readable default style (grid, no top/right spines, larger labels) for the current session."""
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 8,
            "legend.frameon": False,
            "figure.dpi": 100,
            "savefig.dpi": DPI,
        }
    )


# ---------------------------------------------------------------------------------------------- pareto
def pareto_frontier(
    summary: pd.DataFrame, x_metric: str, y_metric: str, *, maximize_x: bool = True, maximize_y: bool = True
) -> pd.DataFrame:
    """The non-dominated rows of `summary` on the (x, y) means under the maximize flags, sorted by x.

    A row is dominated when another row is at least as good on both axes and strictly better on one.
    """
    x = _column(summary, _mean_col(summary, x_metric), "pareto_frontier").to_numpy(dtype=float)
    y = _column(summary, _mean_col(summary, y_metric), "pareto_frontier").to_numpy(dtype=float)
    sx = x if maximize_x else -x
    sy = y if maximize_y else -y
    keep = []
    for i in range(len(x)):
        if math.isnan(x[i]) or math.isnan(y[i]):
            continue
        dominated = np.any((sx >= sx[i]) & (sy >= sy[i]) & ((sx > sx[i]) | (sy > sy[i])))
        if not dominated:
            keep.append(i)
    frontier = summary.iloc[keep]
    return frontier.sort_values(_mean_col(summary, x_metric), kind="stable")


def plot_pareto_frontier(
    summary: pd.DataFrame,
    x_metric: str,
    y_metric: str,
    *,
    maximize_x: bool = True,
    maximize_y: bool = True,
    ax: Any = None,
    save_path: str | Path | None = None,
    color: str = "black",
    label: str = "Pareto frontier",
) -> tuple[Any, pd.DataFrame]:
    """Draw the Pareto frontier as a step line; returns `(ax, frontier rows)`."""
    ax = _axes(ax)
    points = pareto_frontier(summary, x_metric, y_metric, maximize_x=maximize_x, maximize_y=maximize_y)
    if not points.empty:
        ax.plot(
            points[_mean_col(summary, x_metric)],
            points[_mean_col(summary, y_metric)],
            linestyle="--",
            marker="o",
            markersize=3,
            color=color,
            label=label,
            zorder=1,
        )
    _save(ax.figure, save_path)
    return ax, points


# ---------------------------------------------------------------------------------------------- metric by config
def plot_metric_by_config(
    summary: pd.DataFrame,
    metric: str,
    x_col: str = "config_id",
    baseline_value: float | None = None,
    baseline_std: float | None = None,
    *,
    ylabel: str | None = None,
    title: str | None = None,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """Mean (with std error bars) of `metric` per configuration, with the baseline as a line and a +/- std band."""
    ax = _axes(ax)
    labels = _column(summary, x_col, "plot_metric_by_config").astype(str).tolist()
    means = _column(summary, _mean_col(summary, metric), "plot_metric_by_config").to_numpy(dtype=float)
    stds = _std_values(summary, metric)
    positions = np.arange(len(labels))
    ax.bar(positions, means, yerr=stds, capsize=3, color="C0", alpha=0.8, label=metric)
    if baseline_value is not None:
        ax.axhline(baseline_value, color=_BASELINE_COLOR, linestyle="--", linewidth=1, label="baseline")
        if baseline_std:
            ax.axhspan(baseline_value - baseline_std, baseline_value + baseline_std, color=_BASELINE_COLOR, alpha=0.15)
    ax.set_xticks(positions)
    ax.set_xticklabels(labels, rotation=30, ha="right")
    ax.set_ylabel(ylabel or metric)
    ax.set_xlabel(x_col)
    if title:
        ax.set_title(title)
    ax.legend()
    _save(ax.figure, save_path)
    return ax


# ---------------------------------------------------------------------------------------------- paired deltas
def plot_paired_deltas(
    deltas: pd.DataFrame,
    *,
    label_col: str = "arm",
    group_cols: Sequence[str] = ("task", "metric"),
    title: str | None = None,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """Each arm's paired delta vs the baseline with its confidence interval, one row per (arm, task, metric)."""
    for column in ("delta", "ci_low", "ci_high", label_col):
        _column(deltas, column, "plot_paired_deltas")
    frame = deltas.reset_index(drop=True)
    groups = [c for c in group_cols if c in frame.columns]
    labels = [" | ".join([str(row[label_col]), *(str(row[c]) for c in groups)]) for _, row in frame.iterrows()]
    if "n" in frame.columns:
        labels = [f"{label} (n={n})" for label, n in zip(labels, frame["n"], strict=True)]
    ax = _axes(ax, figsize=(7.0, max(2.0, 0.45 * len(frame) + 1.0)))
    y = np.arange(len(frame))
    delta = frame["delta"].to_numpy(dtype=float)
    low = frame["ci_low"].to_numpy(dtype=float)
    high = frame["ci_high"].to_numpy(dtype=float)
    err = np.vstack([np.nan_to_num(delta - low), np.nan_to_num(high - delta)])
    colors = ["C2" if lo > 0 else "C3" if hi < 0 else "C0" for lo, hi in zip(low, high, strict=True)]
    ax.errorbar(delta, y, xerr=err, fmt="none", ecolor="0.4", capsize=3, zorder=1)
    ax.scatter(delta, y, c=colors, zorder=2)
    ax.axvline(0.0, color=_BASELINE_COLOR, linestyle="--", linewidth=1)
    for x_value, y_value in zip(delta, y, strict=True):
        if not math.isnan(x_value):
            ax.annotate(f"{x_value:+.3f}", (x_value, y_value), textcoords="offset points", xytext=(0, 6),
                        ha="center", fontsize=8)  # fmt: skip
    _min_span(ax, np.concatenate([delta, low, high]), span=0.2)  # an all-zero run still shows a readable axis
    ax.set_ylim(-0.6, len(frame) - 0.4)
    ax.set_yticks(y)
    ax.set_yticklabels(labels)
    confidence = frame["confidence"].iloc[0] if "confidence" in frame.columns and len(frame) else None
    suffix = f" ({confidence:.0%} CI)" if confidence is not None else ""
    ax.set_xlabel(f"delta vs baseline{suffix}")
    if title:
        ax.set_title(title)
    _save(ax.figure, save_path)
    return ax


# ---------------------------------------------------------------------------------------------- trade-offs
def plot_tradeoff_scatter(
    summary: pd.DataFrame,
    x_metric: str,
    y_metric: str,
    group_col: str | None = None,
    group_order: Sequence[Any] | None = None,
    color_col: str | None = None,
    label_col: str | None = None,
    label_points: str = "all",
    compare_to_arms: Sequence[tuple[str, pd.DataFrame]] | None = None,
    per_trial_data: pd.DataFrame | None = None,
    show_pareto: bool = False,
    maximize_x: bool = True,
    maximize_y: bool = True,
    fill: bool = True,
    *,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """Target metric vs capability metric per configuration (means with std error bars).

    `group_col` colours points by group (in `group_order`); `color_col` colours them on a continuous scale
    instead; `label_col` annotates every point (`label_points="all"`) or only frontier points ("frontier");
    `compare_to_arms` adds reference configurations as stars; `per_trial_data` adds faint per-trial points;
    `show_pareto` draws the frontier. `fill=False` draws hollow markers.
    """
    if label_points not in ("all", "frontier"):
        raise ValueError(f"label_points must be 'all' or 'frontier'; got {label_points!r}.")
    compare = _check_compare(compare_to_arms)
    ax = _axes(ax)
    xm, ym = _mean_col(summary, x_metric), _mean_col(summary, y_metric)
    x = _column(summary, xm, "plot_tradeoff_scatter").to_numpy(dtype=float)
    y = _column(summary, ym, "plot_tradeoff_scatter").to_numpy(dtype=float)
    xerr, yerr = _std_values(summary, x_metric), _std_values(summary, y_metric)
    if per_trial_data is not None:
        ax.scatter(per_trial_data[x_metric], per_trial_data[y_metric], color="0.6", alpha=0.35, s=12, zorder=0)
    ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt="none", ecolor="0.7", zorder=1)
    if color_col is not None:
        values = _column(summary, color_col, "plot_tradeoff_scatter").to_numpy(dtype=float)
        sc = ax.scatter(x, y, c=values, cmap="viridis", zorder=2, **_marker_style(fill, None))
        ax.figure.colorbar(sc, ax=ax, label=color_col)
    elif group_col is not None:
        groups = _column(summary, group_col, "plot_tradeoff_scatter")
        order = list(group_order) if group_order is not None else list(dict.fromkeys(groups))
        for i, group in enumerate(order):
            mask = (groups == group).to_numpy()
            if mask.any():
                ax.scatter(x[mask], y[mask], label=str(group), zorder=2, **_marker_style(fill, f"C{i % 10}"))
    else:
        ax.scatter(x, y, zorder=2, **_marker_style(fill, "C0"))
    frontier_index = set()
    if show_pareto or label_points == "frontier":
        frontier = pareto_frontier(summary, x_metric, y_metric, maximize_x=maximize_x, maximize_y=maximize_y)
        frontier_index = set(frontier.index)
        if show_pareto:
            plot_pareto_frontier(summary, x_metric, y_metric, maximize_x=maximize_x, maximize_y=maximize_y, ax=ax)
    if label_col is not None:
        labels = _column(summary, label_col, "plot_tradeoff_scatter")
        for position, index in enumerate(summary.index):
            if label_points == "all" or index in frontier_index:
                ax.annotate(
                    str(labels.loc[index]),
                    (x[position], y[position]),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    return _finish_tradeoff(ax, compare, x_metric, y_metric, save_path, color_offset=5)


def _finish_tradeoff(
    ax: Any,
    compare: list[tuple[str, pd.DataFrame]],
    x_metric: str,
    y_metric: str,
    save_path: str | Path | None,
    *,
    color_offset: int,
) -> Any:
    """Star each comparison arm, label the axes, add a legend when there is one, save."""
    for i, (label, frame) in enumerate(compare):
        cx = float(frame[_mean_col(frame, x_metric)].iloc[0])
        cy = float(frame[_mean_col(frame, y_metric)].iloc[0])
        color = f"C{(i + color_offset) % 10}"
        ax.scatter([cx], [cy], marker="*", s=160, color=color, edgecolors="black", label=label, zorder=3)
    ax.set_xlabel(x_metric)
    ax.set_ylabel(y_metric)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    _save(ax.figure, save_path)
    return ax


def _marker_style(fill: bool, color: str | None) -> dict[str, Any]:
    if fill:
        return {"color": color} if color is not None else {}
    return {"facecolors": "none", "edgecolors": color or "C0"}


def plot_tradeoff(
    swept: pd.DataFrame,
    x_metric: str,
    y_metric: str,
    sweep_col: str,
    *,
    compare_to_arms: Sequence[tuple[str, pd.DataFrame]] | None = None,
    cmap: str = "magma",
    show_pareto: bool = True,
    maximize_x: bool = True,
    maximize_y: bool = True,
    annotate: bool = True,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """Trade-off of a one-parameter sweep: points coloured by the swept value, joined in sweep order."""
    compare = _check_compare(compare_to_arms)
    ax = _axes(ax)
    ordered = swept.sort_values(sweep_col, kind="stable")
    x = ordered[_mean_col(ordered, x_metric)].to_numpy(dtype=float)
    y = ordered[_mean_col(ordered, y_metric)].to_numpy(dtype=float)
    values = pd.to_numeric(_column(ordered, sweep_col, "plot_tradeoff"), errors="coerce").to_numpy(dtype=float)
    ax.plot(x, y, color="0.75", linewidth=1, zorder=1)
    sc = ax.scatter(x, y, c=values, cmap=cmap, zorder=2, edgecolors="black", linewidths=0.5)
    ax.figure.colorbar(sc, ax=ax, label=sweep_col)
    if annotate:
        for xi, yi, vi in zip(x, y, ordered[sweep_col], strict=True):
            ax.annotate(str(vi), (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if show_pareto:
        plot_pareto_frontier(ordered, x_metric, y_metric, maximize_x=maximize_x, maximize_y=maximize_y, ax=ax)
    return _finish_tradeoff(ax, compare, x_metric, y_metric, save_path, color_offset=0)


def plot_sensitivity(
    swept: pd.DataFrame,
    metric: str,
    sweep_col: str,
    compare_to_arms: Sequence[tuple[str, pd.DataFrame]] | None = None,
    per_trial_data: pd.DataFrame | None = None,
    *,
    ylabel: str | None = None,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """`metric` against the swept parameter (mean line, +/- std band), with reference configurations as lines."""
    compare = _check_compare(compare_to_arms)
    ax = _axes(ax)
    ordered = swept.sort_values(sweep_col, kind="stable")
    sweep = pd.to_numeric(_column(ordered, sweep_col, "plot_sensitivity"), errors="coerce").to_numpy(dtype=float)
    mean = ordered[_mean_col(ordered, metric)].to_numpy(dtype=float)
    std = _std_values(ordered, metric)
    ax.plot(sweep, mean, marker="o", color="C0", label=metric)
    if std is not None:
        ax.fill_between(sweep, mean - std, mean + std, color="C0", alpha=0.2)
    if per_trial_data is not None:
        ax.scatter(per_trial_data[sweep_col], per_trial_data[metric], color="C0", alpha=0.3, s=10)
    for i, (label, frame) in enumerate(compare):
        value = float(frame[_mean_col(frame, metric)].iloc[0])
        ax.axhline(value, linestyle="--", linewidth=1, color=f"C{(i + 1) % 10}", label=label)
        ref_std = _std_values(frame, metric)
        if ref_std is not None and ref_std[0] > 0:
            ax.axhspan(value - ref_std[0], value + ref_std[0], color=f"C{(i + 1) % 10}", alpha=0.1)
    ax.set_xlabel(sweep_col)
    ax.set_ylabel(ylabel or metric)
    ax.legend()
    _save(ax.figure, save_path)
    return ax


def create_tradeoff_figure(
    summary: pd.DataFrame,
    x_metric: str,
    y_metric: str,
    sweep_col: str,
    baseline_arm: str = "baseline",
    figsize: tuple[float, float] = (12, 4),
    *,
    save_path: str | Path | None = None,
) -> Any:
    """Three panels: x sensitivity, y sensitivity and the trade-off, with the baseline as the reference.

    Rows with `arm == baseline_arm` are the reference; the others are the sweep. Returns the Figure.
    """
    is_base = _column(summary, "arm", "create_tradeoff_figure") == baseline_arm
    reference = summary[is_base]
    swept = summary[~is_base]
    compare = [(baseline_arm, reference)] if not reference.empty else None
    fig, axes = _pyplot().subplots(1, 3, figsize=figsize)
    plot_sensitivity(swept, x_metric, sweep_col, compare_to_arms=compare, ax=axes[0])
    plot_sensitivity(swept, y_metric, sweep_col, compare_to_arms=compare, ax=axes[1])
    plot_tradeoff(swept, x_metric, y_metric, sweep_col, compare_to_arms=compare, ax=axes[2])
    fig.tight_layout()
    _save(fig, save_path)
    return fig


# ---------------------------------------------------------------------------------------------- bars and heatmap
def plot_comparison_bars(
    df: pd.DataFrame,
    metric_cols: Sequence[str],
    group_col: str,
    ylabel: str = "Value",
    bar_width: float = 0.35,
    *,
    title: str | None = None,
    error_label: str = "std",
    annotate: bool = True,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """Grouped bars: one group per `group_col` value, one bar per metric (`{metric}_std` error bars when present,
    named `error_label` in the legend), each bar's value printed. When every value lies in [0, 1] (accuracies,
    shares) the axis is exactly [0, 1], so an all-zero run shows its zeros instead of an empty frame."""
    metric_cols = list(metric_cols)
    if not metric_cols:
        raise ValueError("plot_comparison_bars needs at least one metric column.")
    ax = _axes(ax)
    groups = _column(df, group_col, "plot_comparison_bars").astype(str).tolist()
    positions = np.arange(len(groups))
    offsets = (np.arange(len(metric_cols)) - (len(metric_cols) - 1) / 2) * bar_width
    shown = []
    for i, metric in enumerate(metric_cols):
        values = _column(df, _mean_col(df, metric), "plot_comparison_bars").to_numpy(dtype=float)
        errors = _std_values(df, metric)
        bars = ax.bar(positions + offsets[i], values, bar_width, yerr=errors, capsize=3, label=metric)
        if annotate:
            ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], padding=2, fontsize=7)
        shown.append(values)
    finite = np.concatenate(shown)[np.isfinite(np.concatenate(shown))] if shown else np.array([])
    if finite.size and finite.min() >= 0.0 and finite.max() <= 1.0:
        ax.set_ylim(0.0, 1.0)
    ax.set_xticks(positions)
    ax.set_xticklabels(groups, rotation=30, ha="right")
    ax.set_ylabel(ylabel + (f" (bars: ± {error_label})" if any(_std_values(df, m) is not None for m in metric_cols)
                            else ""))  # fmt: skip
    if title:
        ax.set_title(title)
    ax.legend()
    _save(ax.figure, save_path)
    return ax


def _require_seaborn() -> Any:
    try:
        import seaborn
    except ImportError as error:
        raise ImportError(
            "plot_metric_heatmap needs seaborn: pip install 'steer_hydra[plots]' (or pip install seaborn)."
        ) from error
    return seaborn


def plot_metric_heatmap(
    pivot_df: pd.DataFrame,
    annot: bool = True,
    fmt: str = ".2f",
    cmap: str = "RdYlGn",
    col_label_decimals: int = 2,
    *,
    title: str | None = None,
    ax: Any = None,
    save_path: str | Path | None = None,
) -> Any:
    """A heatmap of a pivot table (e.g. metric by two swept parameters); float column labels are rounded."""
    sns = _require_seaborn()
    ax = _axes(ax)
    frame = pivot_df.copy()
    frame.columns = [round(c, col_label_decimals) if isinstance(c, (float, np.floating)) else c for c in frame.columns]
    sns.heatmap(frame.astype(float), annot=annot, fmt=fmt, cmap=cmap, ax=ax)
    if title:
        ax.set_title(title)
    _save(ax.figure, save_path)
    return ax
