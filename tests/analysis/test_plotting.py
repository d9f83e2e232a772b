"""Plots: every function renders on Agg under warnings-as-errors and writes its PNG; Pareto frontier; checks."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from steer_hydra.analysis import plotting  # noqa: E402

pytestmark = pytest.mark.filterwarnings("error")

SUMMARY = pd.DataFrame(
    {
        "arm": ["baseline", "pasta", "pasta", "pasta"],
        "config_id": ["baseline", "c1", "c2", "c3"],
        "alpha": [float("nan"), 0.01, 0.1, 1.0],
        "target_mean": [0.40, 0.70, 0.60, 0.45],
        "target_std": [0.05, 0.04, 0.02, 0.03],
        "capability_mean": [0.80, 0.50, 0.75, 0.70],
        "capability_std": [0.02, 0.05, 0.01, 0.02],
        "n_trials": [2, 2, 2, 2],
    }
)
PER_TRIAL = pd.DataFrame(
    {
        "config_id": ["c1", "c1", "c2", "c2"],
        "alpha": [0.01, 0.01, 0.1, 0.1],
        "target": [0.66, 0.74, 0.58, 0.62],
        "capability": [0.45, 0.55, 0.74, 0.76],
    }
)
DELTAS = pd.DataFrame(
    {
        "arm": ["pasta", "pasta"],
        "config_id": ["c1", "c1"],
        "task": ["t1", "t2"],
        "metric": ["acc", "acc"],
        "delta": [0.1, -0.2],
        "ci_low": [0.02, -0.3],
        "ci_high": [0.2, -0.1],
        "confidence": [0.95, 0.95],
    }
)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _written(path):
    assert path.exists() and path.stat().st_size > 0 and path.read_bytes()[:4] == b"\x89PNG"
    return True


def test_every_plot_renders_and_writes_its_png(tmp_path):
    plotting.apply_plot_style()
    swept = SUMMARY[SUMMARY.arm == "pasta"]
    base = SUMMARY[SUMMARY.arm == "baseline"]
    calls = {
        "metric_by_config": lambda p: plotting.plot_metric_by_config(
            SUMMARY, "target", baseline_value=0.4, baseline_std=0.05, save_path=p
        ),
        "tradeoff_scatter": lambda p: plotting.plot_tradeoff_scatter(
            SUMMARY,
            "capability",
            "target",
            group_col="arm",
            label_col="config_id",
            label_points="frontier",
            compare_to_arms=[("baseline", base)],
            per_trial_data=PER_TRIAL,
            show_pareto=True,
            fill=False,
            save_path=p,
        ),
        "tradeoff_scatter_color": lambda p: plotting.plot_tradeoff_scatter(
            swept, "capability", "target", color_col="alpha", label_col="config_id", save_path=p
        ),
        "heatmap": lambda p: plotting.plot_metric_heatmap(
            pd.DataFrame([[0.1, 0.2], [0.3, 0.4]], index=[1, 2], columns=[0.123, 0.456]), save_path=p
        ),
        "comparison_bars": lambda p: plotting.plot_comparison_bars(
            SUMMARY, ["target", "capability"], "config_id", save_path=p
        ),
        "sensitivity": lambda p: plotting.plot_sensitivity(
            swept, "target", "alpha", compare_to_arms=[("baseline", base)], per_trial_data=PER_TRIAL, save_path=p
        ),
        "tradeoff": lambda p: plotting.plot_tradeoff(
            swept, "capability", "target", "alpha", compare_to_arms=[("baseline", base)], save_path=p
        ),
        "pareto_frontier": lambda p: plotting.plot_pareto_frontier(SUMMARY, "capability", "target", save_path=p),
        "paired_deltas": lambda p: plotting.plot_paired_deltas(DELTAS, save_path=p),
    }
    for name, call in calls.items():
        path = tmp_path / "plots" / f"{name}.png"
        result = call(path)
        assert _written(path), name
        axes = result[0] if isinstance(result, tuple) else result
        assert hasattr(axes, "figure"), name
    fig = plotting.create_tradeoff_figure(SUMMARY, "capability", "target", "alpha", save_path=tmp_path / "figure.png")
    assert _written(tmp_path / "figure.png")
    assert len([ax for ax in fig.axes if ax.get_label() != "<colorbar>"]) == 3


def test_plots_draw_into_a_given_axes():
    fig, ax = plt.subplots()
    assert plotting.plot_metric_by_config(SUMMARY, "target", ax=ax) is ax
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "c1", "c2", "c3"]


def test_compare_frames_must_hold_one_configuration():
    two = SUMMARY.iloc[:2]
    for call in (
        lambda: plotting.plot_tradeoff_scatter(SUMMARY, "capability", "target", compare_to_arms=[("x", two)]),
        lambda: plotting.plot_sensitivity(SUMMARY, "target", "alpha", compare_to_arms=[("x", two)]),
        lambda: plotting.plot_tradeoff(SUMMARY, "capability", "target", "alpha", compare_to_arms=[("x", two)]),
    ):
        with pytest.raises(ValueError, match="configurations"):
            call()


def test_pareto_frontier_is_the_non_dominated_means_sorted_by_x():
    frontier = plotting.pareto_frontier(SUMMARY, "capability", "target")
    # (cap, target): baseline (.80,.40), c1 (.50,.70), c2 (.75,.60), c3 (.70,.45) -> c3 is dominated by c2
    assert frontier["config_id"].tolist() == ["c1", "c2", "baseline"]
    flipped = plotting.pareto_frontier(SUMMARY, "capability", "target", maximize_y=False)
    # maximize capability, minimize target: baseline (.80,.40) dominates every other point
    assert flipped["config_id"].tolist() == ["baseline"]
    _, points = plotting.plot_pareto_frontier(SUMMARY, "capability", "target", maximize_x=False)
    # minimize capability, maximize target: c1 (.50,.70) dominates the rest
    assert points["config_id"].tolist() == ["c1"]


def test_tradeoff_figure_splits_baseline_from_the_sweep():
    fig = plotting.create_tradeoff_figure(SUMMARY, "capability", "target", "alpha")
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert [ax.get_xlabel() for ax in panels] == ["alpha", "alpha", "capability"]
    sensitivity = panels[0]
    assert len(sensitivity.lines[0].get_xdata()) == 3  # the three swept rows, baseline excluded
    assert "baseline" in [t.get_text() for t in sensitivity.get_legend().get_texts()]


def test_heatmap_rounds_float_column_labels_and_needs_seaborn(monkeypatch):
    pivot = pd.DataFrame([[0.1, 0.2]], index=["a"], columns=[0.123456, 1.98765])
    ax = plotting.plot_metric_heatmap(pivot, col_label_decimals=1)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0.1", "2.0"]
    import builtins

    real_import = builtins.__import__

    def no_seaborn(name, *args, **kwargs):
        if name == "seaborn":
            raise ImportError("No module named 'seaborn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_seaborn)
    with pytest.raises(ImportError, match=r"plots"):
        plotting.plot_metric_heatmap(pivot)


def test_paired_deltas_plot_marks_significant_rows():
    ax = plotting.plot_paired_deltas(DELTAS)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["pasta | t1 | acc", "pasta | t2 | acc"]
    colors = ax.collections[-1].get_facecolors()
    assert colors.shape[0] == 2 and not (colors[0] == colors[1]).all()  # above and below zero differ
    assert "95% CI" in ax.get_xlabel()


def test_an_all_zero_run_reads_values_on_a_unit_axis_and_deltas_on_a_visible_span():
    zeros = pd.DataFrame({"task": ["mcqa", "short_answer"], "base_mean": [0.0, 0.0], "base_std": [0.0, 0.0]})
    ax = plotting.plot_comparison_bars(zeros, ["base"], group_col="task", title="suite smoke · n=4")
    assert ax.get_ylim() == (0.0, 1.0)
    assert [t.get_text() for t in ax.texts] == ["0.00", "0.00"] and ax.get_title() == "suite smoke · n=4"
    plt.close("all")
    flat = DELTAS.assign(delta=0.0, ci_low=0.0, ci_high=0.0, n=4)
    ax = plotting.plot_paired_deltas(flat)
    low, high = ax.get_xlim()
    assert high - low >= 0.2 and low < 0 < high
    assert all("(n=4)" in t.get_text() for t in ax.get_yticklabels())
    plt.close("all")


def test_values_outside_unit_range_keep_their_own_axis():
    counts = pd.DataFrame({"task": ["a"], "base_mean": [3.0]})
    ax = plotting.plot_comparison_bars(counts, ["base"], group_col="task")
    assert ax.get_ylim()[1] > 3.0
    plt.close("all")
