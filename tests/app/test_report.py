"""The results table (terminal and W&B), the one W&B key grammar, and job vs sweep runs logging the same keys."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from app_helpers import FAST, read_run

from steer_hydra.analysis.table import delta_rows, results_table
from steer_hydra.app import job as job_module
from steer_hydra.app.callbacks import aggregate_sweep_dir
from steer_hydra.app.report import render
from steer_hydra.app.tracking import wandb_key


def _results(arm: str, config_id: str, accuracy: float, stderr: float, n: int = 4) -> list[dict]:
    common = {"arm": arm, "config_id": config_id, "suite": "smoke", "task": "steer_hydra/mcqa", "scorer": "acc"}
    return [
        {**common, "metric": "accuracy", "value": accuracy, "n": n},
        {**common, "metric": "stderr", "value": stderr, "n": n},
    ]


def test_wandb_key_is_the_one_grammar():
    assert wandb_key(None, "smoke", "steer_hydra/mcqa", "acc", "accuracy") == "smoke/steer_hydra.mcqa/acc/accuracy"
    assert wandb_key("delta_ci_low", "s", "t", "sc", "m") == "delta_ci_low/s/t/sc/m"
    assert wandb_key("plots", "paired_deltas") == "plots/paired_deltas"
    with pytest.raises(ValueError, match="section"):
        wandb_key("deltas", "x")


def test_results_table_puts_baseline_first_and_the_delta_on_the_metric_it_moves():
    results = pd.DataFrame(_results("pasta", "p1", 0.75, 0.2) + _results("baseline", "baseline", 0.25, 0.1))
    deltas = pd.DataFrame(
        [
            {
                "arm": "pasta",
                "config_id": "p1",
                "suite": "smoke",
                "task": "steer_hydra/mcqa",
                "metric": "acc",
                "n": 4,
                "delta": 0.5,
                "ci_low": 0.1,
                "ci_high": 0.9,
                "changed": 0.75,
            }
        ]
    )
    located = delta_rows(deltas, results)
    assert located[["scorer", "metric"]].values.tolist() == [["acc", "accuracy"]]
    table = results_table(results, deltas, "baseline")
    assert table["arm"].tolist() == ["baseline", "pasta"]
    assert table["value"].tolist() == [0.25, 0.75] and table["stderr"].tolist() == [0.1, 0.2]
    assert math.isnan(table.loc[0, "delta"]) and table.loc[1, "delta"] == 0.5 and table.loc[1, "changed"] == 0.75
    text = render(table, title="pasta vs baseline")
    pasta_line = next(line for line in text.splitlines() if " pasta " in line)
    for shown in ("0.750", "0.200", "+0.500", "[+0.10, +0.90]", "75%"):
        assert shown in pasta_line, (shown, pasta_line)
    assert "Δ vs baseline" in text and "95% CI" in text and "Changed" in text


def test_an_all_equal_table_still_renders_every_row():
    results = pd.DataFrame(_results("baseline", "baseline", 0.0, 0.0) + _results("pasta", "p1", 0.0, 0.0))
    text = render(results_table(results, pd.DataFrame(), "baseline"), title="t")
    assert text.count("steer_hydra/mcqa") == 2


def _summary_of(run_dir):
    (run,) = run_dir.glob("wandb/offline-run-*")
    return read_run(next(run.glob("run-*.wandb")))


@pytest.mark.slow
def test_job_prints_the_table_and_job_and_sweep_runs_log_the_same_keys(compose_cfg, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    common = [*FAST, f"output_root={tmp_path}", "logger.log_artifact=false", "logger.log_samples=false"]
    job_module.run_job(compose_cfg([*common, "arm=baseline"]), tmp_path / "0_base")
    capsys.readouterr()
    job_module.run_job(compose_cfg([*common, "arm=pasta"]), tmp_path / "1_pasta")
    out = capsys.readouterr().out

    # the table: every task of the suite, for both arms, with the delta column filled for pasta
    tasks = ["steer_hydra/short_answer", "steer_hydra/mcqa", "steer_hydra/instruction_following"]
    assert "Δ vs baseline" in out and "95% CI" in out
    for task in tasks:
        rows = [line for line in out.splitlines() if line.strip().startswith(task)]
        assert len(rows) == 2, (task, out)
        assert any(" pasta " in r and ("+" in r.split(" pasta ")[1] or "-" in r.split(" pasta ")[1]) for r in rows)
    record = json.loads((tmp_path / "1_pasta" / "job_record.json").read_text())
    assert f"inspect view --log-dir {tmp_path}/default/tiny/seed_0/inspect_logs/{record['config_id']}" in out
    assert "results.csv" in out and "paired_deltas.csv" in out and "wandb sync" in out

    # self-describing Inspect logs: arm, config_id, controls and a readable model name in every header
    from inspect_ai.log import list_eval_logs, read_eval_log

    cid = record["config_id"]
    headers = [read_eval_log(info, header_only=True) for info in list_eval_logs(str(tmp_path / "default"))]
    pasta = [h for h in headers if h.eval.metadata and h.eval.metadata.get("config_id") == cid]
    assert len(pasta) == len(tasks)
    for header in pasta:
        assert header.eval.model == f"steer_hydra/pasta@{cid[:6]}" and "pasta" in header.eval.tags
        assert header.eval.metadata["arm"] == "pasta" and header.eval.metadata["experiment"] == "default"
        assert "PASTA" in json.dumps(header.eval.metadata["controls"]) and header.eval.metadata["model"] == "tiny"

    # W&B: the job run's keys, config and the link to the sweep
    config, job_summary = _summary_of(tmp_path / "1_pasta")
    assert config["config_id"] == record["config_id"] and "overrides" in config and "sweep_id" in config
    job_keys = {k for k in job_summary if k.startswith(("smoke/", "delta"))}
    for task in tasks:
        base = task.replace("/", ".")
        assert any(k.startswith(f"delta/smoke/{base}/") for k in job_keys), task
        assert any(k.startswith(f"delta_ci_low/smoke/{base}/") for k in job_keys), task

    # the sweep summary run of the same configuration logs the same keys
    sweep_cfg = compose_cfg([*common, "arm=pasta", f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    aggregate_sweep_dir(tmp_path, sweep_cfg)
    out = capsys.readouterr().out
    assert "Sweep" in out and all(task in out for task in tasks)
    sweep_config, sweep_summary = _summary_of(tmp_path / "aggregate" / f"tiny-{record['config_id']}")
    sweep_keys = {k for k in sweep_summary if k.startswith(("smoke/", "delta"))}
    assert sweep_keys == job_keys
    metric = wandb_key("delta", "smoke", "steer_hydra/mcqa", "letter_or_option", "accuracy")
    assert sweep_summary[metric] == pytest.approx(job_summary[metric])  # one seed: the pooled delta is the job's
    assert sweep_config["config_id"] == record["config_id"]
    assert sorted(sweep_summary["job_run_ids"]) == sorted(
        json.loads((tmp_path / d / "job_record.json").read_text())["wandb_run_id"] for d in ("0_base", "1_pasta")
    )


def test_a_sweep_in_one_process_logs_jobs_done_out_of_total(caplog, tmp_path):
    import logging

    from steer_hydra.app.callbacks import SweepAggregator, SweepProgress

    aggregator = SweepAggregator()
    aggregator._progress = SweepProgress(total=4, sweep_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="steer_hydra.app.callbacks"):
        aggregator.on_job_end(None, None)
        aggregator.on_job_end(None, None)
    assert "Sweep: 1/4 job(s) done" in caplog.text and "Sweep: 2/4 job(s) done" in caplog.text
    assert "left" in caplog.text


@pytest.mark.slow
def test_a_job_on_a_non_tty_prints_the_table_and_few_other_lines(run_app):
    proc = run_app(*FAST, "arm=pasta")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    table = [line for line in lines if line.strip().startswith(("steer_hydra/", "Task ", "───"))]
    assert len(table) == 2 + 3  # header, rule, one row per task (no baseline in this save_dir yet)
    assert len(lines) - len(table) <= 30, "\n".join(lines)
    text = "\n".join(lines)
    assert "wandb:" not in text and "Loading weights" not in text and "samples:" not in text  # no banners, no bars
    assert text.count("PASTA got no substrings") == 1 and "backend.py" not in text  # once, without a source line


def test_job_plots_name_suite_model_and_n(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from steer_hydra.analysis import compare as results_module

    monkeypatch.setattr(results_module, "_close_figures", lambda: None)  # keep the figure open to read it back
    results = pd.DataFrame(_results("baseline", "baseline", 0.25, 0.1) + _results("pasta", "p1", 0.75, 0.2))
    paths = results_module.plot_comparison(results.assign(model="tiny"), pd.DataFrame(), tmp_path)
    ax = plt.gcf().axes[0]
    title, ylim, values = ax.get_title(), ax.get_ylim(), sorted(t.get_text() for t in ax.texts)
    plt.close("all")
    assert paths["metrics"].stat().st_size > 1000
    assert title == "suite smoke · model tiny · n=4 per task"
    assert ylim == (0.0, 1.0) and values == ["0.25", "0.75"] and "stderr" in ax.get_ylabel()
