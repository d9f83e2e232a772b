"""The job table, the sweep aggregate and the study report give the same numbers for the same cells: one statistics
module behind all three, with two sampled trials per arm that sometimes agree with the baseline and sometimes not."""

from __future__ import annotations

import pandas as pd
import pytest
from app_helpers import FAST

from steer_hydra.analysis.compare import numeric_score_columns
from steer_hydra.app import job as job_module
from steer_hydra.app.callbacks import aggregate_sweep_dir
from steer_hydra.core.files import read_json
from steer_hydra.study.plan import AXES
from steer_hydra.study.report import LAUNCHED_KEYS, per_concept_deltas, study_frame

KEYS = ["task", "metric"]
NUMBERS = ["n", "baseline_mean", "arm_mean", "delta", "ci_low", "ci_high", "changed"]


@pytest.mark.slow
def test_job_sweep_and_study_report_the_same_deltas_with_two_trials(compose_cfg, tmp_path):
    sampled = ["provider=sampling", "generate_defaults.temperature=0.5", "num_trials=2", "suite.limit=6"]
    common = [*FAST, *sampled, f"output_root={tmp_path}", "logger=none", "suite.generate_overrides.max_tokens=1"]
    job_module.run_job(compose_cfg([*common, "arm=baseline"]), tmp_path / "0_base")
    job_module.run_job(compose_cfg([*common, "arm=pasta"]), tmp_path / "1_arm")

    job = pd.read_csv(tmp_path / "1_arm" / "paired_deltas.csv")
    sweep_cfg = compose_cfg([*common, "arm=pasta", f"hydra.sweep.dir={tmp_path}"], return_hydra_config=True)
    sweep = aggregate_sweep_dir(tmp_path, sweep_cfg, track=False)["comparison"].deltas
    save_dir = tmp_path / "default" / "tiny" / "seed_0"
    records = [read_json(tmp_path / job / "job_record.json") for job in ("0_base", "1_arm")]
    launched = pd.DataFrame(
        [{"job": i, "stage": "cost", "concept": "-", "arm_name": r["arm_name"], "point": "-", **dict.fromkeys(AXES),
          "config_id": r["config_id"], "suite": r["suite"]}
         for i, r in enumerate(records)]
    )  # fmt: skip
    frame = study_frame(save_dir, launched)
    study = per_concept_deltas(frame, numeric_score_columns(frame, labels=LAUNCHED_KEYS))  # the one rule
    study = study[study["arm_name"] != "baseline"]

    assert (job["n_trials"] == 2).all() and (job["n"] == 6).all() and len(job) == 3
    # one-token completions at a moderate temperature (each request seeded by its content, so the draws are fixed):
    # some sample changed in one trial and not the other (its share is a half), where "changed in any trial" and
    # "the share of trials" disagree
    assert ((job["changed"] * job["n"]) % 1 != 0).any(), job["changed"].tolist()
    expected = job.set_index(KEYS)[NUMBERS].sort_index()
    for name, other in (("sweep", sweep), ("study", study)):
        got = other.set_index(KEYS)[NUMBERS].sort_index()
        pd.testing.assert_frame_equal(got, expected, check_dtype=False, obj=f"{name} vs job")
