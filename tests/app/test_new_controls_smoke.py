"""Smoke sweeps of the newest controls through the app: each arm beside the baseline, in one process.

DirectionalAblation runs on SmolLM2 (its shipped arm fits the direction from contrastive pairs); ContrastiveDecoding
on the tiny model with a tiny amateur of another seed and width (the tiny tokenizer): each sweep's completions must
change against the baseline on some sample, and its results table must name both arms with their config ids.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from app_helpers import job_records, sweep_dir

SMALL = ["suite.limit=1", "suite.generate_overrides.max_tokens=8", "logger=none", "progress=false"]
AMATEUR = "steer_hydra:tiny?seed=1&hidden_size=32"


def _check(folder: Path, arm: str, out: str) -> str:
    """The arm changed some completion against the baseline's on the same sample, and the results table (the file and
    the printed one) names both arms, the file with their config ids; returns the arm's config id."""
    samples = pd.read_csv(folder / "samples.csv")
    keys = ["task", "sample_id", "trial_id"]
    base = samples[samples["arm"] == "baseline"].drop_duplicates(keys).set_index(keys)["completion"]
    steered = samples[samples["arm"] == arm].drop_duplicates(keys).set_index(keys)["completion"]
    assert len(steered) > 0 and set(steered.index) == set(base.index)
    assert (steered != base.loc[steered.index]).any(), f"{arm} left every completion as the baseline's"
    table = pd.read_csv(folder / "results_table.csv")
    ids = dict(zip(table["arm"], table["config_id"], strict=False))
    assert set(ids) == {"baseline", arm} and ids["baseline"] == "baseline" and len(ids[arm]) == 12
    assert table.loc[table["arm"] == arm, "changed"].max() > 0
    assert " baseline " in out and f" {arm} " in out
    return ids[arm]


@pytest.mark.slow
def test_directional_ablation_sweep_on_smollm2_changes_completions(run_main, tmp_path):
    code, out, err = run_main("--multirun", "model=smollm2", "arm=baseline,directional_ablation", *SMALL)
    assert code == 0, err[-3000:]
    sweep = sweep_dir(tmp_path)
    config_id = _check(sweep / "aggregate", "directional_ablation", out)
    assert {(r["arm"], r["config_id"]) for r in job_records(sweep)} == {
        ("baseline", "baseline"),
        ("directional_ablation", config_id),
    }


@pytest.mark.slow
def test_contrastive_decoding_sweep_on_tiny_changes_completions(run_main, tmp_path):
    arm_dir = tmp_path / "user_conf" / "arm"  # the control ships no arm: a user's, from the search path
    arm_dir.mkdir(parents=True)
    (arm_dir / "contrastive.yaml").write_text(
        "# @package arm\ndefaults:\n  - /control@controls.cd: contrastive_decoding\n\nname: contrastive\n"
        f"controls:\n  cd:\n    amateur: '{AMATEUR}'\n"
    )
    search = f"hydra.searchpath=[file://{tmp_path / 'user_conf'}]"
    code, out, err = run_main("--multirun", "model=tiny", search, "arm=baseline,contrastive", *SMALL)
    assert code == 0, err[-3000:]
    sweep = sweep_dir(tmp_path)
    config_id = _check(sweep / "aggregate", "contrastive", out)
    assert {(r["arm"], r["config_id"]) for r in job_records(sweep)} == {
        ("baseline", "baseline"),
        ("contrastive", config_id),
    }
