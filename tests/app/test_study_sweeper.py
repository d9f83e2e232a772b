"""The study sweeper end to end on the tiny model: per concept, dev jobs only before the choice, the choice from
dev rows only over a strength x layer grid, then every arm at its method's chosen point on test and the cost
suites; test logs exist only for chosen points; the report over concepts; the report written again from its files."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from app_helpers import FAST

from steer_hydra.app.callbacks import SweepProgress
from steer_hydra.core.files import write_json
from steer_hydra.study import LAUNCHED_FILE, PLANNED_FILE
from steer_hydra.study.__main__ import main as study_main


def test_a_studys_progress_counts_over_its_whole_plan_by_phase(tmp_path):
    progress = SweepProgress(total=1, sweep_dir=tmp_path)  # Hydra's split of a study's command line: no total
    write_json(tmp_path / PLANNED_FILE, {"dev": 3, "report": 2})  # the study sweeper, before its first job
    write_json(tmp_path / LAUNCHED_FILE, [["arm=baseline"]] * 3)  # only the dev batch is launched yet
    lines = [progress.job_done() for _ in range(5)]
    assert [line.split(" in ")[0] for line in lines] == [
        "Sweep: 1/5 job(s) done (dev 1/3)",
        "Sweep: 2/5 job(s) done (dev 2/3)",
        "Sweep: 3/5 job(s) done (dev 3/3)",
        "Sweep: 4/5 job(s) done (report 1/2)",
        "Sweep: 5/5 job(s) done (report 2/2)",
    ]
    assert "left" in lines[0] and "left" not in lines[-1]
    plain = SweepProgress(total=2, sweep_dir=tmp_path / "plain")  # any other sweep: no phase
    assert plain.job_done().startswith("Sweep: 1/2 job(s) done in ")


@pytest.mark.slow
def test_the_study_runs_in_one_command_and_only_chosen_points_see_test(run_app, tmp_path, capsys):
    proc = run_app(
        "--multirun",
        "experiment=concept_steering",
        "arm=baseline,caa_concept_random",  # the method itself is chosen on dev, not reported
        "strength=0.5",
        "hydra.sweeper.layers=[0,1]",
        "concept=weddings,joy",
        "logger=none",
        *FAST,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "Sweep: 6/14 job(s) done (dev 6/6)" in console  # the whole study's jobs, counted before the first
    assert "Sweep: 14/14 job(s) done (report 8/8)" in console
    # a quiet end: the study's report, then the aggregate's folder in one line, not its table of every dev point
    end = console[console.rindex("Study over concepts") :]
    assert "job(s), every configuration vs the baseline in" in end and "caa_concept@" not in end
    (baseline_line,) = [line for line in console.splitlines() if line.startswith("baseline (2 concepts)")]
    assert "win rate" not in baseline_line  # the baseline steers nothing: no win rate
    assert console.count("not held by both sides") <= 2
    (sweep,) = (tmp_path / "outputs" / "concept_steering" / "multiruns").iterdir()
    assert len(json.loads((sweep / LAUNCHED_FILE).read_text())) == 14
    assert json.loads((sweep / PLANNED_FILE).read_text()) == {"dev": 6, "report": 8}
    study = sweep / "study"
    launched = pd.read_csv(study / "launched.csv")
    assert launched["stage"].tolist() == ["dev"] * 6 + ["test", "test", "cost", "cost"] * 2  # all dev jobs first
    assert set(launched.loc[launched["stage"] == "dev", "suite"]) == {"concept_steering_dev_weddings",
                                                                      "concept_steering_dev_joy"}  # fmt: skip

    selection = pd.read_csv(study / "selection.csv")
    caa = selection[selection["arm_name"] == "caa_concept"]
    assert len(caa) == 4 and caa.groupby("concept")["chosen"].sum().tolist() == [1, 1]  # 2 points per concept
    chosen = caa[caa["chosen"]].set_index("concept")["point"]
    followers = selection[selection["arm_name"] == "caa_concept_random"].set_index("concept")["point"]
    assert followers.sort_index().tolist() == chosen.sort_index().tolist()  # the sanity arm takes CAA's point

    # the test split was generated only at the chosen points: a point not chosen never reached it
    reported = launched[(launched["stage"] == "test") & (launched["arm_name"] == "caa_concept_random")]
    assert dict(zip(reported["concept"], reported["point"], strict=True)) == chosen.to_dict()
    save_dir = tmp_path / "outputs" / "concept_steering" / "tiny" / "seed_0"
    on_test = {p.parts[-3] for p in (save_dir / "inspect_logs").glob("*/trial_0/concept_steering_test_*")}
    assert on_test == set(launched.loc[launched["stage"] == "test", "config_id"])
    dev_points = launched[(launched["stage"] == "dev") & (launched["arm_name"] != "baseline")]
    assert dev_points["config_id"].nunique() == 4 and not set(dev_points["config_id"]) & on_test

    summary = pd.read_csv(study / "study_summary.csv")
    assert set(summary["arm_name"]) == {"baseline", "caa_concept_random"} and (summary["n_concepts"] == 2).all()
    record = json.loads((study / "selection.json").read_text())
    for concept in ("weddings", "joy"):
        assert not set(record["dev_sample_ids"][concept]) & set(record["test_sample_ids"][concept])
    costs = pd.read_csv(study / "costs_summary.csv")
    assert set(costs["task"]) == {"steer_hydra/short_answer", "steer_hydra/arithmetic", "steer_hydra/mcqa"}
    assert (study / "pareto.png").stat().st_size > 0 and (study / "study_deltas.png").stat().st_size > 0
    curves = pd.read_csv(study / "strength_curves.csv")  # CAA's dev points: 2 layers (separate lines), 1 strength
    assert set(curves["arm_name"]) == {"caa_concept"} and set(curves["concept"]) == {"weddings", "joy", "all"}
    assert len(curves) == 3 * 2 and (study / "strength_curves.png").stat().st_size > 0
    page = (study / "index.html").read_text()
    assert '<img src="strength_curves.png"' in page and "inspect view bundle --log-dir" in page
    assert json.loads((sweep / "aggregate" / "missing_cells.json").read_text()) == []

    # the report again from the study's files: the same numbers, nothing generated
    before = {name: (study / name).read_bytes() for name in ("selection.csv", "study_summary.csv", "costs_summary.csv")}
    study_main([str(study)])
    assert "caa_concept_random (2 concepts)" in capsys.readouterr().out
    assert {name: (study / name).read_bytes() for name in before} == before
