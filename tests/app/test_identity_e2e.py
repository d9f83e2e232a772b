"""Configuration identity end to end: three `pasta` configurations in one save_dir stay apart in every output."""

from __future__ import annotations

import csv
import json

import pytest
from app_helpers import FAST, read_run

from steer_hydra.analysis import compare as results_module
from steer_hydra.app import job as job_module
from steer_hydra.app.callbacks import aggregate_sweep
from steer_hydra.app.plan import JobPlan
from steer_hydra.app.records import JobRecord

PASTAS = [
    ["arm=pasta"],
    ["arm=pasta", "arm.controls.pasta.alpha=0.05"],
    ["arm=pasta", "+control@arm.controls.sys=system_prompt"],
]


def test_display_names_and_baseline_ids(compose_cfg):
    plans = [JobPlan.from_config(compose_cfg(o)) for o in PASTAS]
    assert len({p.config_id for p in plans}) == 3
    assert plans[0].arm == "pasta"
    assert [p.arm for p in plans[1:]] == [f"pasta@{p.config_id}" for p in plans[1:]]
    assert all(p.arm_name == "pasta" and p.baseline_config_id == "baseline" for p in plans)
    base = JobPlan.from_config(compose_cfg(["arm=baseline"]))
    assert (base.arm, base.config_id) == ("baseline", "baseline")
    other = JobPlan.from_config(compose_cfg(["arm=pasta", "baseline_arm=system_prompt"]))
    assert other.baseline_config_id == JobPlan.from_config(compose_cfg(["arm=system_prompt"])).config_id


def test_an_arms_default_is_composed_once_a_process_and_reads_its_concept_as_it_is_now(compose_cfg, tmp_path):
    from steer_hydra.app import plan as plan_module

    concept = tmp_path / "calm.yaml"
    base = (plan_module.Path(plan_module.__file__).parents[1] / "tasks" / "concept_data" / "joy.yaml").read_text()
    concept.write_text(base.replace("name: joy", "name: calm"))
    compose_cfg(["arm=caa_concept", f"concept={concept}"])  # inside an initialized app, as a job is
    plan_module._composed_arm.cache_clear()
    choices = {"model": "tiny", "concept": str(concept)}
    first = plan_module.arm_default_config_id("caa_concept", choices)
    again = plan_module.arm_default_config_id("caa_concept", choices)
    assert first == again is not None and plan_module._composed_arm.cache_info().misses == 1
    concept.write_text(base.replace("name: joy", "name: calm").replace("wonderful!", "splendid!"))
    edited = plan_module.arm_default_config_id("caa_concept", choices)  # its pairs changed: another configuration
    assert edited != first and plan_module._composed_arm.cache_info().misses == 1
    plan_module.arm_default_config_id("caa_concept", {**choices, "model": "smollm2"})  # another model: composed
    assert plan_module._composed_arm.cache_info().misses == 2


def _rows(path):
    return list(csv.DictReader(path.open())) if path.exists() else []


@pytest.mark.slow
def test_three_pasta_configurations_in_one_save_dir_keep_their_own_results(compose_cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    plotted = {}
    real_plot = results_module.plot_comparison

    def spy(results, deltas, out_dir, **kwargs):
        plotted[out_dir.name] = (set(results["config_id"]), set(deltas["config_id"]) if len(deltas) else set())
        return real_plot(results, deltas, out_dir, **kwargs)

    monkeypatch.setattr(results_module, "plot_comparison", spy)
    common = [*FAST, f"output_root={tmp_path}", "logger.log_artifact=false"]
    job_module.run_job(compose_cfg([*common, "arm=baseline"]), tmp_path / "job_base")
    records = []
    for i, overrides in enumerate(PASTAS):
        out = tmp_path / f"job{i}"
        job_module.run_job(compose_cfg([*common, *overrides]), out)
        records.append(json.loads((out / "job_record.json").read_text()))
    ids = [r["config_id"] for r in records]
    assert len(set(ids)) == 3 and [r["arm"] for r in records] == ["pasta", f"pasta@{ids[1]}", f"pasta@{ids[2]}"]
    for i, record in enumerate(records):
        out = tmp_path / f"job{i}"
        deltas = _rows(out / "paired_deltas.csv")
        assert deltas and {(r["arm"], r["config_id"]) for r in deltas} == {(record["arm"], record["config_id"])}
        assert {r["seeds"] for r in deltas} == {"0"}
        results = _rows(out / "results.csv")
        assert {r["config_id"] for r in results} == {record["config_id"]} and {r["arm"] for r in results} == {
            record["arm"]
        }
        assert {"arm", "config_id", "trial_id", "seed", "trial_seed"} <= set(results[0])
        samples = _rows(out / "samples.csv")
        assert samples and {r["config_id"] for r in samples} == {record["config_id"]}
        assert plotted[out.name] == ({record["config_id"], "baseline"}, {record["config_id"]})
        (run_dir,) = (out / "wandb").glob("offline-run-*")
        _, summary = read_run(next(run_dir.glob("run-*.wandb")))
        logged = {k: v for k, v in summary.items() if k.startswith("delta/")}
        assert logged == {
            "/".join(["delta", r["suite"], r["task"].replace("/", "."), r["metric"], "accuracy"]): float(r["delta"])
            for r in deltas
        }
        assert summary["config_id"] == record["config_id"] and summary["arm"] == record["arm"]
    configs = {p.stem for p in (tmp_path / "default" / "tiny" / "seed_0" / "configs").glob("*.json")}
    assert configs == {*ids, "baseline"}

    # a sweep's aggregate holds the sweep's configurations (+ the baseline), not the others in the save_dir
    base_record = JobRecord.read(tmp_path / "job_base")
    typed = [JobRecord.from_dict(record) for record in records]
    only_baseline = aggregate_sweep([base_record], tmp_path / "agg_base")
    assert only_baseline["comparison"].deltas.empty
    one = aggregate_sweep([base_record, typed[1]], tmp_path / "agg_one")
    assert set(one["comparison"].deltas["config_id"]) == {ids[1]} and set(one["comparison"].deltas["arm"]) == {
        records[1]["arm"]
    }
    assert set(one["summary"]["config_id"]) == {"baseline", ids[1]}
    without_base = aggregate_sweep([typed[2]], tmp_path / "agg_two")  # baseline from the same save_dir
    assert set(without_base["comparison"].deltas["config_id"]) == {ids[2]}
