"""The newest output and input controls through the Hydra app: one sweep on the tiny model runs each control's arm
beside the baseline (UserPrefix, PhasedDecoding, RoutedDecoding, SearchDecoding, ValueGuidance, SASA,
ContrastiveGuidance and its DExperts and proxy-tuning configurations); every arm changes some completion against the
baseline's, the forced text of the phased arms is in their completions, and the results table names every arm with
its config id. Each also joins a concept study as an arm evaluated once, at no grid point."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from app_helpers import SMALL, check_arms_beside_baseline, sweep_dir, write_arms
from hydra.utils import instantiate

from steer_hydra.app.plan import JobPlan, to_plain
from steer_hydra.study.plan import StudyPlan

EXPERT = "steer_hydra:tiny?seed=1&hidden_size=32"
ANTI = "steer_hydra:tiny?seed=2&hidden_size=32"
# arm name -> (control option, overrides of its arguments on the tiny model, the control class it builds)
ARMS = {
    "user_prefix": ("user_prefix", "{}", "UserPrefix"),
    "phased": ("phased_decoding", "{}", "PhasedDecoding"),
    "routed": ("routed_decoding", "{default_route: short}", "RoutedDecoding"),
    "search": ("search_decoding", "{rounds: 2, segment_len: 4, max_rollouts: 6}", "SearchDecoding"),
    "value": ("value_guidance", "{value_model: 'steer_hydra:tiny-reward', beta: 5.0}", "ValueGuidance"),
    "sasa": ("sasa", "{beta: 5.0}", "SASA"),
    "contrastive": ("contrastive_guidance", f"{{models: ['{EXPERT}'], weights: [-1.0]}}", "ContrastiveGuidance"),
    "dexperts": ("dexperts", f"{{expert: '{EXPERT}', anti_expert: '{ANTI}', alpha: 4.0}}", "DExperts"),
    "proxy": ("proxy_tuning", f"{{expert: '{EXPERT}', anti_expert: '{ANTI}', alpha: 4.0}}", "ProxyTuning"),
}


def _arm_files(root: Path) -> str:
    """Write each arm of ARMS as a user arm file under `root/user_conf/arm`; returns the search-path override."""
    arms = {
        name: f"defaults:\n  - /control@controls.c: {option}\ncontrols:\n  c: {args}"
        for name, (option, args, _) in ARMS.items()
    }
    return write_arms(root, arms)


@pytest.mark.slow
def test_each_new_control_runs_beside_the_baseline_in_one_sweep(run_main, tmp_path):
    search = _arm_files(tmp_path)
    code, out, err = run_main("--multirun", "model=tiny", search, f"arm=baseline,{','.join(ARMS)}", *SMALL)
    assert code == 0, err[-3000:]
    sweep = sweep_dir(tmp_path)
    ids, _ = check_arms_beside_baseline(sweep, list(ARMS), out)
    assert ids["baseline"] == "baseline" and len({ids[arm] for arm in ARMS}) == len(ARMS)
    samples = pd.read_csv(sweep / "aggregate" / "samples.csv")
    for arm in ("phased", "routed"):  # the forced text is in every completion of the phased plans
        completions = samples.loc[samples["arm"] == arm, "completion"].fillna("")
        assert completions.str.startswith("Answer:").all(), arm


def test_each_new_control_joins_the_concept_study_as_an_arm_run_once_at_no_grid_point(study, tmp_path):
    searchpath = _arm_files(tmp_path)
    cfg = study(searchpath, return_hydra_config=True)
    plan = StudyPlan(**to_plain(instantiate(cfg.hydra.sweeper).spec))
    plan.take_arguments([f"arm=baseline,caa_concept,{','.join(ARMS)}"])
    assert plan.methods() == ["caa_concept"]  # no strength or alpha axis: not methods, no dev jobs
    assert {job.arm_name for job in plan.dev_jobs([])} == {"baseline", "caa_concept"}
    report = plan.report_jobs([], {("weddings", "caa_concept"): plan.grid("caa_concept")[0]})
    points = {(job.arm_name, job.stage): job.point.label for job in report}
    assert all(points[(arm, "test")] == "-" for arm in ARMS)
    for arm, (_, _, cls) in ARMS.items():
        job = JobPlan.from_config(study(f"arm={arm}", searchpath))
        assert [type(c).__name__ for c in job.controls] == [cls], arm
