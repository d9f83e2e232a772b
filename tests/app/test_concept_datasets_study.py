"""The quick study end to end on the tiny model over published-dataset concepts: one AxBench Concept500 concept and
one SteerEval concept (tiny fixtures in their layouts), each evaluated on its dataset's own dev and test
instructions, with the left-out row named before any job launched."""

from __future__ import annotations

import pandas as pd
import pytest
from app_helpers import FAST

from steer_hydra.tasks.concepts import load_concept
from steer_hydra.testing.concept_datasets import write_axbench, write_steereval


@pytest.mark.slow
def test_the_quick_study_runs_an_axbench_and_a_steereval_concept_on_their_own_instructions(run_app, tmp_path):
    write_axbench(tmp_path / "concept500" / "2b" / "l10")
    write_steereval(tmp_path / "SteerEval")
    axbench, steereval = f"axbench:{tmp_path}/concept500/2b/l10", f"steereval:{tmp_path}/SteerEval"
    proc = run_app(
        "--multirun",
        "experiment=concept_steering_quick",
        f"concepts=[{axbench}@3,{steereval}]",
        "concepts_limit=2",  # the first SteerEval concept only
        "arm=baseline,caa_concept",
        "strength=0.5",
        "hydra.sweeper.cost_suites=[]",
        "logger=none",
        *FAST,
        timeout=900,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "left out 1 unusable" in output and "train.json[1] (key 'not_matching')" in output  # named, then skipped

    concepts = [load_concept(f"{axbench}@3"), load_concept(f"{steereval}@sentiment/0")]
    (sweep,) = (tmp_path / "outputs" / "concept_steering_quick" / "multiruns").iterdir()
    launched = pd.read_csv(sweep / "study" / "launched.csv")
    assert launched["stage"].tolist() == ["dev"] * 4 + ["test"] * 4
    expected_suites = {f"concept_steering_{split}_{c.name}" for c in concepts for split in ("dev", "test")}
    assert set(launched["suite"]) == expected_suites

    # every generation answered one of the concept's own instructions, with its sample id, in its split
    samples = pd.read_csv(sweep / "aggregate" / "samples.csv").drop_duplicates(["arm", "suite", "sample_id"])
    assert set(samples["arm"].str.split("@").str[0]) == {"baseline", "caa_concept"}
    for concept in concepts:
        for split in ("dev", "test"):
            asked = samples[samples["suite"] == f"concept_steering_{split}_{concept.name}"]
            own = {item.id: item.text for item in concept.instructions if item.split == split}
            assert len(asked) == 2 * min(2, len(own))  # two arms, suite.limit=2
            assert all(own[row.sample_id] == row.input for row in asked.itertuples())

    selection = pd.read_csv(sweep / "study" / "selection.csv")
    assert selection.loc[selection["arm_name"] == "caa_concept", "chosen"].tolist() == [True, True]
    summary = pd.read_csv(sweep / "study" / "study_summary.csv")
    assert (summary.loc[summary["arm_name"] == "caa_concept", "n_concepts"] == 2).all()
